"""The telemetry modules depend one way: the service on the span classes and /metrics, never back."""

from __future__ import annotations

import ast
from types import SimpleNamespace

from tests.support.procs import REPO

TELEMETRY = REPO / "server" / "telemetry"


def _imported_modules(name: str) -> set[str]:
    """Every module `server/telemetry/<name>.py` imports, annotations-only imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((TELEMETRY / f"{name}.py").read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_neither_the_span_classes_nor_metrics_import_the_service():
    for name in ("spans", "prometheus", "metrics", "attributes"):
        assert "server.telemetry.service" not in _imported_modules(name), f"{name}.py imports the service"
    assert "server.telemetry.spans" not in _imported_modules("prometheus"), "/metrics and the spans import each other"


def test_the_service_does_import_both():
    # Negative control for the test above: the import reader does see the imports that exist.
    imported = _imported_modules("service")
    assert {"server.telemetry.spans", "server.telemetry.prometheus"} <= imported


def test_metrics_route_serves_any_prometheus_text_source():
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from server.telemetry import prometheus

    class Source:
        def prometheus_text(self) -> str:
            return "# TYPE up gauge\nup 1\n"

    app = Starlette(routes=prometheus.routes)
    app.state.switchyard = SimpleNamespace(telemetry=Source())
    with TestClient(app) as client:
        assert client.get("/metrics").text == "# TYPE up gauge\nup 1\n"
