"""The injector over a toy reasoning engine: contiguity, fallbacks, side calls, forks, rebuilds, clamping.

Every contiguity test has its negative control: the same session plain (or with an engine that
ignores the field) breaks, so the check cannot pass by accident.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.injection import injector as inj
from server.injection.breaker import RouteBreaker
from server.injection.histories import HistoryCache, prefix_hash
from server.injection.id_fields import ENGINES, id_field_for
from server.injection.injector import Injector
from server.injection.tokenize import Render
from tests.support.toy_engine import ToyEngine, ToyTokenizer, assistant_turn, engine_for, extends

SYSTEM = {"role": "system", "content": "you are terse"}


def make(engine: ToyEngine, transport: str = "vllm", records: list | None = None, **kw: Any) -> Injector:
    tokenizer = ToyTokenizer(engine)
    injector = Injector(
        id_field=id_field_for(transport),
        tokenizer_for=lambda route: tokenizer,
        read_records=(lambda session: list(records)) if records is not None else None,
        **kw,
    )
    injector.toy_tokenizer = tokenizer  # type: ignore[attr-defined]
    return injector


def call(injector: Injector, engine: ToyEngine, messages: list, reply: dict, session: str = "s", **body: Any):
    async def go():
        plan = await injector.prepare(session, "r", {"model": "r", "messages": messages, **body})
        try:
            chat = engine.chat(plan.body, reply)
        except ValueError:
            chat = engine.chat(injector.reissue(plan), reply)
        return plan, chat, injector.finish(plan, chat)

    return asyncio.run(go())


def agent_session(injector: Injector, engine: ToyEngine) -> list[tuple[Any, dict, dict]]:
    """Reasoning + two tool calls + a final answer, as a client that drops reasoning sends it."""
    messages: list[dict] = [SYSTEM, {"role": "user", "content": "find the file"}]
    out = []
    for reply in (
        {"reasoning": "look first", "tools": ["ls"]},
        {"reasoning": "now read", "tools": ["cat"]},
        {"reasoning": "done", "content": "it says hello"},
    ):
        plan, chat, record = call(injector, engine, messages, reply)
        out.append((plan, chat, record))
        messages = messages + [assistant_turn(chat)]
        for tc in chat["choices"][0]["message"].get("tool_calls") or ():
            messages.append(
                {"role": "tool", "tool_call_id": tc["id"], "content": "result of " + tc["function"]["name"]}
            )
    return out


@pytest.mark.parametrize("transport", ENGINES)
def test_every_call_extends_the_previous_prompt_and_generation(transport):
    engine = engine_for(transport)
    calls = agent_session(make(engine, transport), engine)
    assert calls[0][2]["fallback_reason"] == inj.FIRST_CALL
    for (_, prior, _), (_, chat, record) in zip(calls, calls[1:]):
        assert extends(chat["prompt_token_ids"], prior)
        assert record["fallback_reason"] is None and record["echo_ok"] is True and record["injected_len"] > 0
        assert record["chain"] == calls[0][2]["chain"]
    # NeMo-RL's engine renders its template and splices: its chains are found by their messages, unrendered.
    assert engine.tokenize_calls == (0 if transport == "nemo_rl" else len(calls))
    assert (calls[-1][2]["history_hash"] is not None) == (transport == "nemo_rl")


def test_negative_control_without_injection_the_reasoning_template_breaks_every_turn():
    engine = ToyEngine()
    messages = [SYSTEM, {"role": "user", "content": "find the file"}]
    first = engine.chat({"messages": messages}, {"reasoning": "look first", "tools": ["ls"]})
    messages += [assistant_turn(first), {"role": "tool", "content": "result"}]
    second = engine.chat({"messages": messages}, {"reasoning": "done", "content": "ok"})
    assert not extends(second["prompt_token_ids"], first)


def test_an_engine_that_ignores_the_field_gets_fallbacks_and_then_a_pause():
    engine = ToyEngine(mode="ignore")
    injector = make(engine, breaker=RouteBreaker(limit=2, pause_s=60))
    calls = agent_session(injector, engine) + agent_session(injector, engine)
    reasons = [record["fallback_reason"] for _, _, record in calls]
    # Session 1: seed, mismatch, mismatch (→ paused); session 2 reuses the session id: paused throughout.
    assert reasons[:3] == [inj.FIRST_CALL, inj.ECHO_MISMATCH, inj.ECHO_MISMATCH]
    assert set(reasons[3:]) <= {inj.PAUSED, inj.NO_MATCHING_CHAIN}
    assert all(record["echo_ok"] is not True for _, _, record in calls)
    assert injector.injected_total == 0 and injector.fallbacks[inj.ECHO_MISMATCH] == 2


def test_an_engine_that_rejects_the_field_is_asked_again_plainly():
    engine = ToyEngine(mode="reject")
    calls = agent_session(make(engine), engine)
    assert [r["fallback_reason"] for _, _, r in calls] == [inj.FIRST_CALL, inj.UPSTREAM_REJECTED, inj.UPSTREAM_REJECTED]
    assert all(chat["choices"][0]["message"] for _, chat, _ in calls)  # every call answered
    assert "kv_transfer_params" not in calls[1][0].body


def test_a_side_call_neither_breaks_nor_joins_the_main_chain():
    engine = ToyEngine()
    injector = make(engine)
    messages = [SYSTEM, {"role": "user", "content": "find the file"}]
    _, first, r1 = call(injector, engine, messages, {"reasoning": "a", "tools": ["ls"]})
    title = [{"role": "system", "content": "you are a title generator"}, {"role": "user", "content": "find the file"}]
    _, side, rs = call(injector, engine, title, {"content": "File search"})
    assert rs["fallback_reason"] == inj.NO_MATCHING_CHAIN and rs["chain"] != r1["chain"]
    messages += [assistant_turn(first), {"role": "tool", "content": "x"}]
    _, second, r2 = call(injector, engine, messages, {"reasoning": "b", "content": "done"})
    assert r2["fallback_reason"] is None and r2["chain"] == r1["chain"]
    assert extends(second["prompt_token_ids"], first)


def test_after_a_length_stop_the_next_call_is_plain_and_reseeds():
    engine = ToyEngine()
    injector = make(engine)
    messages = [SYSTEM, {"role": "user", "content": "go"}]
    _, first, r1 = call(injector, engine, messages, {"reasoning": "a b c d e", "content": "x"}, max_tokens=3)
    assert first["choices"][0]["finish_reason"] == "length" and r1["eot_token_id"] is None
    messages += [assistant_turn(first), {"role": "user", "content": "again"}]
    _, second, r2 = call(injector, engine, messages, {"reasoning": "b", "content": "y"})
    assert r2["fallback_reason"] == inj.NO_EOT and r2["chain"] == r1["chain"]
    messages += [assistant_turn(second), {"role": "user", "content": "more"}]
    _, third, r3 = call(injector, engine, messages, {"reasoning": "c", "content": "z"})
    assert r3["fallback_reason"] is None and extends(third["prompt_token_ids"], second)


def test_rewritten_history_seeds_a_new_chain():
    engine = ToyEngine()
    injector = make(engine)
    _, first, r1 = call(injector, engine, [SYSTEM, {"role": "user", "content": "one"}], {"content": "a"})
    _, _, r2 = call(injector, engine, [SYSTEM, {"role": "user", "content": "something else"}], {"content": "b"})
    assert r2["fallback_reason"] == inj.NO_MATCHING_CHAIN and r2["chain"] != r1["chain"]


def test_a_tokenize_failure_is_a_plain_call():
    engine = ToyEngine()
    injector = make(engine)
    injector.toy_tokenizer.fail = True  # type: ignore[attr-defined]
    plan, chat, record = call(injector, engine, [SYSTEM, {"role": "user", "content": "x"}], {"content": "a"})
    assert record["fallback_reason"] == inj.TOKENIZE_FAILED and record["chain"] is None and not plan.injected


def test_two_calls_racing_on_one_chain_fork_instead_of_overwriting():
    engine = ToyEngine()
    injector = make(engine)
    messages = [SYSTEM, {"role": "user", "content": "go"}]
    _, first, r1 = call(injector, engine, messages, {"content": "a", "tools": ["ls"]})
    messages += [assistant_turn(first), {"role": "tool", "content": "x"}]

    async def race():
        a = await injector.prepare("s", "r", {"messages": messages})
        b = await injector.prepare("s", "r", {"messages": messages})
        ra = injector.finish(a, engine.chat(a.body, {"content": "from a"}))
        rb = injector.finish(b, engine.chat(b.body, {"content": "from b"}))
        return ra, rb

    ra, rb = asyncio.run(race())
    assert ra["fallback_reason"] is None and rb["fallback_reason"] is None
    assert ra["chain"] == r1["chain"] and rb["chain"] != r1["chain"]  # b committed on a fork
    assert len(injector.cache.get("s")) == 2


@pytest.mark.parametrize("transport", ["vllm", "nemo_rl"])  # a chain found by its render, or by its messages
def test_a_chain_missing_from_memory_is_rebuilt_from_the_records(transport):
    engine = engine_for(transport)
    records: list[dict] = []
    injector = make(engine, transport, records=records)
    messages = [SYSTEM, {"role": "user", "content": "go"}]
    _, first, r1 = call(injector, engine, messages, {"content": "a", "tools": ["ls"]})
    records.append(
        {
            "uuid": "u1",
            "captured_at": "1",
            "is_valid": True,
            "status": "completed",
            "messages": messages + [assistant_turn(first)],
            "prompt_token_ids": first["prompt_token_ids"],
            "generation_token_ids": first["choices"][0]["token_ids"],
            "injection": r1,
        }
    )
    fresh = make(engine, transport, records=records)  # a restart, or another worker process
    messages += [assistant_turn(first), {"role": "tool", "content": "x"}]
    _, second, r2 = call(fresh, engine, messages, {"content": "b"})
    assert r2["fallback_reason"] is None and r2["chain"] == r1["chain"]
    assert extends(second["prompt_token_ids"], first)
    # The control: without the records the new process has no chain to extend.
    _, _, r3 = call(make(engine, transport), engine, messages, {"content": "b"})
    assert r3["fallback_reason"] == inj.FIRST_CALL


@pytest.mark.parametrize("transport", ["vllm", "nemo_rl"])
def test_a_stale_chain_in_memory_is_not_extended(transport):
    """Another process moved the conversation on: the old head must not be spliced onto."""
    engine = engine_for(transport)
    records: list[dict] = []
    a = make(engine, transport, records=records, rebuild_wait_s=0)
    messages = [SYSTEM, {"role": "user", "content": "go"}]
    _, first, _ = call(a, engine, messages, {"content": "a", "tools": ["ls"]})
    messages += [assistant_turn(first), {"role": "tool", "content": "x"}]
    elsewhere = make(engine, transport)  # another process, whose record `a` does not see
    _, second, _ = call(elsewhere, engine, messages, {"content": "b", "tools": ["cat"]})
    messages += [assistant_turn(second), {"role": "tool", "content": "y"}]
    _, third, r3 = call(a, engine, messages, {"content": "c"})
    assert r3["fallback_reason"] == inj.NO_MATCHING_CHAIN
    assert third["prompt_token_ids"] == engine.render(messages, True)  # plain, not a splice onto `first`


def test_max_tokens_is_clamped_to_the_context_left():
    engine = ToyEngine(max_model_len=40)
    injector = make(engine)
    messages = [SYSTEM, {"role": "user", "content": "go"}]
    plan, _, _ = call(injector, engine, messages, {"content": "a"}, max_tokens=1000, max_completion_tokens=500)
    prompt_len = len(engine.render(messages, True))
    assert plan.body["max_tokens"] == 40 - prompt_len - 8 and "max_completion_tokens" not in plan.body
    plan, _, _ = call(injector, engine, [SYSTEM, {"role": "user", "content": "hi"}], {"content": "a"}, max_tokens=5)
    assert plan.body["max_tokens"] == 5  # already under the limit: untouched


def test_n_above_one_is_left_alone():
    engine = ToyEngine()
    injector = make(engine)
    plan, _, record = call(injector, engine, [SYSTEM, {"role": "user", "content": "go"}], {"content": "a"}, n=2)
    assert record["fallback_reason"] == inj.UNSUPPORTED and injector.cache.get("s") is None


def test_cache_bound_applies():
    engine = ToyEngine()
    injector = make(engine, cache=HistoryCache(max_sessions=1))
    call(injector, engine, [SYSTEM, {"role": "user", "content": "go"}], {"content": "a"}, session="one")
    call(injector, engine, [SYSTEM, {"role": "user", "content": "go"}], {"content": "a"}, session="two")
    assert len(injector.cache) == 1


def _second_call_plan(**body: Any):
    engine = ToyEngine(max_model_len=10_000)
    injector = make(engine)
    messages = [SYSTEM, {"role": "user", "content": "find the file"}]
    _, first, _ = call(injector, engine, messages, {"reasoning": "look", "tools": ["ls"]})
    messages += [assistant_turn(first), {"role": "tool", "content": "x"}]
    plan, _, record = call(injector, engine, messages, {"content": "done"}, **body)
    return plan, record


def test_the_payload_may_be_spliced_only_when_the_body_is_the_request_plus_the_field():
    plan, record = _second_call_plan()
    assert record["fallback_reason"] is None and plan.adds_field_only
    # The caller's own kv_transfer_params, or a clamped budget: the body is serialised whole.
    plan, record = _second_call_plan(kv_transfer_params={"do_remote_decode": False})
    assert record["fallback_reason"] is None and not plan.adds_field_only
    plan, record = _second_call_plan(max_tokens=100_000)
    assert record["fallback_reason"] is None and not plan.adds_field_only and plan.body["max_tokens"] < 100_000


def test_the_prefix_digest_worked_out_meanwhile_is_the_prefix_hash():
    plan, record = _second_call_plan()
    assert plan.prefix_digest is not None and plan.render is not None
    assert record["prefix_hash"] == plan.prefix_digest == prefix_hash(plan.render.prefix)


def test_nemo_rl_builds_no_tokenizer_even_when_one_is_configured():
    from server.config import Settings
    from server.injection.setup import build_injector

    def tokenizer(transport: str):
        settings = Settings(
            switchyard_base_url="http://127.0.0.1:9/v1",
            token_injection=True,
            injection_transport=transport,
            injection_tokenize_base_url="http://127.0.0.1:9",
        )
        injector, close = build_injector(
            settings, default_route="r", deployment_text=None, read_records=None, max_model_len_for=lambda r: None
        )
        close()
        return injector._tokenizer_for("r")

    assert tokenizer("nemo_rl") is None
    assert tokenizer("vllm") is not None  # the control: the same settings with vllm ask /tokenize


def test_an_answer_whose_ids_are_not_json_integers_is_served_plain_not_failed():
    """/tokenize answers are taken as bytes (digits and commas); `01` is no JSON integer, so cutting
    the call's tail out of such an answer fails: the call goes out plain, never as an error."""
    engine = engine_for("vllm")
    injector = make(engine)
    messages: list[dict] = [SYSTEM, {"role": "user", "content": "find the file"}]
    _, chat, _ = call(injector, engine, messages, {"reasoning": "look", "tools": ["ls"]})
    tokenizer = injector.toy_tokenizer  # type: ignore[attr-defined]
    rendered = tokenizer.engine.tokenize

    async def with_a_bad_tail(messages, tools, template):  # the chain's prefix, then `01`
        good = await rendered(messages, tools, template)
        return Render(good.prefix_json[:-1] + b",01]", good.prefix_len + 1, None, good.generation_prompt)

    tokenizer.engine.tokenize = with_a_bad_tail
    follow = messages + [assistant_turn(chat), {"role": "tool", "tool_call_id": "c0", "content": "a.txt"}]
    plan, _, record = call(injector, engine, follow, {"reasoning": "read", "content": "ok"})
    assert not plan.injected and record["fallback_reason"] == inj.TOKENIZE_FAILED
