"""`switchyard-model sessions ...` against a capture directory and against a live server on 127.0.0.1."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from server.capture.catalog import sessions as capture_sessions
from server.capture.rollout import RolloutError
from server.capture.store import CaptureStore
from server.capture.write.record import RecordInput
from server.cli.sessions import add_sessions_parser, main, run_sessions
from tests.support.captures import captured_call as call
from tests.support.captures import chat_response
from tests.support.procs import Proc, free_port

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def capture_dir(tmp_path):
    """Two rollouts: root-1 (two chained calls) with sub-agents sub-1 -> subsub and sub-2; root-2 alone."""
    directory = tmp_path / "captures"
    store = CaptureStore(directory)
    store.start()
    user = {"role": "user", "content": "hello"}
    calls = [
        call(
            "root-1",
            messages=[user],
            response=chat_response([1, 2], [3], "first"),
            captured_at="2026-01-01T00:00:01.000000+00:00",
        ),
        call(
            "root-1",
            messages=[user, {"role": "assistant", "content": "first"}, {"role": "user", "content": "more"}],
            response=chat_response([1, 2, 3, 4], [5], "second"),
            captured_at="2026-01-01T00:00:02.000000+00:00",
        ),
        call("sub-1", parent="root-1"),
        call("sub-2", parent="root-1"),
        call("subsub", parent="sub-1"),
        call("root-2"),
    ]
    for kwargs in calls:
        assert store.submit_call(RecordInput(**kwargs))
    store.close()
    return directory


def run(*argv):
    return main(["sessions", *argv])


def snapshot(directory: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in directory.rglob("*")}


# ---- against a capture directory -------------------------------------------------------------


def test_list_table(capture_dir, capsys):
    assert run("list", "--capture-dir", str(capture_dir)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "SESSION_ID",
        "PARENT",
        "RECORDS",
        "RUNS",
        "ID_FROM",
        "FIRST_CAPTURED_AT",
        "LAST_CAPTURED_AT",
    ]
    rows = {line.split()[0]: line.split()[1:4] for line in lines[1:]}
    assert rows == {
        "root-1": ["-", "2", "1"],
        "root-2": ["-", "1", "1"],
        "sub-1": ["root-1", "1", "1"],
        "sub-2": ["root-1", "1", "1"],
        "subsub": ["sub-1", "1", "1"],
    }


def test_list_json_and_filters(capture_dir, capsys):
    assert run("list", "--capture-dir", str(capture_dir), "--json", "--roots-only") == 0
    body = orjson.loads(capsys.readouterr().out)
    assert body["schema_version"] == 1
    assert [s["session_id"] for s in body["sessions"]] == ["root-1", "root-2"]
    assert run("list", "--capture-dir", str(capture_dir), "--json", "--parent", "root-1", "--limit", "1") == 0
    assert [s["session_id"] for s in orjson.loads(capsys.readouterr().out)["sessions"]] == ["sub-1"]


def test_list_empty_directory(tmp_path, capsys):
    assert run("list", "--capture-dir", str(tmp_path)) == 0
    assert capsys.readouterr().out.strip() == "no sessions"


def test_tree_text_and_json(capture_dir, capsys):
    assert run("tree", "root-1", "--capture-dir", str(capture_dir)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "root-1  (2 records)",
        "├── sub-1  (1 record)",
        "│   └── subsub  (1 record)",
        "└── sub-2  (1 record)",
    ]
    assert run("tree", "root-1", "--capture-dir", str(capture_dir), "--json") == 0
    tree = orjson.loads(capsys.readouterr().out)
    assert [c["session_id"] for c in tree["children"]] == ["sub-1", "sub-2"]
    assert tree["children"][0]["children"][0]["session_id"] == "subsub"


def test_show_prints_the_completions_envelope(capture_dir, capsys):
    assert run("show", "root-1", "--capture-dir", str(capture_dir)) == 0
    envelope = orjson.loads(capsys.readouterr().out)
    assert envelope["schema_version"] == 1
    assert envelope["session_id"] == "root-1"
    assert envelope["skipped"] == 0
    assert [r["generation_token_ids"] for r in envelope["completions"]] == [[3], [5]]


def test_not_found_and_usage_exit_codes(capture_dir, tmp_path, capsys):
    assert run("show", "nobody", "--capture-dir", str(capture_dir)) == 1
    assert run("tree", "nobody", "--capture-dir", str(capture_dir)) == 1
    assert run("rollout", "nobody", "--capture-dir", str(capture_dir)) == 1
    assert run("list", "--capture-dir", str(tmp_path / "does-not-exist")) == 1
    assert run("list", "--url", "http://127.0.0.1:9", "--capture-dir", str(capture_dir)) == 2  # two sources
    assert run("list", "--capture-dir", str(capture_dir), "--url", "http://127.0.0.1:9") == 2
    assert run("show", "../ etc", "--capture-dir", str(capture_dir)) == 2
    assert run("list", "--capture-dir", str(capture_dir), "--limit", "0") == 2
    with pytest.raises(SystemExit) as exc:
        run("tree", "--capture-dir", str(capture_dir))  # missing ID: argparse usage error
    assert exc.value.code == 2
    capsys.readouterr()


def test_unreachable_server_fails_cleanly(capsys):
    port = free_port()  # nothing listens there
    assert run("list", "--url", f"http://127.0.0.1:{port}", "--timeout", "2") == 1
    assert "cannot reach" in capsys.readouterr().err


def test_capture_dir_mode_is_read_only(capture_dir, capsys):
    before = snapshot(capture_dir)
    for argv in (("list",), ("tree", "root-1"), ("show", "root-1"), ("rollout", "root-1")):
        run(*argv, "--capture-dir", str(capture_dir))
    capsys.readouterr()
    assert snapshot(capture_dir) == before


def test_parser_plugs_into_a_cli(capture_dir, capsys):
    parser = argparse.ArgumentParser(prog="switchyard-model")
    subparsers = parser.add_subparsers(dest="command", required=True)
    subparsers.add_parser("serve")
    add_sessions_parser(subparsers)
    args = parser.parse_args(["sessions", "list", "--capture-dir", str(capture_dir)])
    assert args.func is run_sessions
    assert args.func(args) == 0
    capsys.readouterr()


@pytest.fixture
def fake_rollout(monkeypatch):
    seen = []

    def reconstruct_tree(session_id, load_records, children_of, *, allow_partial=True, lost_records=None):
        seen.append((session_id, allow_partial))
        if session_id == "root-2":
            raise RolloutError("record 0 has no usable tokens")
        return {
            "session_id": session_id,
            "n": len(load_records(session_id)),
            "subagents": [{"session_id": c} for c in children_of(session_id)],
        }

    monkeypatch.setattr(capture_sessions, "reconstruct_tree", reconstruct_tree)
    return seen


def test_export_writes_one_line_per_root_and_reports_failures(capture_dir, tmp_path, fake_rollout, capsys):
    out = tmp_path / "rollouts.jsonl"
    assert run("export", "--capture-dir", str(capture_dir), "--out", str(out), "--strict") == 1  # root-2 failed
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    subagents = [{"session_id": "sub-1"}, {"session_id": "sub-2"}]
    assert lines == [{"session_id": "root-1", "n": 2, "subagents": subagents, "dispatch": 1, "dispatches": 1}]
    assert fake_rollout == [("root-1", False), ("root-2", False)]
    err = capsys.readouterr().err
    assert "root-2" in err and "no usable tokens" in err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_rollout_and_export_with_the_real_reconstruction(capture_dir, tmp_path, capsys):
    assert run("rollout", "root-1", "--capture-dir", str(capture_dir), "--strict") == 0
    rollout = orjson.loads(capsys.readouterr().out)
    assert rollout["session_id"] == "root-1"
    assert len(rollout["record_uuids"]) == 2
    assert [s["session_id"] for s in rollout["subagents"]] == ["sub-1", "subsub", "sub-2"]
    out = tmp_path / "export.jsonl"
    assert run("export", "--capture-dir", str(capture_dir), "--out", str(out)) == 0
    exported = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["session_id"] for r in exported] == ["root-1", "root-2"]
    assert exported[0]["record_uuids"] == rollout["record_uuids"]


def test_export_includes_sessions_whose_parent_has_no_records(tmp_path, capsys):
    directory = tmp_path / "captures"
    store = CaptureStore(directory)
    store.start()
    for kwargs in (call("worker-1", parent="job-7"), call("worker-2", parent="job-7"), call("root-1")):
        assert store.submit_call(RecordInput(**kwargs))
    store.close()
    out = tmp_path / "rollouts.jsonl"
    assert run("export", "--capture-dir", str(directory), "--out", str(out)) == 0
    assert [orjson.loads(line)["session_id"] for line in out.read_bytes().splitlines()] == [
        "root-1",
        "worker-1",
        "worker-2",
    ]
    assert "exported 3 of 3 root sessions" in capsys.readouterr().err


def test_export_counts_sessions_no_root_reaches_and_fails(tmp_path, capsys):
    # A parent cycle (crafted, or two sessions naming each other): no root reaches either session.
    directory = tmp_path / "captures"
    store = CaptureStore(directory)
    store.start()
    for kwargs in (call("a", parent="b"), call("b", parent="a"), call("root-1")):
        assert store.submit_call(RecordInput(**kwargs))
    store.close()
    out = tmp_path / "rollouts.jsonl"
    assert run("export", "--capture-dir", str(directory), "--out", str(out)) == 1
    assert [orjson.loads(line)["session_id"] for line in out.read_bytes().splitlines()] == ["root-1"]
    err = capsys.readouterr().err
    assert "exported 1 of 1 root sessions" in err
    assert "2 sessions could not be exported" in err and "a, b" in err


# ---- against a live server ---------------------------------------------------------------------

SERVER_SCRIPT = """
import contextlib
import sys
import uvicorn
from server.capture.store import CaptureStore
from tests.support.session_apps import sessions_app

store = CaptureStore(sys.argv[1])


@contextlib.asynccontextmanager
async def lifespan(app):
    store.start()
    yield
    store.close()


app = sessions_app(store, lifespan=lifespan)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


@pytest.fixture
def live_server(capture_dir, tmp_path):
    script = tmp_path / "sessions_server.py"
    script.write_text(SERVER_SCRIPT)
    port = free_port()
    proc = Proc([sys.executable, str(script), str(capture_dir), str(port)], env={"PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/v1/sessions", timeout=30)
        yield url
    finally:
        proc.stop()


def test_server_and_directory_give_the_same_answers(live_server, capture_dir, capsys):
    for argv in (("list", "--json"), ("list",), ("tree", "root-1"), ("tree", "root-1", "--json"), ("show", "root-1")):
        assert run(*argv, "--url", live_server) == 0
        from_server = capsys.readouterr().out
        assert run(*argv, "--capture-dir", str(capture_dir)) == 0
        from_directory = capsys.readouterr().out
        assert from_server == from_directory, argv


def test_without_a_source_the_server_address_comes_from_the_settings(live_server, tmp_path, capsys):
    port = live_server.rsplit(":", 1)[1]
    config = tmp_path / "serve.yaml"
    # The same file `serve --config` reads (a wildcard bind is reached on loopback).
    config.write_text(f"host: 0.0.0.0\nport: {port}\ndeployment: demo\n")
    assert run("list", "--roots-only", "--json", "--config", str(config)) == 0
    assert [s["session_id"] for s in orjson.loads(capsys.readouterr().out)["sessions"]] == ["root-1", "root-2"]
    assert run("tree", "root-1", "--config", str(config)) == 0
    assert "sub-1" in capsys.readouterr().out


def test_without_any_source_the_default_address_is_the_serve_default(monkeypatch, capsys):
    seen = []

    class Recorder:
        def __init__(self, url, timeout):
            seen.append(url)

        def list_sessions(self, **kwargs):
            return []

        def close(self):
            pass

    monkeypatch.setattr("server.cli.sessions.ServerSource", Recorder)
    assert run("list") == 0
    assert seen == ["http://127.0.0.1:8080"]
    capsys.readouterr()


def test_server_not_found_and_v1_suffix(live_server, capsys):
    assert run("show", "nobody", "--url", live_server) == 1
    assert "unknown session" in capsys.readouterr().err
    assert run("list", "--url", live_server + "/v1/", "--roots-only", "--json") == 0
    assert [s["session_id"] for s in orjson.loads(capsys.readouterr().out)["sessions"]] == ["root-1", "root-2"]


def test_server_rollout_and_export(live_server, capture_dir, tmp_path, capsys):
    assert run("rollout", "root-1", "--url", live_server, "--strict") == 0
    from_server = orjson.loads(capsys.readouterr().out)
    assert run("rollout", "root-1", "--capture-dir", str(capture_dir), "--strict") == 0
    assert from_server == orjson.loads(capsys.readouterr().out)
    out = tmp_path / "export.jsonl"
    assert run("export", "--url", live_server, "--out", str(out)) == 0
    assert [orjson.loads(line)["session_id"] for line in out.read_bytes().splitlines()] == ["root-1", "root-2"]
    capsys.readouterr()


def test_export_to_stdout_from_a_cli_process(live_server):
    # A real process writing to a pipe, the way a trainer would read it.
    done = subprocess.run(
        [sys.executable, "-m", "server.cli.sessions", "sessions", "export", "--url", live_server],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [orjson.loads(line)["session_id"] for line in done.stdout.splitlines()] == ["root-1", "root-2"]
    assert b"exported 2 of 2" in done.stderr


@pytest.fixture
def broken_capture_dir(tmp_path):
    """A root that compacts once (two chains) with a whole sub-agent, written with the store's writer."""
    from tests.support.scripted_sessions import scripted

    directory = tmp_path / "broken-captures"
    store = CaptureStore(directory)
    store.start()
    for record in scripted("root-c", ["extend", "compact"]) + scripted("kid-c", ["extend"], parent="root-c"):
        assert store.submit(record)
    assert store.flush(10)
    store.close()
    return directory


def test_chains_and_the_chains_export_hold_every_call(broken_capture_dir, tmp_path, capsys):
    assert run("chains", "root-c", "--capture-dir", str(broken_capture_dir)) == 0
    body = orjson.loads(capsys.readouterr().out)
    assert [len(chain["record_uuids"]) for chain in body["chains"]] == [2, 1]
    assert body["breaks"][0]["kind"] == "compacted" and body["trainable_fraction"] == 1.0
    out = tmp_path / "chains.jsonl"
    assert run("export", "--chains", "--capture-dir", str(broken_capture_dir), "--out", str(out)) == 0
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [(line["session_id"], line["root_session_id"], line["position"]) for line in lines] == [
        ("root-c", "root-c", 0),
        ("root-c", "root-c", 1),
        ("kid-c", "root-c", 0),
    ]
    assert all("run" in line and line["generation_mask"] for line in lines)
    # The plain export is still one masked rollout per root: the chains are what keeps the tokens.
    assert run("export", "--capture-dir", str(broken_capture_dir), "--out", str(out)) == 0
    (rollout,) = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert rollout["mask_sample"] is True and rollout["record_uuids"] == body["chains"][0]["record_uuids"]


def test_chains_from_a_server_equal_chains_from_the_directory(tmp_path, broken_capture_dir, capsys):
    script = tmp_path / "sessions_server.py"
    script.write_text(SERVER_SCRIPT)
    port = free_port()
    proc = Proc([sys.executable, str(script), str(broken_capture_dir), str(port)], env={"PYTHONPATH": str(REPO)})
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/v1/sessions", timeout=30)
        assert run("chains", "root-c", "--url", f"http://127.0.0.1:{port}") == 0
        from_server = orjson.loads(capsys.readouterr().out)
    finally:
        proc.stop()
    assert run("chains", "root-c", "--capture-dir", str(broken_capture_dir)) == 0
    assert from_server == orjson.loads(capsys.readouterr().out)
