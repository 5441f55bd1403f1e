"""The real loopback chain for integration tests: mock upstream → hosted Switchyard → this server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.procs import Proc, start_server


@dataclass
class Chain:
    url: str  # this server's root
    proc: Proc
    capture_dir: Path
    upstream_url: str  # the mock upstream's root

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def mock_requests(self) -> list[dict]:
        return httpx.get(self.upstream_url + "/mock/requests", trust_env=False).json()["requests"]

    def mock_stats(self) -> dict:
        return httpx.get(self.upstream_url + "/mock/stats", trust_env=False).json()


def launch_chain(upstream_url: str, capture_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Chain:
    """`switchyard-model serve` on the demo deployment, its route pointed at the mock upstream."""
    proc, url = start_server(
        "--deployment",
        "demo",
        "--capture-dir",
        str(capture_dir),
        *extra,
        env={"MOCK_UPSTREAM_URL": upstream_url + "/v1", **(env or {})},
    )
    return Chain(url, proc, capture_dir, upstream_url)
