"""Switchyard lifecycle: hosted in-process, launched as a process, attached; failures at startup."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import httpx
import pytest

from server.app import create_app
from server.config import load_settings
from server.switchyard.proxy import AttachedProxy, HostedProxy, LaunchedProxy, build_proxy
from server.urls import root_url
from tests.support.procs import free_port

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
    assert app.state.switchyard.proxy.is_running() is False


def test_hosted_proxy_serves_health_and_closes_once(deployment):
    async def scenario():
        proxy = HostedProxy(deployment, None)
        await proxy.start()
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                assert (await client.get(proxy.root_url + "/health")).status_code == 200
                models = (await client.get(proxy.root_url + "/v1/models")).json()
                assert [m["id"] for m in models["data"]] == ["policy-model"]
        finally:
            await proxy.close()
        await proxy.close()  # a second close is a no-op
        assert proxy.is_running() is False
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(trust_env=False) as client:
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
        assert proxy.is_running() is False

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
        assert state.proxy.is_running() is False
        assert isinstance(state.startup_error, RuntimeError)

    run(scenario())


def test_launched_process_starts_serves_and_is_terminated(deployment):
    command = f"{sys.executable} -m server.switchyard.host --config {{deployment}} --port {{port}}"

    async def scenario():
        proxy = LaunchedProxy(command, deployment, None, startup_timeout_s=30)
        await proxy.start()
        pid = proxy.process.pid
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                assert (await client.get(proxy.root_url + "/health")).status_code == 200
        finally:
            await proxy.close()
        await proxy.close()
        assert proxy.is_running() is False
        with pytest.raises(ProcessLookupError):
            import os

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
        assert proxy.is_running() is False

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
