"""The harness recipes of docs/harnesses.md, run as written against the demo stack.

Each recipe is extracted from the doc (the fenced block after its `<!-- recipe: NAME -->` marker) and
run in a fresh Python process, with only the base URL and the task replaced: the task carries the
mock model's directives, so tool loops really loop. Then the capture must hold exactly one new
session per sample or run, each with every call of that conversation, and each session's rollout
must be whole (not partial, `mask_sample: false`).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.stack import Stack, token_breaks

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "harnesses.md"
DOC_URL = "http://127.0.0.1:8080"
_RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_TASK_LINE = re.compile(r'^TASK = ".*"$', re.MULTILINE)


def recipes() -> dict[str, str]:
    return dict(_RECIPE.findall(DOC.read_text()))


def needs(*modules: str):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {missing} (pip install 'switchyard-model[harnesses]')")


def session_ids(chain: Stack) -> set[str]:
    reply = httpx.get(chain.v1 + "/sessions", params={"limit": "10000"}, timeout=30)
    return {s["session_id"] for s in reply.json()["sessions"]}


def run_recipe(chain: Stack, name: str, task: str, tmp_path: Path, *, edit=None) -> tuple[set[str], str]:
    """Run the doc's recipe with the chain's URL and `task`; returns the sessions it created and its last line."""
    source = recipes()[name]
    assert DOC_URL in source and _TASK_LINE.search(source), f"recipe {name} has no base URL or TASK line"
    source = source.replace(DOC_URL, chain.url)
    source = _TASK_LINE.sub(lambda _: f"TASK = {task!r}", source, count=1)
    if edit is not None:
        source = edit(source)
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    before = session_ids(chain)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "HF_HUB_OFFLINE": "1",  # nothing may reach for a hub: the recipes must work offline
        },
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # Each recipe ends by printing its session (or run) id first; harnesses print banners before.
    return session_ids(chain) - before, done.stdout.strip().splitlines()[-1]


def assert_whole_rollout(chain: Stack, session_id: str, calls: int) -> dict:
    records = chain.records(session_id)
    assert len(records) == calls, [r["messages"][-1] for r in records]
    assert all(r["is_valid"] for r in records), [r.get("invalid_reason") for r in records]
    reply = httpx.get(f"{chain.v1}/sessions/{session_id}/rollout", timeout=30)
    assert reply.status_code == 200, reply.text
    rollout = reply.json()
    assert rollout.get("partial_reason") is None and rollout["mask_sample"] is False, rollout.get("partial_reason")
    return rollout


WEATHER_TASK = 'What is the weather in Paris? [[mock:tool get_weather {"city": "Paris"}]]'


@needs("openai")
def test_openai_sdk_recipe(chain, tmp_path):
    new, out = run_recipe(chain, "openai-sdk", "Say hello.", tmp_path)
    assert len(new) == 1
    (session,) = new
    assert out.startswith(session)
    assert_whole_rollout(chain, session, calls=2)


@needs("anthropic")
def test_anthropic_sdk_recipe(chain, tmp_path):
    new, out = run_recipe(chain, "anthropic-sdk", "Say hello.", tmp_path)
    assert len(new) == 1
    (session,) = new
    assert out.startswith(session)
    rollout = assert_whole_rollout(chain, session, calls=2)
    assert all(r["api"] == "messages" for r in chain.records(session))
    assert rollout["record_uuids"]


@needs("agents")
def test_openai_agents_recipe(chain, tmp_path):
    new, out = run_recipe(chain, "openai-agents", WEATHER_TASK, tmp_path)
    assert len(new) == 1
    (session,) = new
    assert "sunny, 21 C in Paris" in out  # the tool ran and the model saw its result
    assert_whole_rollout(chain, session, calls=2)


@needs("langchain_openai")
def test_langchain_recipe(chain, tmp_path):
    new, out = run_recipe(chain, "langchain", WEATHER_TASK, tmp_path)
    assert len(new) == 1
    (session,) = new
    assert "sunny, 21 C in Paris" in out
    assert_whole_rollout(chain, session, calls=2)


ADD_TASK = 'What is 2 + 3? [[mock:tool add {"x": 2, "y": 3}]]'


@needs("inspect_ai")
def test_inspect_ai_recipe_gives_each_sample_its_own_whole_session(chain, tmp_path):
    new, out = run_recipe(chain, "inspect-ai", ADD_TASK, tmp_path)
    run = out.split()[0]
    # Inspect checks the model first with a call of its own, sent with no session id: it is recorded
    # in a session inferred for it (docs/capture.md#calls-without-a-session-id), apart from the samples.
    (probe,) = {session for session in new if session.startswith("inferred-")}
    assert "hello, world" in chain.records(probe)[0]["messages"][0]["content"]
    samples = new - {probe}
    assert samples == {f"{run}-s1-e1", f"{run}-s2-e1"}
    for session in samples:
        records = chain.records(session)
        assert records[-1]["messages"][-1]["content"].startswith("Done. The tool said: 5")
        assert_whole_rollout(chain, session, calls=2)


@needs("inspect_ai")
def test_inspect_ai_with_a_run_wide_header_is_one_broken_session(chain, tmp_path):
    """The negative control: the run-wide header the doc warns about puts both samples in one session."""

    def run_wide(source: str) -> str:
        source = source.replace(
            'return await generate(state, extra_headers={"x-session-id": session})', "return await generate(state)"
        )
        return source.replace(
            'model="openai/demo",', 'model="openai/demo", model_args={"default_headers": {"x-session-id": RUN}},'
        )

    new, out = run_recipe(chain, "inspect-ai", ADD_TASK, tmp_path, edit=run_wide)
    run = out.split()[0]
    assert new == {run}
    calls = chain.records(run)
    assert len(calls) >= 4  # both samples' tool loops
    rollout = httpx.get(f"{chain.v1}/sessions/{run}/rollout", timeout=30).json()
    # One rollout for two samples: the other sample's calls are set aside (as retries or side calls),
    # so a trainer would get one sample where the eval ran two.
    assert len(rollout["record_uuids"]) == 2 < len(calls)
    assert rollout["discarded_record_uuids"] or rollout["side_calls"]


MINI_TASK = (
    'Print the working directory, then submit. [[mock:tool bash {"command": "pwd"}]] [[mock:next]] '
    '[[mock:tool bash {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]]'
)


@needs("minisweagent", "litellm")
def test_mini_swe_agent_recipe_is_one_whole_session_per_run(chain, tmp_path):
    new, out = run_recipe(chain, "mini-swe-agent", MINI_TASK, tmp_path)
    assert len(new) == 1
    (session,) = new
    assert out.split() == [session, "Submitted"]
    records = chain.records(session)
    # The first command really ran: its output is in the second call's prompt.
    assert str(tmp_path) in str(records[1]["messages"])
    assert_whole_rollout(chain, session, calls=2)


# ---- a reasoning model: the recipes unchanged, with and without token injection -------------------


REASONING_WEATHER_TASK = 'What is the weather in Paris? [[mock:reasoning]] [[mock:tool get_weather {"city": "Paris"}]]'


@pytest.mark.parametrize(
    "recipe",
    [pytest.param("openai-agents", marks=needs("agents")), pytest.param("langchain", marks=needs("langchain_openai"))],
)
@pytest.mark.parametrize("injection", [True, False], ids=["injected", "plain"])
def test_a_recipe_on_a_reasoning_model_is_one_token_chain_with_injection(reasoning_chains, tmp_path, recipe, injection):
    """The harness unchanged: with injection its calls reach the engine as one token chain and its rollout
    is whole; without it (the negative control) the engine's second prompt drops the first reasoning."""
    chain = reasoning_chains[injection]
    httpx.post(chain.upstream_url + "/mock/reset")
    new, out = run_recipe(chain, recipe, REASONING_WEATHER_TASK, tmp_path)
    (session,) = new
    assert "sunny, 21 C in Paris" in out
    assert token_breaks(chain.engine_calls()) == ([] if injection else [1])
    records = chain.records(session)
    reasons = [r["injection"]["fallback_reason"] if r.get("injection") else None for r in records]
    if injection:
        assert reasons == ["first_call", None]
        assert_whole_rollout(chain, session, calls=2)
    else:
        assert reasons == [None, None]
        rollout = httpx.get(f"{chain.v1}/sessions/{session}/rollout", timeout=30).json()
        assert rollout["mask_sample"] is True and "do not extend" in rollout["partial_reason"]


WEATHER_CITY_TASK = 'What is the weather in Paris? [[mock:tool weather {"city": "Paris"}]]'


def chains_of(chain: Stack, session_id: str) -> dict:
    reply = httpx.get(f"{chain.v1}/sessions/{session_id}/chains", timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


@needs("pydantic_ai")
def test_pydantic_ai_recipes_give_whole_rollouts_on_chat_and_responses(chain, tmp_path):
    new, _ = run_recipe(chain, "pydantic-ai", WEATHER_CITY_TASK, tmp_path)
    assert {session.rsplit("-", 1)[0] for session in new} == {"pydantic-ai-chat", "pydantic-ai-responses"}
    for session in new:
        assert_whole_rollout(chain, session, calls=2)
        assert len(chains_of(chain, session)["chains"]) == 1


@needs("smolagents")
def test_smolagents_recipe_yields_chains_that_keep_every_token(chain, tmp_path):
    new, out = run_recipe(chain, "smolagents-tool-calling", WEATHER_CITY_TASK, tmp_path)
    (session,) = new
    assert out.startswith(session)
    body = chains_of(chain, session)
    records = chain.records(session)
    assert sorted(u for c in body["chains"] for u in c["record_uuids"]) == sorted(r["uuid"] for r in records)
    assert len(body["chains"]) > 1 and body["trainable_fraction"] == 1.0
    rollout = httpx.get(f"{chain.v1}/sessions/{session}/rollout", timeout=30).json()
    assert rollout["mask_sample"] is True
    assert "the client re-sent a tool call as text" in rollout["partial_reason"]
