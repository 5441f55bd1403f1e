"""Server runs: records carry the run that wrote them, the index lists a session's runs, a rollout covers one run."""

from __future__ import annotations

import logging

import orjson
import pytest
from starlette.testclient import TestClient

from server.capture.catalog import runs
from server.capture.catalog.index import TALLY_KEPT_S
from server.capture.catalog.runs import RunChoice, UnknownRun
from server.capture.catalog.sessions import build_rollout, build_tree
from server.capture.read import record_files as record_files_module
from server.capture.read.rebuilds import RolloutBuilder
from server.capture.store import CaptureStore, session_dir_name
from server.cli.sessions import main as sessions_main
from tests.support.captures import captured_call as call
from tests.support.captures import chat_response, two_turns
from tests.support.captures import submit_all as add
from tests.support.session_apps import sessions_app
from tests.unit.api.test_sessions import assert_openai_error
from tests.unit.capture.test_index import age_directories

SESSION = "gym-rollout-7"


def _run(capture_dir, run_id, *, session_id=SESSION, child=None, sampled=3, encoding="delta"):
    """One server run on `capture_dir`: the same task again (and a sub-agent's, if named)."""
    store = CaptureStore(capture_dir, server_run=run_id, encoding=encoding)
    store.start()
    try:
        add(store, *two_turns(session_id, sampled=sampled))
        if child is not None:
            add(store, *two_turns(child, session_id, sampled=sampled))
    finally:
        store.close()


@pytest.fixture
def capture_dir(tmp_path):
    """One session id used by two server runs in turn, each with a sub-agent of its own."""
    directory = tmp_path / "captures"
    _run(directory, "run-a", child="child-a")
    _run(directory, "run-b", child="child-b", sampled=9)
    return directory


@pytest.fixture
def reader(capture_dir):
    return CaptureStore.open_read_only(capture_dir)


# ---- the run id and the `run` parameter ------------------------------------------------------


def test_new_run_ids_differ_and_are_valid():
    first, second = runs.new_run_id(), runs.new_run_id()
    assert first != second
    assert runs.is_valid_run_id(first) and runs.parse_run(first) == first


@pytest.mark.parametrize("value", ["a b", "../x", "", "x" * 101, "-lead", "r\u00e9"])
def test_parse_run_refuses_what_is_no_run(value):
    if value == "":
        assert runs.parse_run(value) == runs.LATEST  # unset means the default
        return
    with pytest.raises(ValueError):
        runs.parse_run(value)


def test_choose_picks_latest_named_legacy_or_all():
    order = [None, "run-a", "run-b"]
    assert runs.choose(order, "latest") == RunChoice()  # the latest dispatch
    assert runs.choose(order, "latest#2") == RunChoice(dispatch=2)
    assert runs.choose(order, "run-a") == RunChoice("run-a", of_run=True)
    assert runs.choose(order, "legacy") == RunChoice(None, of_run=True)
    assert runs.choose(order, "all") is None
    with pytest.raises(UnknownRun):
        runs.choose(order, "run-z")
    with pytest.raises(UnknownRun):
        runs.choose(["run-a"], "legacy")


def _turn(run, prompt, generation):
    return {"server_run": run, "prompt_token_ids": prompt, "generation_token_ids": generation}


def latest(records):
    return runs.narrow(records, RunChoice()).records


def test_the_latest_conversation_starts_where_a_new_run_began_afresh():
    # The same task run again: the later run's first prompt does not extend anything before it.
    again = [
        _turn("a", [1, 2], [3]),
        _turn("a", [1, 2, 3, 4], [5]),
        _turn("b", [1, 2], [9]),
        _turn("b", [1, 2, 9, 4], [5]),
    ]
    assert runs.runs_in_order(again) == ["a", "b"]
    assert latest(again) == again[2:]
    # The same task, sampled the same way: still a new conversation, not a retry of the old one.
    same = [_turn("a", [1, 2], [3]), _turn("a", [1, 2, 3, 4], [5]), _turn("b", [1, 2], [3])]
    assert latest(same) == same[2:]
    # A conversation that went on across a restart: the later run extends the earlier one.
    restarted = [_turn("a", [1, 2], [3]), _turn("b", [1, 2, 3, 4], [5])]
    assert latest(restarted) == restarted
    # Two servers serving one session in turn: the runs interleave.
    in_turn = [_turn("a", [1], [2]), _turn("b", [7], [8]), _turn("a", [1, 2, 3], [4])]
    assert latest(in_turn) == in_turn
    # One run, or records from before runs were recorded: all of them.
    legacy = [{"uuid": "1"}, {"uuid": "2", "server_run": None}]
    assert latest(legacy) == legacy


# ---- records and the index -------------------------------------------------------------------


def test_records_carry_the_run_and_the_index_lists_runs_in_order(reader):
    records, _ = reader.read_completions(SESSION)
    assert [r["server_run"] for r in records] == ["run-a", "run-a", "run-b", "run-b"]
    info = reader.session_info(SESSION)
    assert info["runs"] == ["run-a", "run-b"] and info["record_count"] == 4
    assert reader.session_info("child-a")["runs"] == ["run-a"]


def test_the_index_reads_the_run_from_the_first_block(capture_dir, monkeypatch):
    parsed = []
    real = record_files_module.load_record
    monkeypatch.setattr(record_files_module, "load_record", lambda path: parsed.append(path) or real(path))
    fresh = CaptureStore.open_read_only(capture_dir)
    assert fresh.session_info(SESSION)["runs"] == ["run-a", "run-b"]
    assert parsed == []  # no record was parsed whole to learn its run


def test_records_without_a_run_are_one_legacy_run(tmp_path):
    directory = tmp_path / "captures"
    _run(directory, None, encoding="full")  # what a server wrote before records carried a run id
    raw = next((directory / "sessions" / session_dir_name(SESSION)).glob("*.json"))
    record = orjson.loads(raw.read_bytes())
    del record["server_run"]  # a record written before `server_run` existed has no such key at all
    raw.write_bytes(orjson.dumps(record))
    _run(directory, "run-b", sampled=9)
    reader = CaptureStore.open_read_only(directory)
    assert reader.session_info(SESSION)["runs"] == [None, "run-b"]
    assert build_rollout(reader, SESSION, run="legacy")["mask_sample"] is False
    assert build_rollout(reader, SESSION)["record_uuids"] == [
        r["uuid"] for r in reader.read_completions(SESSION)[0][2:]
    ]


# ---- the warning -------------------------------------------------------------------------------


def _reuse_warnings(caplog):
    return [r for r in caplog.records if "earlier server run" in r.getMessage()]


def test_a_new_run_writing_into_an_earlier_runs_session_warns_once(tmp_path, caplog):
    directory = tmp_path / "captures"
    caplog.set_level(logging.WARNING, logger="switchyard_model.capture")
    _run(directory, "run-a", child="child-a")
    assert _reuse_warnings(caplog) == []  # a first run writes new sessions only
    _run(directory, "run-b", child="child-b")  # two calls into SESSION, two into a new child
    warnings = _reuse_warnings(caplog)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert repr(SESSION) in message and "run-a" in message and "run-b" in message


def test_a_session_quiet_long_enough_to_be_let_go_by_the_index_still_warns_once(tmp_path, caplog):
    """The index keeps only the entry of a quiet session (no tally): its runs still say who wrote it."""
    directory = tmp_path / "captures"
    caplog.set_level(logging.WARNING, logger="switchyard_model.capture")
    _run(directory, "run-a")
    age_directories(directory, seconds=2 * TALLY_KEPT_S)
    _run(directory, "run-b")
    assert len(_reuse_warnings(caplog)) == 1


def test_the_same_run_writing_on_after_a_restart_of_its_store_does_not_warn(tmp_path, caplog):
    """A worker of the same run (or one restarted) shares the run id: that is not a reuse."""
    directory = tmp_path / "captures"
    caplog.set_level(logging.WARNING, logger="switchyard_model.capture")
    _run(directory, "run-a")
    _run(directory, "run-a")
    assert _reuse_warnings(caplog) == []


# ---- rollouts, trees and the listing -----------------------------------------------------------


def test_rollout_covers_the_latest_run_by_default(reader):
    records, _ = reader.read_completions(SESSION)
    latest = build_rollout(reader, SESSION)
    assert latest["mask_sample"] is False and latest["partial_reason"] is None
    assert latest["record_uuids"] == [r["uuid"] for r in records[2:]]
    assert [s["session_id"] for s in latest["subagents"]] == ["child-b"]
    earlier = build_rollout(reader, SESSION, run="run-a")
    assert earlier["mask_sample"] is False
    assert earlier["record_uuids"] == [r["uuid"] for r in records[:2]]
    assert [s["session_id"] for s in earlier["subagents"]] == ["child-a"]


def test_all_runs_merged_is_todays_partial_rollout(reader):
    """The negative control: merging both runs is what spoiled the first run's rollout."""
    merged = build_rollout(reader, SESSION, run="all")
    assert merged["mask_sample"] is True
    assert merged["partial_reason"] is not None and "record 3 of 4" in merged["partial_reason"]
    assert {s["session_id"] for s in merged["subagents"]} == {"child-a", "child-b"}


def test_tree_shows_every_run_unless_asked_for_one(reader):
    whole = build_tree(reader, SESSION)
    assert whole["runs"] == ["run-a", "run-b"]
    assert {c["session_id"] for c in whole["children"]} == {"child-a", "child-b"}
    assert [c["session_id"] for c in build_tree(reader, SESSION, run="latest")["children"]] == ["child-b"]
    with pytest.raises(UnknownRun):
        build_tree(reader, SESSION, run="run-z")


def test_the_rebuild_worker_path_and_its_cache_tell_runs_apart(reader):
    async def both():
        builder = RolloutBuilder(reader.sessions_dir, workers=0)
        try:
            index = reader.index_view()
            latest = orjson.loads(await builder.rollout(index, SESSION))
            merged = orjson.loads(await builder.rollout(index, SESSION, run="all"))
            return latest, merged, builder.rebuilds
        finally:
            builder.close()

    import asyncio

    latest, merged, rebuilt = asyncio.run(both())
    assert latest["mask_sample"] is False and merged["mask_sample"] is True
    assert rebuilt == 2  # not one cached answer served for both


@pytest.fixture
def client(reader):
    app = sessions_app(reader)
    with TestClient(app) as test_client:
        yield test_client


def test_http_rollout_run_parameter(client):
    path = f"/v1/sessions/{SESSION}/rollout"
    assert client.get(path).json()["mask_sample"] is False
    assert client.get(path, params={"run": "latest"}).json()["mask_sample"] is False
    assert client.get(path, params={"run": "run-a"}).json()["mask_sample"] is False
    assert client.get(path, params={"run": "all"}).json()["mask_sample"] is True
    error = assert_openai_error(client.get(path, params={"run": "no such run!"}), 400)
    assert error["param"] == "run"
    error = assert_openai_error(client.get(path, params={"run": "run-z"}), 404)
    assert error["param"] == "run" and error["code"] == "run_not_found"
    assert_openai_error(client.get(path, params={"run": "legacy"}), 404)  # every record has a run


def test_http_listing_and_tree_show_runs(client):
    sessions = {s["session_id"]: s for s in client.get("/v1/sessions").json()["sessions"]}
    assert sessions[SESSION]["runs"] == ["run-a", "run-b"]
    assert sessions["child-b"]["runs"] == ["run-b"]
    rich = client.get("/v1/sessions", params={"summary": "true", "q": SESSION}).json()["sessions"][0]
    # The summary says what GET /rollout says by default: whole, not masked.
    assert rich["runs"] == ["run-a", "run-b"]
    assert rich["summary"]["rollout"] == "whole" and rich["summary"]["mask_sample"] is False
    tree = client.get(f"/v1/sessions/{SESSION}/tree", params={"run": "run-a"}).json()
    assert [c["session_id"] for c in tree["children"]] == ["child-a"]
    assert_openai_error(client.get(f"/v1/sessions/{SESSION}/tree", params={"run": "a b"}), 400)


def test_cli_rollout_and_export_take_run(capture_dir, tmp_path, capsys):
    source = ["--capture-dir", str(capture_dir)]
    assert sessions_main(["sessions", "rollout", SESSION, *source]) == 0
    assert orjson.loads(capsys.readouterr().out)["mask_sample"] is False
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--run", "all"]) == 0
    assert orjson.loads(capsys.readouterr().out)["mask_sample"] is True
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--run", "run-z"]) == 1
    assert sessions_main(["sessions", "rollout", SESSION, *source, "--run", "a b"]) == 2
    capsys.readouterr()
    assert sessions_main(["sessions", "tree", SESSION, *source, "--json", "--run", "latest"]) == 0
    assert [c["session_id"] for c in orjson.loads(capsys.readouterr().out)["children"]] == ["child-b"]
    assert sessions_main(["sessions", "tree", SESSION, *source]) == 0
    assert "4 records, 2 server runs" in capsys.readouterr().out

    out = tmp_path / "rollouts.jsonl"
    assert sessions_main(["sessions", "export", *source, "--out", str(out)]) == 0
    # Each run began the task afresh: two dispatches, each its own line, each whole with its own sub-agent.
    first, second = (orjson.loads(line) for line in out.read_bytes().splitlines())
    assert (first["dispatch"], second["dispatch"]) == (1, 2) and first["dispatches"] == second["dispatches"] == 2
    assert first["mask_sample"] is False and [s["session_id"] for s in first["subagents"]] == ["child-a"]
    assert second["mask_sample"] is False and [s["session_id"] for s in second["subagents"]] == ["child-b"]
    assert sessions_main(["sessions", "export", *source, "--out", str(out), "--dispatch", "latest"]) == 0
    (line,) = out.read_bytes().splitlines()
    assert orjson.loads(line)["record_uuids"] == second["record_uuids"]
    assert sessions_main(["sessions", "export", *source, "--out", str(out), "--run", "all"]) == 0
    assert orjson.loads(out.read_bytes().splitlines()[0])["mask_sample"] is True
    assert sessions_main(["sessions", "export", *source, "--out", str(out), "--run", "run-a"]) == 0
    assert "of server run run-a" in capsys.readouterr().err
    assert [s["session_id"] for s in orjson.loads(out.read_bytes())["subagents"]] == ["child-a"]


def test_cli_list_counts_runs(capture_dir, capsys):
    assert sessions_main(["sessions", "list", "--capture-dir", str(capture_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[SESSION][3] == "2" and rows["child-a"][3] == "1"


def test_a_session_continued_across_a_restart_is_one_conversation(tmp_path):
    """What docs/capture.md says of a restart mid-session: both runs' calls are one rollout."""
    directory = tmp_path / "captures"
    before = CaptureStore(directory, server_run="run-a")
    before.start()
    add(before, call(SESSION, request_id="req-1", response=chat_response([1, 2], [3])))
    before.close()
    after = CaptureStore(directory, server_run="run-b")
    after.start()
    turn_two = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "more"},
    ]
    add(after, call(SESSION, request_id="req-2", messages=turn_two, response=chat_response([1, 2, 3, 4], [5])))
    after.close()
    reader = CaptureStore.open_read_only(directory)
    records, _ = reader.read_completions(SESSION)
    assert reader.session_info(SESSION)["runs"] == ["run-a", "run-b"]
    joined = build_rollout(reader, SESSION)
    assert joined["record_uuids"] == [r["uuid"] for r in records] and joined["mask_sample"] is False
    assert build_rollout(reader, SESSION, run="all") == {**joined, "dispatch": None}  # one dispatch: the same
    # One run alone is just its part (the earlier turn is context there, without token ids).
    assert build_rollout(reader, SESSION, run="run-b")["record_uuids"] == [records[1]["uuid"]]


def test_collect_after_a_local_server_retry_rebuilds_the_latest_run(capture_dir):
    from server.spawn import collect_rollouts

    errors: list[str] = []
    (rollout,) = collect_rollouts(capture_dir, errors)
    assert errors == [] and rollout["session_id"] == SESSION
    assert rollout["mask_sample"] is False and [s["session_id"] for s in rollout["subagents"]] == ["child-b"]
