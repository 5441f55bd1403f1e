"""Shared fixtures: the real loopback chain (mock upstream → hosted Switchyard → this server)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import os

import httpx
import pytest
from hypothesis import settings

# In CI every property and fuzz test runs a fixed set of examples, so a run is reproducible; locally
# they explore afresh each time (and SWITCHYARD_FUZZ_SCALE widens the fuzzers).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

from tests.procs import Proc, start_mock_upstream, start_server


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


@pytest.fixture(scope="session")
def mock_upstream():
    proc, url = start_mock_upstream()
    yield url
    proc.stop()


def launch_chain(upstream_url: str, capture_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Chain:
    proc, url = start_server("--deployment", "demo", "--capture-dir", str(capture_dir), *extra,
                             env={"MOCK_UPSTREAM_URL": upstream_url + "/v1", **(env or {})})
    return Chain(url, proc, capture_dir, upstream_url)


@pytest.fixture(scope="module")
def chain(mock_upstream, tmp_path_factory):
    chain = launch_chain(mock_upstream, tmp_path_factory.mktemp("captures"))
    yield chain
    chain.proc.stop()
