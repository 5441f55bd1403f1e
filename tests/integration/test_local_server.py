"""LocalServer on real processes: one `serve` child per rollout, its lifecycle, and collect()."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import httpx
import orjson
import psutil
import pytest

from server.capture.store import session_dir_name
from server.spawn import LocalServer, ServerStartError
from tests.support import scripted_agent
from tests.support.procs import wait_for


def demo_server(tmp_path, mock_upstream, **kwargs) -> LocalServer:
    return LocalServer(
        deployment="demo",
        capture_dir=tmp_path / "capture",
        env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"},
        **kwargs,
    )


def wait_gone(pid: int, timeout: float = 60.0) -> bool:
    """Whether `pid` has exited (or is a zombie) within `timeout`."""

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return bool(wait_for(gone, timeout, interval=0.1))


def test_a_rollout_through_its_own_server_comes_back_whole(tmp_path, mock_upstream):
    with demo_server(tmp_path, mock_upstream) as server:
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        pid = server.pid
        served = scripted_agent.run(server.base_url, "solo")
    assert len(served["served_by"]) == scripted_agent.CALLS_PER_ROLLOUT
    assert wait_gone(pid, timeout=0.5)  # stop() returned only after the child was gone
    result = server.collect()
    assert result["errors"] == []
    [rollout] = result["rollouts"]
    assert rollout["session_id"] == "solo" and rollout["mask_sample"] is False
    assert [sub["session_id"] for sub in rollout["subagents"]] == ["solo-sub"]
    assert len(rollout["record_uuids"]) == 2 and len(rollout["subagents"][0]["record_uuids"]) == 2
    generated = [item for item in rollout["output"] if "generation_token_ids" in item]
    assert len(generated) == 2 and all(item["generation_token_ids"] for item in generated)


def test_a_broken_rollout_is_a_masked_sample_with_its_reason_not_an_exception(tmp_path, mock_upstream):
    with demo_server(tmp_path, mock_upstream) as server:
        url = server.base_url + "/chat/completions"
        headers = {"x-session-id": "drifted"}
        messages = [{"role": "user", "content": "Say something. [[mock:drift]]"}]
        first = httpx.post(url, json={"model": "demo", "messages": messages}, headers=headers)
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "again"}]
        httpx.post(url, json={"model": "demo", "messages": messages}, headers=headers)
        scripted_agent.run(server.base_url, "fine")
    # A record file nobody can read, in a session of its own.
    garbage = tmp_path / "capture" / "sessions" / session_dir_name("garbage")
    garbage.mkdir()
    (garbage / "torn.json").write_bytes(b'{"schema_version": 1, "uu')
    result = server.collect()
    by_id = {rollout["session_id"]: rollout for rollout in result["rollouts"]}
    assert set(by_id) == {"drifted", "fine"}
    assert by_id["drifted"]["mask_sample"] is True
    assert "extend" in by_id["drifted"]["partial_reason"]
    assert len(by_id["drifted"]["record_uuids"]) == 1  # the first call's real tokens are kept
    assert by_id["fine"]["mask_sample"] is False
    assert any("unreadable" in error for error in result["errors"])


def test_a_child_that_exits_while_starting_fails_fast_with_its_output(tmp_path, mock_upstream):
    broken = tmp_path / "broken.toml"
    broken.write_text("schema_version = 1\n[routes.demo]\nid = 'demo'\ntype = 'passthrough'\ntarget = 'nowhere'\n")
    server = LocalServer(deployment=broken, capture_dir=tmp_path / "capture")  # startup timeout stays 240 s
    with pytest.raises(ServerStartError, match="exited with code 2") as failure:
        server.start()
    assert "nowhere" in str(failure.value) or "target" in str(failure.value)  # Switchyard's own complaint
    assert server.pid is None
    assert server.collect()["errors"][0].startswith("server did not start: ")


def test_a_server_that_ignores_sigterm_is_killed(tmp_path, mock_upstream):
    server = demo_server(tmp_path, mock_upstream, stop_timeout_s=2)
    server.start()
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM; SIGKILL still ends it
    server.stop()
    assert wait_gone(pid, timeout=0.5)
    assert any("was killed" in error for error in server.collect()["errors"])


PARENT = textwrap.dedent(
    """
    import os, sys, time
    from server.spawn import LocalServer
    server = LocalServer(deployment="demo", capture_dir=sys.argv[1], env={"MOCK_UPSTREAM_URL": sys.argv[2]})
    server.start()
    print(server.pid, flush=True)
    time.sleep(600)
    """
)

# The same parent, starting `serve` by hand without asking for PR_SET_PDEATHSIG: the negative control.
PARENT_WITHOUT_DEATH_SIGNAL = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, "MOCK_UPSTREAM_URL": sys.argv[2]}
    child = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--deployment", "demo", "--port", "0",
                              "--capture-dir", sys.argv[1]], env=env, stdout=subprocess.DEVNULL)
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("script, survives", [(PARENT, False), (PARENT_WITHOUT_DEATH_SIGNAL, True)])
def test_the_server_never_outlives_a_killed_parent(tmp_path, mock_upstream, script, survives):
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "capture"), mock_upstream + "/v1"],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # what the killed parent cannot remove stays in here
    )
    child_pid = int(parent.stdout.readline())
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        gone = wait_gone(child_pid, timeout=5 if survives else 60)
        assert gone is not survives
    finally:
        if psutil.pid_exists(child_pid):
            os.kill(child_pid, signal.SIGKILL)
        parent.stdout.close()


def test_port_file_holds_the_bound_port_once_the_server_answers(tmp_path, mock_upstream):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", "--deployment", "demo", "--port", "0"]
        + ["--port-file", str(port_file), "--capture-dir", str(tmp_path / "c")],
        env={**os.environ, "MOCK_UPSTREAM_URL": mock_upstream + "/v1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: port_file.exists() or proc.poll() is not None, 120)
        assert port_file.exists() and proc.poll() is None
        port = int(port_file.read_text())
        assert port > 0
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models")  # no retry: it must answer now
        assert models.status_code == 200 and orjson.loads(models.content)["data"]
    finally:
        proc.terminate()
        proc.wait(30)


def failing_agent(base_url: str) -> None:
    scripted_agent.run(base_url, "crashed")
    raise RuntimeError("the harness fell over after its calls")


def test_an_agent_that_raises_still_returns_its_rollouts_masked(tmp_path, mock_upstream):
    from server.ray_tasks import run_rollout  # the task body, run here without a cluster

    outcome = run_rollout(
        failing_agent,
        [],
        {"deployment": "demo", "env": {"MOCK_UPSTREAM_URL": mock_upstream + "/v1"}},
        str(tmp_path),
        str(tmp_path / "shared"),
    )
    assert outcome["result"] is None
    assert outcome["errors"][0].startswith("agent raised RuntimeError: the harness fell over")
    [rollout] = outcome["rollouts"]
    assert rollout["session_id"] == "crashed" and len(rollout["subagents"]) == 1
    assert rollout["mask_sample"] is True and "agent raised" in rollout["degraded_reason"]
    assert len(list((tmp_path / "shared").iterdir())) == 1  # copy_to got the attempt's directory
