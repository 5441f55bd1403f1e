"""Dispatches: a session id reused for new tasks is split, from its records alone, into one rollout per task."""

from __future__ import annotations

import copy

import orjson
import pytest
from starlette.testclient import TestClient

from server.capture.catalog import dispatches
from server.capture.catalog.runs import RunChoice, narrow
from server.capture.catalog.sessions import build_rollout
from server.capture.rollout import reconstruct_session
from server.capture.rollout.breaks import message_break_kind
from server.capture.store import CaptureStore
from server.cli.sessions import main as sessions_main
from tests.support.scripted_sessions import ScriptedSession
from tests.support.session_apps import sessions_app
from tests.unit.api.test_sessions import assert_openai_error

SESSION = "0-0"  # a Gym rollout id: `<task>-<repeat>`, the same on every dispatch


def _dispatch(task: str | None = None, *, calls: int = 3, system: str | None = None) -> ScriptedSession:
    """One dispatch of the rollout id: an agent conversation of `calls` calls (the last answers in text)."""
    session = ScriptedSession(SESSION)
    if task is not None:
        session.history[1]["content"] = task
    if system is not None:
        session.history[0]["content"] = system
    for n in range(calls):
        session.call(tool=n < calls - 1)
    return session


def _in_order(*parts: list[dict]) -> list[dict]:
    """The parts' records as one session's, in capture order: times and uuids restamped in turn."""
    out = []
    for part in parts:
        for record in part:
            n = len(out)
            record = copy.deepcopy(record)
            record["uuid"] = f"r-{n:03d}"
            record["captured_at"] = f"2026-07-14T00:{n // 60:02d}:{n % 60:02d}.000000+00:00"
            out.append(record)
    return out


def _uuids(records: list[dict]) -> list[str]:
    return [record["uuid"] for record in records]


def _split(records: list[dict]) -> list[list[str]]:
    return [_uuids(part) for part in dispatches.split(records)]


def _latest_rollout(records: list[dict]) -> dict:
    return reconstruct_session(SESSION, narrow(records, RunChoice()).records)


# ---- the rule -------------------------------------------------------------------------------------


def test_two_dispatches_with_other_prompts_are_two_whole_rollouts():
    records = _in_order(_dispatch("Task alpha").records, _dispatch("Task beta").records)
    assert _split(records) == [_uuids(records[:3]), _uuids(records[3:])]
    latest = _latest_rollout(records)
    assert latest["mask_sample"] is False and latest["record_uuids"] == _uuids(records[3:])
    earlier = reconstruct_session(SESSION, narrow(records, RunChoice(dispatch=1)).records)
    assert earlier["mask_sample"] is False and earlier["record_uuids"] == _uuids(records[:3])
    # The control: read as one conversation, the second dispatch is a "compaction" of the first.
    merged = reconstruct_session(SESSION, records)
    assert merged["mask_sample"] is True and merged["record_uuids"] == _uuids(records[:3])


def test_identical_prompts_are_never_stitched_into_one_rollout():
    # Deterministic sampling: the second dispatch's calls carry exactly the first dispatch's tokens.
    first, second = _dispatch().records, _dispatch().records
    assert [r["prompt_token_ids"] for r in first] == [r["prompt_token_ids"] for r in second]
    records = _in_order(first, second)
    assert _split(records) == [_uuids(records[:3]), _uuids(records[3:])]
    latest = _latest_rollout(records)
    assert latest["mask_sample"] is False and latest["record_uuids"] == _uuids(records[3:])
    # The control: one conversation, a rollout stitched across the two dispatches and reported whole.
    stitched = reconstruct_session(SESSION, records)
    assert stitched["mask_sample"] is False
    assert set(stitched["record_uuids"]) & set(_uuids(records[:3]))
    assert set(stitched["record_uuids"]) & set(_uuids(records[3:]))


def test_single_call_dispatches_split_whether_the_prompt_repeats_or_not():
    same = _in_order(*(_dispatch(calls=1).records for _ in range(3)))
    assert _split(same) == [[r["uuid"]] for r in same]
    other = _in_order(_dispatch("Task alpha", calls=1).records, _dispatch("Task beta", calls=1).records)
    assert _split(other) == [[r["uuid"]] for r in other]
    # Another system prompt too: the same agent (model, tools) asked a new task.
    own = _in_order(_dispatch("Task alpha", calls=1).records, _dispatch("b", calls=1, system="Be brief.").records)
    assert _split(own) == [[r["uuid"]] for r in own]
    for records in (same, other, own):
        latest = _latest_rollout(records)
        assert latest["mask_sample"] is False and latest["record_uuids"] == [records[-1]["uuid"]]


def test_a_title_call_beside_the_first_call_stays_in_its_dispatch():
    first = ScriptedSession(SESSION)
    first.call()
    first.title()  # opencode asks for a title while the conversation starts
    first.call()
    first.call(tool=False)
    second = ScriptedSession(SESSION)
    second.history[1]["content"] = "Task beta"
    second.title()  # this time before the first call
    second.call()
    second.call(tool=False)
    records = _in_order(first.records, second.records)
    assert _split(records) == [_uuids(records[:4]), _uuids(records[4:])]
    latest = _latest_rollout(records)
    assert latest["mask_sample"] is False and latest["side_calls"] == [records[4]["uuid"]]
    assert latest["record_uuids"] == _uuids(records[5:])
    one = _in_order(first.records)
    assert _split(one) == [_uuids(one)]


def test_a_retry_of_a_failed_first_call_stays_in_its_dispatch():
    session = ScriptedSession(SESSION)
    session.fail()  # the first call did not complete; the client asks again
    session.call()
    session.call(tool=False)
    records = _in_order(session.records)
    assert _split(records) == [_uuids(records)]
    # A second dispatch whose first attempt failed: the boundary is at the failed attempt.
    again = ScriptedSession(SESSION)
    again.fail()
    again.call()
    again.call(tool=False)
    both = _in_order(session.records, again.records)
    assert _split(both) == [_uuids(both[:3]), _uuids(both[3:])]
    latest = _latest_rollout(both)
    assert latest["mask_sample"] is False and latest["record_uuids"] == _uuids(both[4:])


def test_a_side_call_mid_conversation_and_a_compaction_stay_in_the_dispatch():
    session = ScriptedSession(SESSION)
    session.call()
    side = session._record(
        [{"role": "system", "content": "Is this a new topic?"}, {"role": "user", "content": "ls"}],
        {"role": "assistant", "content": "no"},
    )
    side.update(model="small-model", tools=[])  # Claude Code's small calls: another model, no tools
    session.call()
    session.call()
    records = _in_order(session.records)
    assert _split(records) == [_uuids(records)]
    assert _latest_rollout(records)["side_calls"] == [records[1]["uuid"]]

    compacted = ScriptedSession(SESSION)
    compacted.call()
    compacted.call()
    compacted.compact()  # the history replaced by a summary of it: no assistant turn left
    compacted.call()
    records = _in_order(compacted.records)
    assert _split(records) == [_uuids(records)]
    rollout = _latest_rollout(records)
    assert rollout["mask_sample"] is True and rollout["partial_break"]["kind"] == "compacted"


def test_a_compaction_whose_summary_the_client_reworked_stays_when_it_quotes_a_line_of_it():
    session = ScriptedSession(SESSION)
    session.call()
    summary = "<analysis>checked</analysis>\nThe agent listed the files in the repository root.\nNext: read a.txt"
    session._record(session.history, {"role": "assistant", "content": summary})  # the client's summary call
    reworked = "This session is being continued.\n- The agent listed the files in the repository root.\n"
    session.history = [session.history[0], {"role": "user", "content": reworked}]
    session.call()
    session.call()
    records = _in_order(session.records)
    assert _split(records) == [_uuids(records)]
    # The control: the same summary with that line reworded is a new task.
    session.records[2]["messages"][1]["content"] = "This session is being continued.\n- Files were listed.\n"
    records = _in_order(session.records)
    assert _split(records) == [_uuids(records[:2]), _uuids(records[2:])]


def test_a_server_run_that_began_afresh_is_a_boundary_even_where_the_rule_sees_none():
    first = _dispatch("Task alpha", calls=1).records
    later = _dispatch("Task beta", calls=1, system="Be brief.").records
    later[0]["model"] = "another-model"  # nothing in common with the first: only the run says
    for record in first:
        record["server_run"] = "run-a"
    for record in later:
        record["server_run"] = "run-b"
    records = _in_order(first, later)
    assert len(narrow(records, RunChoice()).records) == 1
    assert narrow(records, RunChoice()).dispatches == 2


def test_a_new_conversation_is_never_called_a_compaction():
    history = _dispatch("Task alpha").records[-1]["messages"]
    fresh = _dispatch("Task beta", calls=1).records[0]["messages"][:-1]
    assert message_break_kind(history, fresh) == "new_conversation"


def test_a_summary_lists_the_latest_dispatches_and_counts_them_all(monkeypatch):
    from server.capture.catalog import summary

    monkeypatch.setattr(summary, "DISPATCHES_LISTED", 2)
    records = _in_order(*(_dispatch(f"Task {k}", calls=1).records for k in range(5)))
    listed, count = summary.dispatch_list(records)
    assert count == 5 and [d["dispatch"] for d in listed] == [4, 5]
    assert listed[-1]["first_captured_at"] == records[-1]["captured_at"]


def test_the_rule_reads_each_record_once_and_looks_ahead_only_after_a_conversation_went_on(monkeypatch):
    looked = []
    real = dispatches._is_side_call
    monkeypatch.setattr(dispatches, "_is_side_call", lambda *args: looked.append(args[1]) or real(*args))
    single = _in_order(*(_dispatch(calls=1).records for _ in range(50)))
    assert len(dispatches.split(single)) == 50 and looked == []
    records = _in_order(_dispatch("Task alpha").records, _dispatch("Task beta").records)
    dispatches.split(records)
    assert looked == [3]


# ---- through the store: the views, the parameter, the export ------------------------------------


@pytest.fixture
def capture_dir(tmp_path):
    """Two dispatches of one rollout id, each with a sub-agent under the same reused id."""
    directory = tmp_path / "captures"
    store = CaptureStore(directory)
    store.start()
    parent_a, parent_b = _dispatch("Task alpha").records, _dispatch("Task beta").records
    child_a = ScriptedSession(f"{SESSION}/sub", parent=SESSION)
    child_a.call(tool=False)
    child_b = ScriptedSession(f"{SESSION}/sub", parent=SESSION)
    child_b.history[1]["content"] = "Sub task beta"
    child_b.call(tool=False)
    # The sub-agents run after their parent's first call: a, sub a, a, a, b, sub b, b, b.
    ordered = _in_order(parent_a[:1], child_a.records, parent_a[1:], parent_b[:1], child_b.records, parent_b[1:])
    for record in ordered:
        assert store.submit(record)
    assert store.flush(10)
    store.close()
    return directory


@pytest.fixture
def reader(capture_dir):
    return CaptureStore.open_read_only(capture_dir)


def test_every_view_defaults_to_the_latest_dispatch_and_each_earlier_one_is_whole(reader):
    records, _ = reader.read_completions(SESSION)
    latest = build_rollout(reader, SESSION)
    assert (latest["dispatch"], latest["dispatches"], latest["mask_sample"]) == (2, 2, False)
    assert latest["record_uuids"] == _uuids(records[3:])
    (sub,) = latest["subagents"]
    assert sub["mask_sample"] is False and sub["output"][-1]["content"][0]["text"] == "answer 1"
    assert "Sub task beta" in orjson.dumps(sub["input"]).decode()
    first = build_rollout(reader, SESSION, run="latest#1")
    assert (first["dispatch"], first["mask_sample"]) == (1, False) and first["record_uuids"] == _uuids(records[:3])
    assert "Sub task beta" not in orjson.dumps(first["subagents"]).decode()
    chains = build_rollout(reader, SESSION, view="chains")
    assert chains["dispatch"] == 2 and chains["rollout"]["status"] == "whole"
    assert [c["record_uuids"] for c in chains["chains"]] == [_uuids(records[3:])]


@pytest.fixture
def client(reader):
    app = sessions_app(reader)
    with TestClient(app) as test_client:
        yield test_client


def test_http_dispatch_parameter_and_summary(client, reader):
    records, _ = reader.read_completions(SESSION)
    path = f"/v1/sessions/{SESSION}/rollout"
    assert client.get(path).json()["record_uuids"] == _uuids(records[3:])
    assert client.get(path, params={"dispatch": "latest"}).json()["dispatch"] == 2
    assert client.get(path, params={"dispatch": "1"}).json()["record_uuids"] == _uuids(records[:3])
    chains = client.get(f"/v1/sessions/{SESSION}/chains", params={"dispatch": "1"}).json()
    assert chains["dispatch"] == 1 and chains["rollout"]["status"] == "whole"
    for bad in ("0", "-1", "one", "1.5"):
        assert assert_openai_error(client.get(path, params={"dispatch": bad}), 400)["param"] == "dispatch"
    error = assert_openai_error(client.get(path, params={"dispatch": "3"}), 404)
    assert error["param"] == "dispatch" and error["code"] == "dispatch_not_found"
    for bad in ("01", "1e3", "latest ", "9999999999"):
        assert assert_openai_error(client.get(path, params={"dispatch": bad}), 400)["param"] == "dispatch"
    # `run=all` is every record unsplit; with a dispatch, that dispatch of every run's records.
    assert client.get(path, params={"run": "all"}).json()["dispatch"] is None
    assert client.get(path, params={"dispatch": "1", "run": "all"}).json()["record_uuids"] == _uuids(records[:3])
    tree = client.get(f"/v1/sessions/{SESSION}/tree", params={"dispatch": "1"}).json()
    assert [c["session_id"] for c in tree["children"]] == [f"{SESSION}/sub"]
    row = client.get("/v1/sessions", params={"summary": "true", "kind": "root"}).json()["sessions"][0]
    assert row["summary"]["rollout"] == "whole" and row["summary"]["mask_sample"] is False
    assert [(d["dispatch"], d["calls"]) for d in row["summary"]["dispatches"]] == [(1, 3), (2, 3)]
    assert row["summary"]["dispatch_count"] == 2


def test_export_writes_each_dispatch_as_its_own_whole_rollout(capture_dir, tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    assert sessions_main(["sessions", "export", "--capture-dir", str(capture_dir), "--out", str(out)]) == 0
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [(line["session_id"], line["dispatch"], line["dispatches"]) for line in lines] == [
        (SESSION, 1, 2),
        (SESSION, 2, 2),
    ]
    assert not any(line["mask_sample"] for line in lines)
    assert not set(lines[0]["record_uuids"]) & set(lines[1]["record_uuids"])
    source = ["--capture-dir", str(capture_dir)]
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--dispatch", "1"]) == 0
    assert orjson.loads(capsys.readouterr().out)["record_uuids"] == lines[0]["record_uuids"]
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--dispatch", "9"]) == 1
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--dispatch", "x"]) == 2
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--dispatch", "01"]) == 2


def test_without_the_split_the_same_captures_mix(reader, monkeypatch):
    """The negative control of the views above: segmentation off, the rollout is dispatch one's, masked."""
    from server.capture.catalog import runs

    monkeypatch.setattr(runs, "split", lambda records, fresh_starts=(): [records] if records else [])
    records, _ = reader.read_completions(SESSION)
    mixed = build_rollout(reader, SESSION)
    assert mixed["dispatches"] == 1 and mixed["mask_sample"] is True
    assert mixed["record_uuids"] == _uuids(records[:3])  # the second dispatch is in no rollout
    assert {s["session_id"] for s in mixed["subagents"]} == {f"{SESSION}/sub"}
