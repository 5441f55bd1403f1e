"""`serve --workers 2`: every worker answers about every session as the offline reader does.

Each call of the scripted agent opens a new connection, so the kernel hands consecutive calls of one
session to either worker; the `x-switchyard-model-worker` header says which. The negative control
(two writers that trust their memory disagree with the reader) is in tests/unit/capture/test_index.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import httpx
import orjson
import psutil
import yaml

from server.capture.store import CaptureStore
from server.cli.workers import READY_DIR_PREFIX
from server.files import process_temp_dir
from server.switchyard import profiles
from tests.support import scripted_agent
from tests.support.procs import Proc, wait_for

WORKER = scripted_agent.WORKER_HEADER


def start_workers(tmp_path, mock_upstream, workers: int = 2, env=None, **settings) -> tuple[Proc, str]:
    port_file = tmp_path / "port"
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(settings))
    proc = Proc(
        [sys.executable, "-m", "server.cli", "serve", "--deployment", "demo", "--port", "0", "--config", str(config)]
        + ["--port-file", str(port_file), "--workers", str(workers), "--capture-dir", str(tmp_path / "capture")],
        env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1", **(env or {})},
    )
    wait_for(lambda: port_file.exists() or proc.popen.poll() is not None, 180, interval=0.1)
    assert port_file.exists() and proc.popen.poll() is None, proc.output()[-3000:]
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def from_each_worker(method: str, url: str, workers: int = 2, tries: int = 400) -> dict[str, httpx.Response]:
    """Repeat a request on fresh connections until every worker has answered it once."""
    answers: dict[str, httpx.Response] = {}
    for _ in range(tries):
        response = httpx.request(method, url, headers={"connection": "close"}, timeout=60)
        answers.setdefault(response.headers[WORKER], response)
        if len(answers) == workers:
            return answers
    raise AssertionError(f"only workers {sorted(answers)} answered {url} in {tries} tries")


def offline(*args: str, capture_dir) -> dict:
    """`switchyard-model sessions ... --capture-dir`: the reader that only knows the disk."""
    out = subprocess.run(
        [sys.executable, "-m", "server.cli", "sessions", *args, "--capture-dir", str(capture_dir)],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return orjson.loads(out.stdout)


def wait_for_records(capture_dir, count: int, timeout: float = 60.0) -> None:
    """Records are written after the answer; wait until all `count` are on disk."""

    def written() -> int:
        reader = CaptureStore.open_read_only(capture_dir)
        return sum(s["record_count"] for s in reader.list_sessions(limit=100000))

    wait_for(lambda: written() >= count, timeout, interval=0.1)
    assert written() == count


def test_every_worker_answers_like_the_offline_reader(tmp_path, mock_upstream):
    # No periodic full revalidation during the test: what one worker wrote or deleted reaches the
    # other through the change journal alone (the control without it is in test_a_write_by_another_process...).
    proc, url = start_workers(tmp_path, mock_upstream, capture_index_rescan_s=3600)
    capture = tmp_path / "capture"
    try:
        children_pids = {p.pid for p in psutil.Process(proc.pid).children()}
        spread, runs = [], 0
        while len(spread) < 2 and runs < 20:
            result = scripted_agent.run(url + "/v1", f"spread-{runs}")
            runs += 1
            if len(set(result["served_by"])) == 2:  # this rollout's calls went to both workers
                spread.append(result["rollout_id"])
        assert spread, "the kernel never spread one rollout's calls over both workers"
        wait_for_records(capture, runs * scripted_agent.CALLS_PER_ROLLOUT)

        listing = offline("list", "--json", capture_dir=capture)["sessions"]
        assert len(listing) == 2 * runs
        answers = from_each_worker("GET", url + "/v1/sessions?limit=10000")
        assert {int(pid) for pid in answers} <= children_pids  # two distinct worker processes answered
        for response in answers.values():
            assert response.json()["sessions"] == listing
        # One `serve` is one server run, whichever worker wrote: a session spread over both workers
        # lists one run, and every worker reports the same id.
        assert len({tuple(s["runs"]) for s in listing}) == 1 and len(listing[0]["runs"]) == 1
        health = from_each_worker("GET", url + "/health")
        assert {r.json()["capture"]["server_run"] for r in health.values()} == set(listing[0]["runs"])

        for session_id in spread:
            tree = offline("tree", session_id, "--json", capture_dir=capture)
            assert [child["session_id"] for child in tree["children"]] == [f"{session_id}-sub"]
            rollout = offline("rollout", session_id, capture_dir=capture)
            assert len(rollout["subagents"]) == 1 and rollout["mask_sample"] is False
            completions = offline("show", session_id, capture_dir=capture)
            children = offline("list", "--json", "--parent", session_id, capture_dir=capture)["sessions"]
            for response in from_each_worker("GET", f"{url}/v1/sessions/{session_id}/tree").values():
                assert response.json() == tree
            for response in from_each_worker("GET", f"{url}/v1/sessions/{session_id}/rollout").values():
                assert response.json() == rollout
            for response in from_each_worker("GET", f"{url}/v1/sessions/{session_id}/completions").values():
                assert response.json()["completions"] == completions["completions"]
            for response in from_each_worker("GET", f"{url}/v1/sessions?parent={session_id}").values():
                assert response.json()["sessions"] == children

        # A DELETE through one worker is seen by every worker at once.
        doomed = f"{spread[0]}-sub"
        deleted = httpx.delete(f"{url}/v1/sessions/{doomed}", timeout=60)
        assert deleted.status_code == 200 and deleted.json()["records"] == 2
        listing = offline("list", "--json", capture_dir=capture)["sessions"]
        assert doomed not in [s["session_id"] for s in listing]
        for response in from_each_worker("GET", url + "/v1/sessions?limit=10000").values():
            assert response.json()["sessions"] == listing
        for response in from_each_worker("GET", f"{url}/v1/sessions/{doomed}/completions").values():
            assert response.status_code == 404
        for response in from_each_worker("GET", f"{url}/v1/sessions/{spread[0]}/tree").values():
            assert response.json()["children"] == []
    finally:
        children = psutil.Process(proc.pid).children(recursive=True)
        assert proc.stop() == 0, proc.output()[-3000:]
    assert "earlier server run" not in proc.output()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], f"left running after the server stopped: {alive}"


def test_a_killed_supervisor_takes_its_workers_and_switchyard_with_it(tmp_path, mock_upstream, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc, url = start_workers(tmp_path, mock_upstream, env={"TMPDIR": str(temp)})
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 3  # two workers and the Switchyard process (and the resource tracker)
    os.kill(proc.pid, 9)
    proc.popen.wait(10)
    _, alive = psutil.wait_procs(children, timeout=60)
    assert alive == [], f"outlived their parent: {[p.cmdline() for p in alive]}"
    proc.stop()
    # What it could not remove (the workers' ready folder; Switchyard's deployment copy and stderr)
    # is named after its pid, so the next server to make such a folder removes it.
    left = sorted(path.name for path in temp.iterdir())
    prefixes = (READY_DIR_PREFIX, profiles.PRIVATE_DIR_PREFIX)
    assert left and all(name.startswith(tuple(f"{p}{proc.pid}-" for p in prefixes)) for name in left), left
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for prefix in prefixes:
        shutil.rmtree(process_temp_dir(prefix))
    assert list(temp.iterdir()) == []


# Writes one record through a store in this process, journaling or not (as a server before the journal).
WRITER = """
import sys
from server.capture.store import CaptureStore
from server.capture.write.record import RecordInput
from tests.support.captures import captured_call as call
store = CaptureStore(sys.argv[1], change_journal=sys.argv[3] == "journal")
store.start()
assert store.submit_call(RecordInput(**call(sys.argv[2])))
store.close()
"""


def write_from_another_process(capture_dir, session_id: str, how: str) -> None:
    subprocess.run([sys.executable, "-c", WRITER, str(capture_dir), session_id, how], check=True, timeout=120)


def test_a_write_by_another_process_is_seen_through_the_journal(tmp_path):
    """With no periodic full revalidation, the journal alone makes another process's record visible;
    the negative control (a writer that does not append) stays unseen until a full revalidation."""
    reader = CaptureStore(tmp_path, full_revalidation_s=1e9)
    reader.start()
    try:
        assert reader.list_sessions() == []
        write_from_another_process(tmp_path, "journaled", "journal")
        assert [s["session_id"] for s in reader.list_sessions()] == ["journaled"]
        write_from_another_process(tmp_path, "unjournaled", "no-journal")
        assert [s["session_id"] for s in reader.list_sessions()] == ["journaled"]
        on_disk = CaptureStore.open_read_only(tmp_path).list_sessions()
        assert [s["session_id"] for s in on_disk] == ["journaled", "unjournaled"]
        assert reader._index.full_revalidations == 1  # the one at start
    finally:
        reader.close()


def test_the_runs_condition_files_are_written_once_by_the_supervisor(tmp_path, mock_upstream):
    """Not once per worker, each overwriting the last and calling the Switchyard they share `attached`."""
    condition = tmp_path / "condition"
    proc, url = start_workers(tmp_path, mock_upstream, condition_dir=str(condition))
    try:
        manifest = orjson.loads((condition / "switchyard-condition.json").read_bytes())
        assert manifest["mode"] == "hosted" and manifest["server_mode"] == "launch-hosted"
        assert manifest["route"] == "demo" and manifest["deployment_path"].endswith("demo.toml")
        assert manifest["nemo_switchyard_version"] is not None and manifest["deployment_toml"]
        reply = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200
    finally:
        proc.stop(timeout=60)
    output = proc.output()
    assert output.count("condition manifest written to") == 1, output[-3000:]
    assert output.count("Switchyard stats written to") == 1, output[-3000:]
    stats = orjson.loads((condition / "switchyard-stats.json").read_bytes())
    assert stats["mode"] == "hosted" and stats["stats"]["models"]["mock-model"]["calls"] == 1
