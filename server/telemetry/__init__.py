"""OpenTelemetry and Prometheus for model calls: spans, metrics, sampling and export.

Its public surface is its modules (`__all__`): `spans` imports `otel_metrics` through this package,
so re-exporting `spans`' names here would be an import cycle.
"""

__all__ = ["otlp_export", "prometheus", "service", "spans"]
