"""Shared fixtures: the real loopback chain (mock upstream → hosted Switchyard → this server)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.support.chain import launch_chain
from tests.support.deployments import ALL_PROFILE_VARS
from tests.support.procs import start_mock_upstream

# In CI every property and fuzz test runs a fixed set of examples, so a run is reproducible; locally
# they explore afresh each time (and SWITCHYARD_FUZZ_SCALE widens the fuzzers). Neither has a
# per-example deadline: on a shared machine one slow example says nothing about the property.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")


@pytest.fixture(scope="session")
def mock_upstream():
    proc, url = start_mock_upstream()
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def reasoning_chains(tmp_path_factory):
    """A Qwen3-like engine (past reasoning dropped from re-rendered turns), and a chain in front of it
    with token injection (`chains[True]`) and one without (`chains[False]`, the negative control)."""
    upstream, url = start_mock_upstream(None, "--template", "drop-reasoning")
    chains = {}
    try:
        chains[True] = launch_chain(url, tmp_path_factory.mktemp("injected"), "--token-injection")
        chains[False] = launch_chain(url, tmp_path_factory.mktemp("plain"))
        yield chains
    finally:
        for chain in chains.values():
            chain.proc.stop()
        upstream.stop()


@pytest.fixture(scope="module")
def chain(mock_upstream, tmp_path_factory):
    chain = launch_chain(mock_upstream, tmp_path_factory.mktemp("captures"))
    yield chain
    chain.proc.stop()


@pytest.fixture
def clean_env(monkeypatch):
    """No deployment-profile variable set, whatever the shell running the tests has."""
    for name in ALL_PROFILE_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch
