"""What every integration test shares: the `integration` marker, and the fixtures more than one module uses."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.support.procs import start_mock_upstream
from tests.support.stack import launch_stack

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder starts real processes, so each is marked `integration` here, before
    `-m "not integration"` (make test-fast) deselects by marker. A conftest's collection hook sees the
    whole session's items, hence the check on the path."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def sdk(chain) -> openai.OpenAI:
    """The OpenAI SDK against the module's stack, without retries (a retry would hide a failed call)."""
    return openai.OpenAI(base_url=chain.v1, api_key="sk-test", max_retries=0, http_client=httpx.Client(timeout=60))


@pytest.fixture(scope="module")
def reasoning_chains(tmp_path_factory):
    """A Qwen3-like engine (past reasoning dropped from re-rendered turns), and a stack in front of it
    with token injection (`[True]`) and one without (`[False]`, the negative control)."""
    upstream, url = start_mock_upstream(None, "--template", "drop-reasoning")
    stacks = {}
    try:
        stacks[True] = launch_stack(url, tmp_path_factory.mktemp("injected"), "--token-injection")
        stacks[False] = launch_stack(url, tmp_path_factory.mktemp("plain"))
        yield stacks
    finally:
        for stack in stacks.values():
            stack.proc.stop()
        upstream.stop()
