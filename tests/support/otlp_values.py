"""OTLP attribute values as plain Python values (JSON-ready), for both loopback OTLP receivers.

Imports only `opentelemetry-proto`, so the gRPC receiver can use it from the Gym launcher's venv too.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as the plain value it carries (bytes as hex, so it stays JSON)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(key_values) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}
