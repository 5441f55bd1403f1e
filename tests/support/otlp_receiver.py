"""A loopback OTLP/HTTP (protobuf) receiver for tests: collects exported spans and metrics, decoded."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.support.otlp_values import attributes
from tests.support.procs import wait_for

_KINDS = {
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}
_STATUS = {Status.STATUS_CODE_UNSET: "UNSET", Status.STATUS_CODE_OK: "OK", Status.STATUS_CODE_ERROR: "ERROR"}


@dataclass
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    attributes: dict[str, Any]
    status: str  # UNSET, OK, ERROR
    service_name: str | None
    resource: dict[str, Any]
    events: list[str] = field(default_factory=list)


@dataclass
class ReceivedMetric:
    name: str
    unit: str
    service_name: str | None
    kind: str  # sum, gauge, histogram, exponential_histogram, summary
    points: list[dict[str, Any]]  # attributes plus the point's values


@dataclass
class ReceivedRequest:
    path: str
    content_type: str
    user_agent: str
    size: int


class OtlpReceiver:
    """An OTLP/HTTP collector stand-in on 127.0.0.1: POST /v1/traces and /v1/metrics, protobuf only.

    `status` makes it answer every export with that HTTP status instead (a failing collector).
    """

    def __init__(self, port: int = 0, *, traces_only: bool = False) -> None:
        self.status = 200
        self.traces_only = traces_only  # answer /v1/metrics with 405, as Phoenix and Langfuse do
        self.requests: list[ReceivedRequest] = []
        self._spans: list[ReceivedSpan] = []
        self._metrics: list[ReceivedMetric] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """The base URL for OTEL_EXPORTER_OTLP_ENDPOINT."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def metrics(self, name: str | None = None) -> list[ReceivedMetric]:
        with self._lock:
            return [m for m in self._metrics if name is None or m.name == name]

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Poll until predicate() is truthy; returns its value, or raises TimeoutError."""
        value = wait_for(predicate, timeout, interval=0.02)
        if not value:
            raise TimeoutError("the OTLP receiver did not get what was expected in time")
        return value

    # ---- decoding ------------------------------------------------------------------------------
    def _accept_traces(self, body: bytes) -> bytes:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=_KINDS.get(span.kind, "UNSPECIFIED"),
                            attributes=attributes(span.attributes),
                            status=_STATUS.get(span.status.code, "UNSET"),
                            service_name=resource.get("service.name"),
                            resource=resource,
                            events=[event.name for event in span.events],
                        )
                    )
        with self._lock:
            self._spans.extend(found)
        return ExportTraceServiceResponse().SerializeToString()

    def _accept_metrics(self, body: bytes) -> bytes:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_metrics in request.resource_metrics:
            service = attributes(resource_metrics.resource.attributes).get("service.name")
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data") or "unknown"
                    points = []
                    for point in getattr(metric, kind).data_points if kind != "unknown" else ():
                        entry: dict[str, Any] = {"attributes": attributes(point.attributes)}
                        if kind == "histogram":
                            entry.update(
                                count=point.count,
                                sum=point.sum,
                                bucket_counts=list(point.bucket_counts),
                                explicit_bounds=list(point.explicit_bounds),
                            )
                        elif kind in ("sum", "gauge"):
                            entry["value"] = getattr(point, point.WhichOneof("value") or "as_double")
                        points.append(entry)
                    found.append(ReceivedMetric(metric.name, metric.unit, service, kind, points))
        with self._lock:
            self._metrics.extend(found)
        return ExportMetricsServiceResponse().SerializeToString()

    def _handler_class(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                encoding = (self.headers.get("content-encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                with receiver._lock:
                    receiver.requests.append(
                        ReceivedRequest(
                            self.path, self.headers.get("content-type", ""), self.headers.get("user-agent", ""), length
                        )
                    )
                if receiver.status != 200:
                    self._reply(receiver.status, b"")
                    return
                if self.path == "/v1/traces":
                    self._reply(200, receiver._accept_traces(body))
                elif self.path == "/v1/metrics" and receiver.traces_only:
                    self._reply(405, b"")
                elif self.path == "/v1/metrics":
                    self._reply(200, receiver._accept_metrics(body))
                elif self.path == "/v1/logs":
                    self._reply(200, b"")
                else:
                    self._reply(404, b"")

            def _reply(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args) -> None:  # keep test output quiet
                pass

        return Handler
