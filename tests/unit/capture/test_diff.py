"""Delta-encoded records: served byte for byte as full records, small on disk, loud when a base is gone."""

from __future__ import annotations

import hashlib
import random

import orjson
import pytest

from server.capture.catalog.sessions import build_rollout
from server.capture.read import diff_read as diff_module
from server.capture.read import record_files as record_files_module
from server.capture.read.diff_read import parse_diff_file
from server.capture.store import CaptureStore, session_dir_name
from server.capture.write import diff as diff_encoder
from server.capture.write.diff import DIFF_SUFFIX
from server.capture.write.record import RecordInput

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _response(prompt: list[int], generation: list[int], message: dict) -> dict:
    return {
        "id": "chatcmpl-x",
        "model": "Qwen/Qwen3-0.6B",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                "token_ids": generation,
                "logprobs": {"content": [{"token": f"t{t}", "logprob": -0.001 * t} for t in generation]},
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation),
            "total_tokens": len(prompt) + len(generation),
        },
    }


def conversation(session_id: str, turns: int = 8, seed: int = 7) -> list[dict]:
    """build_record kwargs of an agent session: tool turns, a title side call, a retry, a turn whose
    template dropped the reasoning, a changed tool list, a call without token ids."""
    rng = random.Random(seed)
    calls: list[dict] = []
    messages: list[dict] = [{"role": "system", "content": "you are an agent " * 20}]
    prompt: list[int] = [rng.randrange(100_000) for _ in range(60)]
    clock = 0

    def add(request_messages, prompt_ids, generation, message, tools=TOOLS, **extra):
        nonlocal clock
        clock += 1
        calls.append(
            dict(
                session_id=session_id,
                parent_session_id=None,
                rollout_id=None,
                request_id=f"req-{clock}",
                chat_request={"messages": list(request_messages), "tools": tools},
                chat_response=_response(list(prompt_ids), generation, message),
                route="policy",
                api="chat",
                stream=False,
                latency_ms=1.5,
                captured_at=f"2026-01-01T00:00:{clock:02d}.000000+00:00",
                record_uuid=f"{session_id}-{clock:03d}",
                **extra,
            )
        )

    for turn in range(turns):
        user = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(30))
        messages.append({"role": "user", "content": f"turn {turn}: {user}"})
        prompt = prompt + [rng.randrange(100_000) for _ in range(40)]
        generation = [rng.randrange(100_000) for _ in range(12)]
        if turn % 2:
            reply = {"role": "assistant", "content": f"answer {turn}", "reasoning_content": "thinking"}
        else:
            call_id = f"call_{turn}"
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            }
        if turn == 3:  # a title request: nothing shared with the conversation
            add([{"role": "system", "content": "title generator"}, messages[-1]], [5, 6, 7], [8], {"role": "assistant", "content": "T"}, tools=[])  # fmt: skip
        if turn == 4:  # a retry of this turn first
            add(messages, prompt, [1, 2, 3], {"role": "assistant", "content": "retried"})
        if turn == 5:  # the chat template dropped the last turn's reasoning: shares the prompt only
            prompt = prompt[:-20] + [rng.randrange(100_000) for _ in range(20)]
        tools = TOOLS + [{"type": "function", "function": {"name": "more"}}] if turn >= 6 else TOOLS
        if turn == 7:  # an upstream that returned no token ids
            broken = _response(prompt, generation, reply)
            del broken["prompt_token_ids"]
            add(messages, [], generation, reply, tools=tools)
            calls[-1]["chat_response"] = broken
        else:
            add(
                messages,
                prompt,
                generation,
                reply,
                tools=tools,
                injection={"transport": "vllm"} if turn == 2 else None,
                developer_messages=[0] if turn == 6 else None,  # a Responses client's developer message
            )
        # The client echoes the reply back (its own key order: a changed echo is a new message).
        echo = dict(reversed(list(reply.items()))) if turn == 1 else dict(reply)
        messages.append(echo)
        if reply.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "sunny"})
        prompt = prompt + generation
    return calls


def write_all(store: CaptureStore, calls: list[dict]) -> None:
    for kwargs in calls:
        assert store.submit_call(RecordInput(**{**kwargs, "chat_request": dict(kwargs["chat_request"])}))
    assert store.flush(10)


@pytest.fixture
def both(tmp_path):
    """The same calls through a full store and a delta store."""
    stores = {}
    for encoding in ("full", "delta"):
        store = CaptureStore(tmp_path / encoding, encoding=encoding)
        store.start()
        write_all(store, conversation("agent"))
        stores[encoding] = store
    yield stores
    for store in stores.values():
        store.close()


def delta_files(store: CaptureStore, session_id: str) -> dict[str, dict]:
    directory = store.sessions_dir / session_dir_name(session_id)
    return {p.name: parse_diff_file(p.read_bytes()).meta for p in directory.glob(f"*{DIFF_SUFFIX}")}


def session_bytes(store: CaptureStore, session_id: str) -> int:
    directory = store.sessions_dir / session_dir_name(session_id)
    return sum(p.stat().st_size for p in directory.iterdir())


def test_records_and_rollouts_are_byte_for_byte_those_of_full_records(both):
    full, delta = both["full"], both["delta"]
    full_records, full_skipped = full.read_completions("agent")
    delta_records, delta_skipped = delta.read_completions("agent")
    assert full_skipped == delta_skipped == 0
    assert len(full_records) == 10
    assert orjson.dumps(delta_records) == orjson.dumps(full_records)
    assert [r["developer_messages"] for r in delta_records if "developer_messages" in r] == [[0]]
    # The full store's files are the records as written; the delta store serves the same bytes.
    full_dir = full.sessions_dir / session_dir_name("agent")
    for record in delta_records:
        assert orjson.dumps(record) == (full_dir / f"{record['uuid']}.json").read_bytes()
    assert orjson.dumps(build_rollout(delta, "agent")) == orjson.dumps(build_rollout(full, "agent"))
    assert delta.list_sessions() == full.list_sessions()


def test_the_delta_files_really_are_deltas(both):
    """The control for the equality above: it would hold trivially if every file were whole."""
    metas = delta_files(both["delta"], "agent")
    assert len(metas) == 10
    based = {name: meta for name, meta in metas.items() if meta["base"] is not None}
    by_uuid = {name.removesuffix(DIFF_SUFFIX): meta for name, meta in metas.items()}
    # The first call and the title request have nothing to extend; every other call has a base.
    assert {name for name in metas if name not in based} == {"agent-001.delta", "agent-004.delta"}
    # After the side call the conversation goes on from its own last record, not from the title call.
    assert by_uuid["agent-005"]["base"] == "agent-003"
    # A contiguous turn extends the whole prompt + generation and the messages up to the reply.
    assert by_uuid["agent-003"]["prompt_token_ids"] > 0 and by_uuid["agent-003"]["messages"] > 0
    # The turn whose template dropped reasoning still shares the prior prompt's ids.
    assert by_uuid["agent-008"]["prompt_token_ids"] > 0
    assert session_bytes(both["delta"], "agent") < session_bytes(both["full"], "agent") / 3


def test_a_missing_base_is_served_invalid_with_the_reason_and_the_rollout_is_partial(both):
    store = both["delta"]
    whole = build_rollout(store, "agent")
    assert whole["mask_sample"] is False or whole["partial_reason"] is not None  # the fixture's own break
    directory = store.sessions_dir / session_dir_name("agent")
    (directory / f"agent-003{DIFF_SUFFIX}").unlink()
    records, _ = store.read_completions("agent")
    by_uuid = {r["uuid"]: r for r in records}
    broken = by_uuid["agent-005"]
    assert broken["is_valid"] is False
    assert broken["invalid_reason"] == "delta record: base record agent-003 is missing or was changed"
    assert broken["messages"] == [] and broken["prompt_token_ids"] is None
    # Everything built on it is marked too, never presented as whole.
    assert by_uuid["agent-006"]["invalid_reason"] == "delta record: base record agent-005 could not be rebuilt"
    assert by_uuid["agent-002"]["is_valid"] is True
    rollout = build_rollout(store, "agent")
    assert rollout["mask_sample"] is True
    assert rollout["record_uuids"] == ["agent-001", "agent-002"]


def test_a_replaced_base_is_detected_by_its_digest(both):
    store = both["delta"]
    directory = store.sessions_dir / session_dir_name("agent")
    path = directory / f"agent-003{DIFF_SUFFIX}"
    # Another record under the same uuid: a readable file, but not the one agent-004 was built on.
    other = parse_diff_file(path.read_bytes())
    header = dict(other.header, latency_ms=99.0)
    lines = path.read_bytes().split(b"\n", 2)
    path.write_bytes(orjson.dumps(header) + b"\n" + lines[1] + b"\n" + lines[2])
    by_uuid = {r["uuid"]: r for r in store.read_completions("agent")[0]}
    assert by_uuid["agent-003"]["is_valid"] is True and by_uuid["agent-003"]["latency_ms"] == 99.0
    assert by_uuid["agent-005"]["is_valid"] is False
    assert "agent-003 is missing or was changed" in by_uuid["agent-005"]["invalid_reason"]


def test_a_damaged_delta_file_is_skipped_and_its_dependents_are_marked(both):
    store = both["delta"]
    path = store.sessions_dir / session_dir_name("agent") / f"agent-003{DIFF_SUFFIX}"
    path.write_bytes(path.read_bytes()[:-10])  # torn body
    records, skipped = store.read_completions("agent")
    assert skipped == 1
    assert "agent-003" not in {r["uuid"] for r in records}
    assert {r["uuid"]: r for r in records}["agent-005"]["is_valid"] is False


def test_a_base_deleted_by_another_process_is_not_used(tmp_path):
    store = CaptureStore(tmp_path, encoding="delta")
    store.start()
    calls = conversation("s", turns=3)
    write_all(store, calls[:1])
    directory = store.sessions_dir / session_dir_name("s")
    # Another process deleted the session (this store never heard of it).
    for path in directory.iterdir():
        path.unlink()
    write_all(store, calls[1:2])
    [(name, meta)] = delta_files(store, "s").items()
    assert meta["base"] is None
    records, skipped = store.read_completions("s")
    assert skipped == 0 and records[0]["is_valid"] is True
    store.close()


def test_deleting_a_session_forgets_its_bases(tmp_path):
    store = CaptureStore(tmp_path, encoding="delta")
    store.start()
    calls = conversation("s", turns=3)
    write_all(store, calls[:1])
    store.delete_session("s")
    write_all(store, calls[1:2])
    [meta] = delta_files(store, "s").values()
    assert meta["base"] is None and store.read_completions("s")[0][0]["is_valid"] is True
    store.close()


def test_a_restarted_writer_starts_each_session_afresh_and_mixed_directories_read(tmp_path):
    calls = conversation("s", turns=4)
    first = CaptureStore(tmp_path, encoding="full")
    first.start()
    write_all(first, calls[:2])
    first.close()
    second = CaptureStore(tmp_path, encoding="delta")
    second.start()
    write_all(second, calls[2:])
    second.close()
    metas = delta_files(second, "s")
    assert metas[f"s-003{DIFF_SUFFIX}"]["base"] is None  # nothing remembered across the restart
    assert metas[f"s-005{DIFF_SUFFIX}"]["base"] == "s-003"
    reference = CaptureStore(tmp_path / "ref", encoding="full")
    reference.start()
    write_all(reference, calls)
    reader = CaptureStore.open_read_only(tmp_path)
    assert orjson.dumps(reader.read_completions("s")) == orjson.dumps(reference.read_completions("s"))
    reference.close()


def test_a_session_past_the_remembered_ones_is_stored_whole_and_reads_back_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(diff_encoder, "SESSIONS_REMEMBERED", 2)
    store = CaptureStore(tmp_path, encoding="delta")
    store.start()
    calls = {name: conversation(name, turns=3) for name in ("a", "b", "c")}
    write_all(store, calls["a"][:2] + calls["b"][:2] + calls["c"][:2] + calls["a"][2:])
    assert delta_files(store, "a")[f"a-003{DIFF_SUFFIX}"]["base"] is None  # "a" was forgotten
    assert delta_files(store, "c")[f"c-002{DIFF_SUFFIX}"]["base"] == "c-001"
    reference = CaptureStore(tmp_path / "ref", encoding="full")
    reference.start()
    write_all(reference, calls["a"])
    assert orjson.dumps(store.read_completions("a")) == orjson.dumps(reference.read_completions("a"))
    reference.close()
    store.close()


def test_a_long_chain_reads_without_recursion(tmp_path):
    store = CaptureStore(tmp_path, encoding="delta")
    store.start()
    base = conversation("long", turns=1)[0]
    prompt = list(base["chat_response"]["prompt_token_ids"])
    messages = list(base["chat_request"]["messages"])
    n = 1500
    for i in range(n):
        generation = [i + 1]
        kwargs = dict(
            base,
            record_uuid=f"long-{i:05d}",
            captured_at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}.000000+00:00",
            chat_request={"messages": list(messages), "tools": TOOLS},
            chat_response=_response(list(prompt), generation, {"role": "assistant", "content": f"r{i}"}),
        )
        assert store.submit_call(RecordInput(**kwargs))
        messages += [{"role": "assistant", "content": f"r{i}"}, {"role": "user", "content": "go on"}]
        prompt += generation + [7]
    assert store.flush(30)
    records, skipped = store.read_completions("long")
    assert skipped == 0 and len(records) == n and all(r["is_valid"] for r in records)
    assert records[-1]["prompt_token_ids"] == prompt[:-2]  # before the last generation and its follow-up
    assert build_rollout(store, "long")["partial_reason"] is None
    store.close()


def test_the_index_reads_only_the_header_line(tmp_path, monkeypatch):
    store = CaptureStore(tmp_path, encoding="delta")
    store.start()
    write_all(store, conversation("s", turns=4))
    store.close()
    parsed = []
    real = diff_module.parse_diff_file
    monkeypatch.setattr(diff_module, "parse_diff_file", lambda data: parsed.append(1) or real(data))
    reader = CaptureStore.open_read_only(tmp_path)
    assert reader.list_sessions()[0]["record_count"] == 5
    assert parsed == []  # the index never decompressed a body
    heads = reader.read_record_heads("s")
    assert heads is not None and [h["uuid"] for h in heads] == [f"s-{i:03d}" for i in range(1, 6)]
    assert parsed == []
    reader.read_completions("s")
    assert len(parsed) == 5  # the control: a full read does parse them


def test_file_names_and_digests(both):
    """`base_sha256` is the sha256 of the base's file bytes."""
    store = both["delta"]
    directory = store.sessions_dir / session_dir_name("agent")
    meta = parse_diff_file((directory / f"agent-005{DIFF_SUFFIX}").read_bytes()).meta
    base_bytes = (directory / f"{meta['base']}{DIFF_SUFFIX}").read_bytes()
    assert meta["base_sha256"] == hashlib.sha256(base_bytes).hexdigest()


def test_a_header_line_longer_than_the_first_block_is_still_read_without_the_body(tmp_path, monkeypatch):
    store = CaptureStore(tmp_path, encoding="delta")
    store.start()
    [kwargs] = conversation("s", turns=1)[:1]
    assert store.submit_call(RecordInput(**{**kwargs, "request_id": "r" * 3000}))  # a client's very long x-request-id
    assert store.flush(10)
    store.close()
    path = next((tmp_path / "sessions" / session_dir_name("s")).glob(f"*{DIFF_SUFFIX}"))
    assert path.read_bytes().index(b"\n") > record_files_module.HEAD_BYTES
    parsed = []
    real = diff_module.parse_diff_file
    monkeypatch.setattr(diff_module, "parse_diff_file", lambda data: parsed.append(1) or real(data))
    reader = CaptureStore.open_read_only(tmp_path)
    assert reader.list_sessions()[0]["record_count"] == 1 and parsed == []
    assert reader.read_completions("s")[0][0]["request_id"] == "r" * 3000
