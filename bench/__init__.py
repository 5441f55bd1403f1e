"""Benchmark harness: the whole chain measured side by side (direct to Switchyard vs through this server)."""
