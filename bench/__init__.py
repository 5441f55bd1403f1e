"""Benchmark harness: the whole stack measured side by side (direct to Switchyard vs through this server)."""
