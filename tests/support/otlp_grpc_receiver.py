"""A loopback OTLP/gRPC receiver, run as a script: every exported span becomes one JSON line in a file.

NeMo Gym's telemetry (nemo-lens) exports over OTLP gRPC by default. This stands in for the collector
in tests/integration/test_gym_launcher.py. It runs under any Python that has `grpcio` and
`opentelemetry-proto` (the Gym launcher venv has both), so the test venv needs neither:

    python tests/support/otlp_grpc_receiver.py --out spans.jsonl --port-file port

It writes the bound port to `--port-file` once it serves, and stops on SIGTERM. Metrics and logs are
accepted and dropped.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's `tests` package
from tests.support.otlp_values import attributes  # noqa: E402

_KINDS = {
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out: Path) -> None:
        self._out = out.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (gRPC's naming)
        lines = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(
                        json.dumps(
                            {
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "name": span.name,
                                "kind": _KINDS.get(span.kind, "UNSPECIFIED"),
                                "attributes": attributes(span.attributes),
                                "service_name": resource.get("service.name"),
                                "resource": resource,
                            }
                        )
                    )
        with self._lock:
            self._out.write("".join(line + "\n" for line in lines))
            self._out.flush()
        return trace_service_pb2.ExportTraceServiceResponse()


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):  # noqa: N802
        return metrics_service_pb2.ExportMetricsServiceResponse()


class Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def Export(self, request, context):  # noqa: N802
        return logs_service_pb2.ExportLogsServiceResponse()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(args.out), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    partial = args.port_file.with_suffix(".partial")
    partial.write_text(str(port))
    partial.rename(args.port_file)  # the port appears whole, once it serves
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
