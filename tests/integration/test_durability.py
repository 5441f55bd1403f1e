"""An acknowledged call is never lost: kill -9 during a burst, and a full, read-only or refusing disk."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.captures import records_in
from tests.support.procs import wait_for
from tests.support.stack import launch_stack

KINDS = ("chat", "chat-stream", "responses", "responses-stream")


def settings_file(tmp_path: Path, **settings) -> str:
    path = tmp_path / f"settings-{len(list(tmp_path.glob('settings-*')))}.yaml"
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def one_call(
    client: httpx.Client, v1: str, kind: str, session_id: str, request_id: str, text: str
) -> tuple[bool, str | None]:
    """One correlated call: True only when the client got the whole answer (the stream's last event too),
    and the Responses id the client was given (None for chat)."""
    headers = {"x-session-id": session_id, "x-request-id": request_id}
    stream = kind.endswith("stream")
    if kind.startswith("chat"):
        url, body = v1 + "/chat/completions", {"model": "x", "messages": [{"role": "user", "content": text}]}
        last = "data: [DONE]"
    else:
        url, body = v1 + "/responses", {"model": "x", "input": text}
        last = '"type":"response.completed"'
    body["stream"] = stream
    responses = kind.startswith("responses")
    if not stream:
        response = client.post(url, json=body, headers=headers)
        response.read()
        answer_id = response.json().get("id") if response.status_code == 200 else None
        return bool(answer_id), answer_id if responses else None
    with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            return False, None
        seen = False
        answer_id = None
        for line in response.iter_lines():
            if last.startswith('"') and last in line.replace(" ", ""):
                seen, answer_id = True, json.loads(line.removeprefix("data:"))["response"]["id"]
            seen = seen or line == last
        return seen, answer_id


def records_on_disk(capture_dir: Path) -> dict[str, dict]:
    """Every record a reader can see, rebuilt (a torn file or a broken delta fails the test here), by request id."""
    records, skipped = records_in(capture_dir)
    assert skipped == 0
    assert not [r for r in records if (r["invalid_reason"] or "").startswith("delta record")]  # no base lost
    return {record["request_id"]: record for record in records}


def stored_response_ids(capture_dir: Path) -> set[str]:
    """Every response id committed to the state database (a fresh connection recovers its write-ahead log)."""
    with sqlite3.connect(capture_dir / "state.sqlite3") as db:
        return {row[0] for row in db.execute("SELECT id FROM responses")}


def burst_then_kill(
    mock_upstream: str,
    capture_dir: Path,
    config: str,
    answered: set[str] | None = None,
    tokens: int = 40,
    env: dict[str, str] | None = None,
) -> tuple[set[str], dict[str, dict]]:
    """Eight threads send correlated calls of every kind; once 120 have completed, the thread whose
    call completes next sends the server SIGKILL at once: the moment a record handed over after the
    answer is still in the writer's queue. Returns the completed calls and the records on disk; the
    ids of the completed Responses calls are added to `answered`."""
    chain = launch_stack(mock_upstream, capture_dir, "--config", config, env=env)
    completed: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()
    killed = threading.Event()
    ids = itertools.count()

    def load(worker: int) -> None:
        with httpx.Client(timeout=30) as client:
            for i in itertools.count():
                if stop.is_set():
                    return
                request_id = f"burst-{worker}-{next(ids)}"
                kind = KINDS[(worker + i) % len(KINDS)]
                try:
                    ok, answer_id = one_call(
                        client, chain.v1, kind, f"burst-{worker}", request_id, f"call {i} [[mock:tokens {tokens}]]"
                    )
                except (httpx.HTTPError, json.JSONDecodeError):
                    return  # the server is gone: this call did not complete
                if ok:
                    with lock:
                        completed.add(request_id)
                        if answer_id is not None and answered is not None:
                            answered.add(answer_id)
                        if len(completed) >= 120 and not killed.is_set():
                            os.kill(chain.proc.pid, signal.SIGKILL)
                            killed.set()

    workers = [threading.Thread(target=load, args=(w,)) for w in range(8)]
    for thread in workers:
        thread.start()
    try:
        assert killed.wait(120), "the burst never got going"
    finally:
        stop.set()
        for thread in workers:
            thread.join(60)
        chain.proc.stop()
    with lock:
        return set(completed), records_on_disk(capture_dir)


@pytest.mark.parametrize("fsync, encoding", [("batch", "full"), ("batch", "delta"), ("always", "delta")])
def test_sigkill_mid_burst_loses_no_completed_call(mock_upstream, tmp_path, fsync, encoding):
    capture = tmp_path / "captures"
    answered: set[str] = set()
    config = settings_file(tmp_path, capture_fsync=fsync, capture_encoding=encoding)
    completed, records = burst_then_kill(mock_upstream, capture, config, answered)
    missing = sorted(completed - set(records))
    print(
        f"capture_fsync {fsync}, {encoding}: {len(completed)} completed calls, {len(records)} records, {len(missing)} missing"
    )
    assert not missing, f"{len(missing)} of {len(completed)} completed calls have no record: {missing[:5]}"
    assert (encoding == "delta") == any(capture.rglob("*.delta"))  # the kill met the encoding under test
    # Every Responses answer the clients completed was stored (batched commits) before it ended.
    unstored = sorted(answered - stored_response_ids(capture))
    assert answered and not unstored, f"{len(unstored)} of {len(answered)} answered responses not stored"
    assert all(r["status"] in ("completed", "partial") for r in records.values())
    # The next server on the directory serves every one of them, records and stored responses.
    after = launch_stack(mock_upstream, capture)
    try:
        served = set()
        for worker in range(8):
            reply = httpx.get(f"{after.url}/v1/sessions/burst-{worker}/completions", timeout=30)
            served |= {r["request_id"] for r in reply.json().get("completions", [])}
        assert completed <= served
        assert retrievable(after, answered) == answered
    finally:
        after.proc.stop()


def retrievable(chain, response_ids: set[str]) -> set[str]:
    """The ids `GET /v1/responses/{id}` serves."""
    with httpx.Client(timeout=30) as client:
        return {i for i in response_ids if client.get(f"{chain.v1}/responses/{i}").status_code == 200}


# Loaded by the server under test in the control below (a `sitecustomize` on its PYTHONPATH), not a
# setting: `put` hands the response to the writer and returns at once, so the answer goes out before
# its batch commits, and each commit is slowed so the kill lands while answered responses wait in it.
_ANSWER_BEFORE_COMMIT = """
import time

from server.batching import Waiter
from server.stateful import writer

async def put(self, put):
    self._queue.put([(put, Waiter.here())])
    return True

commit = writer.StoreWriter._commit

def slow_commit(self, jobs):
    time.sleep(0.1)
    commit(self, jobs)

writer.StoreWriter.put = put
writer.StoreWriter._commit = slow_commit
"""


def answer_before_commit_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "answer-before-commit"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_ANSWER_BEFORE_COMMIT)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


def test_sigkill_mid_burst_loses_answered_responses_when_the_answer_does_not_wait_for_the_commit(
    mock_upstream, tmp_path
):
    """Negative control for the stored-response checks above: answering before the batch commits
    loses responses the clients saw complete, and a follow-up sent the instant an answer ends misses."""
    env = answer_before_commit_env(tmp_path)
    chain = launch_stack(mock_upstream, tmp_path / "follow-up", env=env)
    try:
        with httpx.Client(timeout=30) as client:
            missed = 0
            for i in range(10):
                first = client.post(chain.v1 + "/responses", json={"model": "x", "input": f"first {i}"}).json()
                follow = client.post(
                    chain.v1 + "/responses",
                    json={"model": "x", "input": f"second {i}", "previous_response_id": first["id"]},
                )
                missed += follow.status_code == 404
        assert missed, "every follow-up found its response even though nothing waited for the commit"
    finally:
        chain.proc.stop()

    answered: set[str] = set()
    config = settings_file(tmp_path)
    capture = tmp_path / "captures"
    burst_then_kill(mock_upstream, capture, config, answered, env=env)
    lost = answered - stored_response_ids(capture)
    print(f"answer before commit: {len(lost)} of {len(answered)} answered responses lost")
    assert answered and lost, "every answered response was stored even though nothing waited for the commit"
    after = launch_stack(mock_upstream, capture)
    try:
        assert retrievable(after, answered) == answered - lost  # what the server serves is what was committed
    finally:
        after.proc.stop()


def test_sigkill_mid_burst_loses_completed_calls_when_the_answer_does_not_wait(mock_upstream, tmp_path):
    """Negative control: a fire-and-forget hand-off (record queued after the answer) fails the test above."""
    config = settings_file(tmp_path, capture_before_answer=False, capture_fsync="always")
    # The loss is a race (the kill must land while completed calls' records are still queued), so
    # the control's records are long (more for the writer to do after each answer) and it gets
    # up to five bursts (about one in five loses nothing); one loss shows the test above can fail.
    for attempt in range(5):
        completed, records = burst_then_kill(mock_upstream, tmp_path / f"captures-{attempt}", config, tokens=1000)
        lost = completed - set(records)
        print(f"fire-and-forget hand-off, burst {attempt + 1}: {len(lost)} of {len(completed)} completed calls lost")
        if lost:
            break
    assert lost, "every completed call had its record in five bursts even without waiting"


# ---- a disk that fills up, turns read-only, or refuses -----------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs, unmounted afterwards (needs root)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path) -> Path:
    """Take every free byte of the filesystem under `directory` with one file; returns it."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def chat(chain, session_id: str, text: str = "hello", stream: bool = False) -> httpx.Response:
    headers = {"x-session-id": session_id} if session_id else {}
    body = {"model": "x", "stream": stream, "messages": [{"role": "user", "content": text}]}
    return httpx.post(chain.v1 + "/chat/completions", json=body, headers=headers, timeout=30)


class Conversation:
    """A multi-turn chat whose every call extends the last: a whole rollout unless a record is lost."""

    def __init__(self, chain, session_id: str) -> None:
        self.chain, self.session_id, self.messages = chain, session_id, []

    def say(self, text: str) -> httpx.Response:
        self.messages.append({"role": "user", "content": text})
        body = {"model": "x", "messages": self.messages}
        reply = httpx.post(
            self.chain.v1 + "/chat/completions",
            json=body,
            headers={"x-session-id": self.session_id},
            timeout=30,
        )
        if reply.status_code == 200:
            self.messages.append(reply.json()["choices"][0]["message"])
        else:
            self.messages.pop()
        return reply


def capture_health(chain) -> dict:
    return httpx.get(chain.url + "/health", timeout=10).json()["capture"]


def rollout(chain, session_id: str) -> dict:
    return httpx.get(f"{chain.url}/v1/sessions/{session_id}/rollout", timeout=30).json()


def test_a_full_disk_is_loud_marks_the_session_and_recovers(mock_upstream, small_tmpfs, tmp_path):
    capture = small_tmpfs / "captures"
    chain = launch_stack(mock_upstream, capture)
    try:
        talk = Conversation(chain, "fills-up")
        assert talk.say("turn one").status_code == 200  # a whole first record
        filler = fill(small_tmpfs)
        reply = talk.say("turn two: its record cannot be written")
        assert reply.status_code == 200  # served anyway (capture_on_failure: serve)
        assert wait_for(lambda: capture_health(chain)["status"] == "degraded")
        health = capture_health(chain)
        assert health["status"] == "degraded" and health["failed"] >= 1 and health["degraded_reason"]
        assert health["sessions_with_lost_records"] == 1
        # The session has one whole record (a whole rollout by itself, see the control below), and
        # its rollout must not look whole.
        doc = rollout(chain, "fills-up")
        assert doc["partial_reason"] == "capture_failed" and doc["mask_sample"] is True
        assert "capture failed" in chain.proc.output() or "capture degraded" in chain.proc.output()

        filler.unlink()  # space returns: the probe writes the mark and capture recovers by itself
        assert wait_for(lambda: capture_health(chain)["status"] == "ok")
        mark = capture / "sessions" / hashlib.sha256(b"fills-up").hexdigest() / "capture-failed.mark"
        assert json.loads(mark.read_bytes())["lost_records"] == 1
        assert talk.say("turn three").status_code == 200
        assert capture_health(chain)["written"] >= 2
        assert rollout(chain, "fills-up")["partial_reason"] == "capture_failed"
    finally:
        chain.proc.stop()
    # The mark survives a restart.
    again = launch_stack(mock_upstream, capture)
    try:
        doc = rollout(again, "fills-up")
        assert doc["partial_reason"] == "capture_failed" and doc["mask_sample"] is True
    finally:
        again.proc.stop()


def test_a_whole_session_stays_whole_without_a_failure(chain):
    """Control for the test above: its first call alone, and its whole conversation, give rollouts
    that look whole, so only the lost record can make that rollout partial."""
    talk = Conversation(chain, "never-fails")
    assert talk.say("turn one").status_code == 200
    doc = rollout(chain, "never-fails")
    assert doc["partial_reason"] is None and doc["mask_sample"] is False
    for turn in ("turn two", "turn three"):
        assert talk.say(turn).status_code == 200
    doc = rollout(chain, "never-fails")
    assert doc["partial_reason"] is None and doc["mask_sample"] is False and len(doc["record_uuids"]) == 3


def test_a_read_only_capture_dir_degrades_then_recovers(mock_upstream, small_tmpfs, tmp_path):
    # No stored-responses database in the capture directory: its open writable file would keep the
    # filesystem from being remounted read-only.
    config = settings_file(tmp_path, response_store=False)
    chain = launch_stack(mock_upstream, small_tmpfs / "captures", "--config", config)
    try:
        assert Conversation(chain, "ro").say("first").status_code == 200
        subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
        assert chat(chain, "ro", "second", stream=True).status_code == 200
        assert wait_for(lambda: capture_health(chain)["status"] == "degraded")
        subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
        assert wait_for(lambda: capture_health(chain)["status"] == "ok")
        assert rollout(chain, "ro")["partial_reason"] == "capture_failed"
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=False)
        chain.proc.stop()


def test_refuse_answers_503_while_capture_cannot_write_and_recovers(mock_upstream, small_tmpfs, tmp_path):
    config = settings_file(tmp_path, capture_on_failure="refuse")
    chain = launch_stack(mock_upstream, small_tmpfs / "captures", "--config", config)
    try:
        assert chat(chain, "strict").status_code == 200
        filler = fill(small_tmpfs)
        first = chat(chain, "strict", "its own record fails")
        assert first.status_code == 503
        assert first.json()["error"]["code"] == "capture_unavailable"
        refused = chat(chain, "strict", "refused before it goes upstream")
        assert refused.status_code == 503 and set(refused.json()["error"]) >= {"message", "type", "param", "code"}
        # A call without an id is captured too (its session inferred): refused the same way.
        assert chat(chain, "", "inferred sessions are captured: refused").status_code == 503
        filler.unlink()
        assert wait_for(lambda: capture_health(chain)["status"] == "ok")
        assert chat(chain, "strict", "back").status_code == 200
    finally:
        chain.proc.stop()
