"""Property: over scripted sessions, every committed call extends its chain or is recorded as a fallback.

And the converse, so the property cannot hold by always falling back: with an engine that honours
the field, every call that continues a naturally stopped turn of the conversation is injected.
Each holds with the engine's render (/tokenize), with a local renderer that bridges, and with
NeMo-RL's splice (nothing rendered here).
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from server.injection.id_fields import id_field_for
from server.injection.injector import Injector
from tests.support.toy_engine import ToyBridge, ToyTokenizer, assistant_turn, engine_for

SYSTEM = {"role": "system", "content": "agent"}
STEPS = st.lists(st.sampled_from(["tool", "user", "side", "length", "rewrite"]), min_size=1, max_size=12)


# How calls are rendered: the engine's /tokenize, a local renderer that bridges, or nothing at all
# (NeMo-RL: the engine splices its own template after the history; chains are found by their messages).
WAYS = st.sampled_from(["tokenize", "bridge", "nemo_rl"])


def run_session(steps: list[str], mode: str, way: str = "tokenize") -> list[dict]:
    splices = way == "nemo_rl"
    engine = engine_for("nemo_rl" if splices else "vllm", mode)
    tokenizer = ToyBridge(engine) if way == "bridge" else ToyTokenizer(engine)
    transport = id_field_for("nemo_rl" if splices else "vllm")
    injector = Injector(id_field=transport, tokenizer_for=lambda r: tokenizer, read_records=None)
    heads: dict[str, list[int]] = {}  # chain id -> what its last committed call sent + generated
    messages = [SYSTEM, {"role": "user", "content": "start"}]
    continues_natural_stop = False
    log = []

    async def one(msgs: list[dict], reply: dict, **body) -> tuple[dict, dict]:
        plan = await injector.prepare("s", "r", {"messages": msgs, **body})
        chat = engine.chat(plan.body, reply)
        return chat, injector.finish(plan, chat)

    for n, step in enumerate(steps):
        if step == "side":
            asyncio.run(one([{"role": "system", "content": "title generator"}, {"role": "user", "content": "t"}], {}))
            continue
        if step == "rewrite":
            messages = [SYSTEM, {"role": "user", "content": f"fresh start {n}"}]
            continues_natural_stop = False
            continue
        reply = {"reasoning": f"think {n}", "content": f"answer {n}", "tools": ["ls"] if step == "tool" else []}
        extra = {"max_tokens": 2} if step == "length" else {}
        bridged_before = getattr(tokenizer, "bridged", 0)
        chat, record = asyncio.run(one(messages, reply, **extra))
        prompt = chat["prompt_token_ids"]
        entry = {"step": step, "record": record, "continues_natural_stop": continues_natural_stop}
        entry["bridged"] = getattr(tokenizer, "bridged", 0) > bridged_before
        if record["fallback_reason"] is None:
            before = heads.get(record["chain"])
            entry["extends"] = before is not None and prompt[: len(before)] == before and len(prompt) > len(before)
        if record["chain"] is not None:
            heads[record["chain"]] = prompt + chat["choices"][0]["token_ids"]
        log.append(entry)
        messages = messages + [assistant_turn(chat)]
        if step == "tool":
            messages.append({"role": "tool", "content": f"out {n}"})
        else:
            messages.append({"role": "user", "content": f"next {n}"})
        continues_natural_stop = chat["choices"][0]["finish_reason"] != "length"
    return log


@settings(max_examples=60, deadline=None)
@given(STEPS, st.sampled_from(["honor", "ignore"]), WAYS)
def test_every_committed_call_extends_its_chain_or_is_a_fallback(steps, mode, way):
    for entry in run_session(steps, mode, way):
        record = entry["record"]
        assert record["fallback_reason"] is not None or (record["echo_ok"] is True and entry["extends"]), entry


@settings(max_examples=60, deadline=None)
@given(STEPS, WAYS)
def test_with_an_engine_that_honours_the_field_every_continuing_call_is_injected(steps, way):
    for entry in run_session(steps, "honor", way):
        if entry["continues_natural_stop"]:
            assert entry["record"]["fallback_reason"] is None, entry


@settings(max_examples=30, deadline=None)
@given(STEPS, WAYS)
def test_with_an_engine_that_ignores_the_field_nothing_is_presented_as_injected(steps, way):
    for entry in run_session(steps, "ignore", way):
        assert entry["record"]["fallback_reason"] is not None and entry["record"]["echo_ok"] is not True


def test_the_local_renderer_bridges_environment_turns_and_renders_user_turns_whole():
    """The properties above hold with the bridge because it is used: a tool result is bridged, a user turn cut.

    A step names the call's reply; what follows it in the next call is a tool result after a "tool"
    step and a user message otherwise.
    """
    log = run_session(["tool", "tool", "user", "tool", "length", "tool"], "honor", "bridge")
    assert [e["bridged"] for e in log] == [False, True, True, False, True, False]
    # The fourth call follows a user message: the bridge declines, and a whole render is cut instead.
    assert [e["record"]["fallback_reason"] for e in log] == [
        "first_call",
        None,
        None,
        None,
        None,
        "no_end_of_turn",  # after the length stop
    ]
