"""A session whose every record was lost to capture failures (a full disk) ran: its rollout, chains,
records, tree, list row and timeline say `capture_failed`, never 404 ("never ran")."""

from __future__ import annotations

import orjson
import pytest
from starlette.testclient import TestClient

from server.capture.rollout import reconstruct_envelope
from server.capture.store import CaptureStore, session_dir_name
from server.capture.write.marks import LostRecords
from server.cli.sessions import main
from server.viewer.offline import create_view_app
from tests.support.captures import captured_call as call
from tests.support.captures import submit_all as add
from tests.support.session_apps import sessions_app

LOST = "all-lost"
DISK_FULL = "OSError: [Errno 28] No space left on device"


@pytest.fixture
def store(tmp_path):
    capture = CaptureStore(tmp_path / "captures")
    capture.start()
    yield capture
    capture.close()


@pytest.fixture
def client(store):
    with TestClient(sessions_app(store)) as test_client:
        yield test_client


def assert_lost_rollout(body: dict) -> None:
    assert body["session_id"] == LOST
    assert body["partial_reason"] == "capture_failed" and body["mask_sample"] is True
    assert body["input"] == [] and body["output"] == [] and body["record_uuids"] == [] and body["subagents"] == []


def test_a_session_that_lost_every_record_answers_capture_failed_while_the_disk_is_still_full(client, store):
    add(store, call("kept"))
    store.writer.lost.add(LOST, session_dir_name(LOST), DISK_FULL)  # the mark is not on disk yet

    rollout = client.get(f"/v1/sessions/{LOST}/rollout")
    assert rollout.status_code == 200, rollout.text
    assert_lost_rollout(rollout.json())
    strict = client.get(f"/v1/sessions/{LOST}/rollout", params={"allow_partial": "false"})
    assert strict.status_code == 422 and "capture" in strict.json()["error"]["message"]

    envelope = client.get(f"/v1/sessions/{LOST}/completions")
    assert envelope.status_code == 200, envelope.text
    assert envelope.json()["completions"] == [] and envelope.json()["lost_records"] == 1
    # A trainer that rebuilds from the records (as Gym does) reaches the same answer.
    assert_lost_rollout({**reconstruct_envelope(envelope.json(), LOST), "subagents": []})

    tree = client.get(f"/v1/sessions/{LOST}/tree")
    assert tree.status_code == 200, tree.text
    assert tree.json()["record_count"] == 0 and tree.json()["lost_records"] == 1 and tree.json()["children"] == []

    chains = client.get(f"/v1/sessions/{LOST}/chains")
    assert chains.status_code == 200, chains.text
    body = chains.json()
    assert body["chains"] == [] and body["lost_records"] == 1 and body["subagents"] == []
    assert body["rollout"]["partial_reason"] == "capture_failed" and body["rollout"]["mask_sample"] is True

    # The control: a session that never ran is still unknown.
    for path in ("rollout", "chains", "completions", "tree"):
        assert client.get(f"/v1/sessions/never-ran/{path}").status_code == 404


def test_once_its_mark_is_on_disk_the_session_is_listed_with_no_records(client, store):
    add(store, call("kept"))
    store.writer.lost.add(LOST, session_dir_name(LOST), DISK_FULL)
    assert store.writer.lost.write_pending() is None

    rows = {row["session_id"]: row for row in client.get("/v1/sessions").json()["sessions"]}
    assert set(rows) == {"kept", LOST}
    assert rows[LOST]["record_count"] == 0
    summarised = client.get("/v1/sessions", params={"summary": "true"}).json()["sessions"]
    summary = next(row["summary"] for row in summarised if row["session_id"] == LOST)
    assert summary["rollout"] == "partial" and summary["partial_reason"] == "capture_failed"
    assert summary["mask_sample"] is True and summary["calls"] == 0
    masked = client.get("/v1/sessions", params={"status": "masked"}).json()["sessions"]
    assert [row["session_id"] for row in masked] == [LOST]
    assert_lost_rollout(client.get(f"/v1/sessions/{LOST}/rollout").json())
    assert client.get(f"/v1/sessions/{LOST}/tree").json()["lost_records"] == 1


def test_the_viewer_shows_it_from_the_mark_a_server_left(tmp_path):
    capture_dir = tmp_path / "captures"
    writer = CaptureStore(capture_dir)
    writer.start()
    add(writer, call("kept"))
    writer.close()
    marks = LostRecords(capture_dir / "sessions")
    marks.add(LOST, session_dir_name(LOST), DISK_FULL)
    assert marks.write_pending() is None
    # A mark whose id is not the one its directory is named after speaks for no session.
    forged = LostRecords(capture_dir / "sessions")
    forged.add("someone-else", session_dir_name("forged-dir"), DISK_FULL)
    assert forged.write_pending() is None

    with TestClient(create_view_app(capture_dir), base_url="http://127.0.0.1") as viewer:
        listed = [row["session_id"] for row in viewer.get("/v1/sessions").json()["sessions"]]
        assert listed == ["all-lost", "kept"]
        timeline = viewer.get(f"/v1/sessions/{LOST}/timeline")
        assert timeline.status_code == 200, timeline.text
        body = timeline.json()
        assert body["calls"] == [] and body["rollout"]["partial_reason"] == "capture_failed"
        assert body["rollout"]["mask_sample"] is True and body["summary"]["mask_sample"] is True
        assert_lost_rollout(viewer.get(f"/v1/sessions/{LOST}/rollout").json())
        assert viewer.get("/v1/sessions/someone-else/timeline").status_code == 404


def test_the_sessions_command_reads_it_from_the_capture_directory_too(tmp_path, capsys):
    capture_dir = tmp_path / "captures"
    marks = LostRecords(capture_dir / "sessions")
    marks.add(LOST, session_dir_name(LOST), DISK_FULL)
    assert marks.write_pending() is None
    assert main(["sessions", "rollout", LOST, "--capture-dir", str(capture_dir)]) == 0
    assert_lost_rollout(orjson.loads(capsys.readouterr().out))
    assert main(["sessions", "show", LOST, "--capture-dir", str(capture_dir)]) == 0
    assert orjson.loads(capsys.readouterr().out)["lost_records"] == 1
    assert main(["sessions", "tree", LOST, "--capture-dir", str(capture_dir), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["record_count"] == 0
    assert main(["sessions", "rollout", "never-ran", "--capture-dir", str(capture_dir)]) == 1
