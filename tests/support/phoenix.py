"""Arize Phoenix from `make phoenix`'s venv, offline on loopback ports, and reads of its GraphQL API."""

from __future__ import annotations

import ipaddress
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import REPO, Proc, free_port, scratch_dir

PHOENIX_PYTHON = REPO / ".venv-phoenix" / "bin" / "python"

# Phoenix's gRPC collector binds every interface ("[::]") and has no setting for that: this
# launcher, run by Phoenix's own interpreter, narrows it to loopback before Phoenix starts.
_LAUNCH = r"""
import sys
import grpc.aio

_make_server = grpc.aio.server

def _loopback_server(*args, **kwargs):
    server = _make_server(*args, **kwargs)
    add_port = server.add_insecure_port
    server.add_insecure_port = lambda address: add_port(address.replace("[::]", "127.0.0.1"))
    return server

grpc.aio.server = _loopback_server
from phoenix.server.main import main
sys.argv = ["phoenix", "serve"]
main()
"""


@dataclass
class Phoenix:
    proc: Proc
    url: str  # its root: UI, GraphQL at /graphql, OTLP/HTTP traces at /v1/traces
    grpc_port: int
    started_in_s: float

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        reply = httpx.post(self.url + "/graphql", json={"query": query, "variables": variables}, timeout=30)
        reply.raise_for_status()
        body = reply.json()
        assert not body.get("errors"), body["errors"]
        return body["data"]


def start_phoenix(timeout_s: float = 240.0) -> Phoenix:
    """Phoenix on free loopback ports, with a fresh SQLite working folder; stop it with `.proc.stop()`."""
    port, grpc_port = free_port(), free_port()
    env = {
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": tempfile.mkdtemp(prefix="phoenix-", dir=scratch_dir()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        "PHOENIX_AGENTS_DISABLE_BASH": "true",
        # Phoenix's own exporter (for tracing itself) must not pick up a test's OTLP settings.
        "OTEL_SDK_DISABLED": "true",
    }
    started = time.monotonic()
    proc = Proc([str(PHOENIX_PYTHON), "-c", _LAUNCH], env=env, cwd=Path(env["PHOENIX_WORKING_DIR"]))
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/healthz", timeout=timeout_s)
    except BaseException:
        proc.stop()
        raise
    return Phoenix(proc, url, grpc_port, time.monotonic() - started)


def listening_addresses(port: int) -> set[str]:
    """The local addresses a TCP port is listening on, from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            hex_address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                # The kernel prints each 32-bit word of the address in host (little-endian) order.
                raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
                address = ipaddress.ip_address(raw)
                mapped = getattr(address, "ipv4_mapped", None)
                found.add(str(mapped or address))
    return found
