"""Switchyard lifecycle: hosted in-process, launched as a process, attached; failures at startup."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import httpx
import pytest

from server.app import create_app
from server.config import ConfigError, load_settings
from server.switchyard.proxy import AttachedProxy, HostedProxy, LaunchedProxy, build_proxy
from server.switchyard.runtime import TOKIO_THREADS_ENV, switchyard_threads
from server.urls import root_url
from tests.support.procs import free_port, tokio_workers

GOOD = """schema_version = 1
[llm_clients.up]
format = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
[targets.t]
id = "upstream/model"
llm_client = "up"
[routes.r]
id = "policy-model"
type = "passthrough"
target = "t"
"""


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(GOOD)
    return path


def run(coro):
    return asyncio.run(coro)


def test_root_url_strips_v1():
    assert root_url("http://127.0.0.1:4000/v1/") == "http://127.0.0.1:4000"
    assert root_url("http://h:1") == "http://h:1"


def test_building_the_app_hosts_nothing(deployment, monkeypatch):
    import switchyard_rust.server as native

    def explode(*args, **kwargs):
        raise AssertionError("Server constructed while building the app")

    monkeypatch.setattr(native, "Server", explode)
    app = create_app(load_settings(overrides={"deployment": str(deployment)}, environ={}))
    assert isinstance(app.state.switchyard.proxy, HostedProxy)
    assert app.state.switchyard.proxy.is_known_down()


def test_hosted_proxy_serves_health_and_closes_once(deployment):
    async def scenario():
        proxy = HostedProxy(deployment, None)
        await proxy.start()
        try:
            async with httpx.AsyncClient() as client:
                assert (await client.get(proxy.root_url + "/health")).status_code == 200
                assert not proxy.is_known_down()
                models = (await client.get(proxy.root_url + "/v1/models")).json()
                assert [m["id"] for m in models["data"]] == ["policy-model"]
        finally:
            await proxy.close()
        await proxy.close()  # a second close is a no-op
        assert proxy.is_known_down()
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient() as client:
                await client.get(proxy.root_url + "/health")
        assert proxy._rendered_path is None  # the private copy of the deployment is gone

    run(scenario())


def test_bad_deployment_fails_with_switchyards_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 1\n[routes.broken]\n")

    async def scenario():
        proxy = HostedProxy(bad, None)
        with pytest.raises(RuntimeError, match="missing field") as err:
            await proxy.start()
        assert str(bad) in str(err.value)
        assert proxy.is_known_down()

    run(scenario())


def test_busy_port_fails_with_a_clear_message(deployment):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]

        async def scenario():
            with pytest.raises(RuntimeError, match=f"cannot bind port {port}"):
                await HostedProxy(deployment, port).start()

        run(scenario())


def test_unset_variable_in_deployment_fails_naming_it(tmp_path):
    path = tmp_path / "vars.toml"
    path.write_text(GOOD.replace('"http://127.0.0.1:9/v1"', '"${SURELY_UNSET_VAR_123}"'))

    async def scenario():
        with pytest.raises(Exception, match=r"SURELY_UNSET_VAR_123.*|vars.toml:4"):
            await HostedProxy(path, None).start()

    run(scenario())


def test_failed_startup_after_the_proxy_started_still_closes_it(deployment, monkeypatch):
    """The lifespan fails after Switchyard is up (route discovery here): the proxy must be closed."""
    settings = load_settings(overrides={"deployment": str(deployment), "capture": False}, environ={})
    app = create_app(settings)
    state = app.state.switchyard

    async def no_routes(upstream):
        raise RuntimeError("startup failed later")

    monkeypatch.setattr("server.lifespan.discover_routes", no_routes)

    async def scenario():
        with pytest.raises(RuntimeError, match="startup failed later"):
            async with app.router.lifespan_context(app):
                pass
        assert state.proxy.is_known_down()
        assert isinstance(state.startup_error, RuntimeError)

    run(scenario())


def test_launched_process_starts_serves_and_is_terminated(deployment):
    command = f"{sys.executable} -m server.switchyard.host --config {{deployment}} --port {{port}}"

    async def scenario():
        proxy = LaunchedProxy(command, deployment, None, startup_timeout_s=30)
        await proxy.start()
        pid = proxy.process.pid
        private = proxy._rendered_path.parent  # the deployment copy and Switchyard's stderr, both private
        try:
            assert (private / "switchyard-stderr.log").exists()
            async with httpx.AsyncClient() as client:
                assert (await client.get(proxy.root_url + "/health")).status_code == 200
                assert not proxy.is_known_down()
        finally:
            await proxy.close()
        await proxy.close()
        assert proxy.is_known_down()
        assert not private.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    run(scenario())


def test_launched_process_that_exits_fails_fast_with_its_stderr(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 2\n")
    command = f"{sys.executable} -m server.switchyard.host --config {{deployment}} --port {{port}}"

    async def scenario():
        proxy = LaunchedProxy(command, bad, None, startup_timeout_s=30)
        with pytest.raises(RuntimeError, match="(?s)exited with code 2.*missing field `targets`") as err:
            await proxy.start()
        assert str(bad) in str(err.value)  # the user's file, not the private rendered copy

    run(scenario())


def test_launched_process_not_ready_times_out(deployment):
    command = f"{sys.executable} -c 'import time; time.sleep(30)' {{deployment}} {{port}}"

    async def scenario():
        proxy = LaunchedProxy(command, deployment, free_port(), startup_timeout_s=0.5)
        with pytest.raises(RuntimeError, match="not ready after 0.5s"):
            await proxy.start()
        assert proxy.is_known_down()

    run(scenario())


def test_build_proxy_picks_the_mode(deployment):
    assert isinstance(
        build_proxy(load_settings(overrides={"switchyard_base_url": "http://127.0.0.1:1/v1"}, environ={})),
        AttachedProxy,
    )
    assert isinstance(build_proxy(load_settings(overrides={"deployment": str(deployment)}, environ={})), HostedProxy)
    launched = build_proxy(
        load_settings(overrides={"deployment": str(deployment), "switchyard_command": "x"}, environ={})
    )
    assert isinstance(launched, LaunchedProxy)


def test_switchyard_threads_setting_then_the_users_variable_then_the_hosted_cap(monkeypatch):
    monkeypatch.delenv(TOKIO_THREADS_ENV, raising=False)
    assert switchyard_threads(None, hosted=True, cpus=64) == 4  # not one per core of a big node
    assert switchyard_threads(None, hosted=True, cpus=2) == 2
    assert switchyard_threads(None, hosted=True, cpus=1) == 1
    assert switchyard_threads(None, hosted=False, cpus=64) is None  # launched: Switchyard's own default
    assert switchyard_threads(6, hosted=True, cpus=2) == 6
    monkeypatch.setenv(TOKIO_THREADS_ENV, "3")
    assert switchyard_threads(None, hosted=True, cpus=64) == 3
    assert switchyard_threads(None, hosted=False) == 3
    assert switchyard_threads(5, hosted=True) == 5
    monkeypatch.setenv(TOKIO_THREADS_ENV, " 2 ")
    assert switchyard_threads(None, hosted=False) == 2  # handed on as "2", which Switchyard can read
    for bad in ("", "0", "two", "-1", "1.5", "²"):
        monkeypatch.setenv(TOKIO_THREADS_ENV, bad)
        # Switchyard itself would panic at startup; here it is one line naming the variable.
        with pytest.raises(ConfigError, match=TOKIO_THREADS_ENV):
            switchyard_threads(None, hosted=True)
        assert switchyard_threads(2, hosted=True) == 2  # the setting is what Switchyard gets then


def test_hosted_proxy_asks_for_its_threads_and_puts_the_environment_back(deployment, monkeypatch):
    import switchyard_rust.server as native

    seen = []

    class FakeServer:
        base_url = "http://127.0.0.1:9"

        def __init__(self, *args, **kwargs):
            seen.append(os.environ.get(TOKIO_THREADS_ENV))

        def close(self, timeout_secs):
            pass

    monkeypatch.setattr(native, "Server", FakeServer)
    monkeypatch.setenv(TOKIO_THREADS_ENV, "7")

    async def scenario(threads):
        proxy = HostedProxy(deployment, None, threads)
        await proxy.start()
        await proxy.close()

    run(scenario(3))
    run(scenario(None))
    assert seen == ["3", "7"]
    assert os.environ[TOKIO_THREADS_ENV] == "7"
    monkeypatch.delenv(TOKIO_THREADS_ENV)
    run(scenario(2))
    assert seen[-1] == "2" and TOKIO_THREADS_ENV not in os.environ


def test_launched_switchyard_runs_the_threads_asked_for(deployment, monkeypatch):
    monkeypatch.delenv(TOKIO_THREADS_ENV, raising=False)
    command = f"{sys.executable} -m server.switchyard.host --config {{deployment}} --port {{port}}"

    async def workers_of(threads):
        proxy = LaunchedProxy(command, deployment, None, startup_timeout_s=30, threads=threads)
        await proxy.start()
        try:
            return tokio_workers(proxy.process.pid)
        finally:
            await proxy.close()

    # Tokio's default is one per core: 1 and 3 both differ from it on a machine of 2 cores or more.
    assert run(workers_of(1)) == 1
    assert run(workers_of(3)) == 3


def test_build_proxy_passes_the_threads(deployment, monkeypatch):
    monkeypatch.delenv(TOKIO_THREADS_ENV, raising=False)
    hosted = build_proxy(load_settings(overrides={"deployment": str(deployment)}, environ={}))
    assert hosted.threads == min(4, len(os.sched_getaffinity(0)))
    launched = build_proxy(
        load_settings(overrides={"deployment": str(deployment), "switchyard_command": "x"}, environ={})
    )
    assert launched.threads is None
    launched = build_proxy(
        load_settings(
            overrides={"deployment": str(deployment), "switchyard_command": "x", "switchyard_threads": 2}, environ={}
        )
    )
    assert launched.threads == 2


def test_the_standalone_host_refuses_a_bad_tokio_worker_threads_in_one_line(deployment, monkeypatch, capsys):
    from server.switchyard.host import main

    monkeypatch.setenv(TOKIO_THREADS_ENV, "")
    assert main(["--config", str(deployment)]) == 2
    assert "TOKIO_WORKER_THREADS='' is not a positive integer" in capsys.readouterr().err


def test_an_attached_switchyard_is_never_known_down():
    # Only a probe can tell whether a Switchyard run elsewhere is up, so calls go ahead (and meet its answer).
    assert AttachedProxy("http://127.0.0.1:9").is_known_down() is False
