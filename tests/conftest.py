"""Shared fixtures: a proxy-free environment for every test, and the real loopback stack (mock upstream →
hosted Switchyard → this server)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.support.deployments import ALL_PROFILE_VARS
from tests.support.procs import PROXY_VARIABLES, start_mock_upstream
from tests.support.stack import launch_stack

# In CI every property and fuzz test runs a fixed set of examples, so a run is reproducible; locally
# they explore afresh each time (and SWITCHYARD_FUZZ_SCALE widens the fuzzers). Neither has a
# per-example deadline: on a shared machine one slow example says nothing about the property.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")


@pytest.fixture(scope="session", autouse=True)
def no_proxy_environment():
    """No proxy variable for the whole run, whatever the shell running the tests has: every request a
    test makes goes to 127.0.0.1, so httpx clients need no `trust_env=False`, and every child process
    inherits the clean environment. Session-wide, so it is in place before any module or session fixture
    starts a process or makes a request."""
    with pytest.MonkeyPatch.context() as patch:
        for name in PROXY_VARIABLES:
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="session")
def mock_upstream():
    proc, url = start_mock_upstream()
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def chain(mock_upstream, tmp_path_factory):
    stack = launch_stack(mock_upstream, tmp_path_factory.mktemp("captures"))
    yield stack
    stack.proc.stop()


@pytest.fixture
def clean_env(monkeypatch):
    """No deployment-profile variable set, whatever the shell running the tests has."""
    for name in ALL_PROFILE_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch
