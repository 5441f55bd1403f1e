"""condition_dir provenance: the condition manifest and the Switchyard stats snapshot."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import inspect
import logging
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson
import pytest

from server.switchyard import profiles, provenance
from tests.support.procs import free_port

SECRET = "tok-sentinel-0123456789abcdef"
GYM_KEYS = {
    "route",
    "mode",
    "proxy_root_url",
    "nemo_switchyard_version",
    "proxy_provenance",
    "deployment_path",
    "deployment_sha256",
    "deployment_toml",
    "session_id_headers",
    "written_at",
}

DEPLOYMENT = """\
schema_version = 1

[llm_clients.up]
format = "openai_chat"
base_url = "${UP_URL:-http://127.0.0.1:9/v1}"
extra_headers = { "x-team-token" = "${TEAM_TOKEN}" }

[targets.t]
id = "up/model"
llm_client = "up"

[routes.noop]
id = "noop"
type = "noop"

[routes.up]
id = "up"
type = "passthrough"
target = "t"
"""


def read(path: Path) -> dict:
    return orjson.loads(path.read_bytes())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def rendered(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_TOKEN", SECRET)
    path = tmp_path / "deploy.toml"
    path.write_text(DEPLOYMENT + 'api_key = "sk-literal"\n')
    return profiles.render(path)


def hosted_manifest(condition_dir, rendered, text=None) -> Path | None:
    return provenance.write_manifest(
        condition_dir,
        route="noop",
        mode="launch-hosted",
        proxy_root_url="http://127.0.0.1:4123/v1/",
        deployment_path=rendered.source,
        rendered_text=rendered.redacted_text if text is None else text,
        session_id_headers=["x-switchyard-session-id", "x-session-id"],
    )


def test_hosted_manifest_records_the_condition(tmp_path, rendered):
    condition = tmp_path / "cond" / "run-1"  # created on demand
    path = hosted_manifest(condition, rendered)
    assert path == condition / "switchyard-condition.json"
    doc = read(path)
    assert GYM_KEYS | {"switchyard_model_version", "server_mode", "deployment_toml_sha256"} == set(doc)
    assert doc["route"] == "noop" and doc["mode"] == "hosted" and doc["server_mode"] == "launch-hosted"
    assert doc["proxy_root_url"] == "http://127.0.0.1:4123"
    assert doc["nemo_switchyard_version"] == importlib.metadata.version("nemo-switchyard") == "0.3.0"
    assert doc["switchyard_model_version"] == importlib.metadata.version("switchyard-model")
    assert doc["deployment_path"] == str(rendered.source)
    assert doc["session_id_headers"] == ["x-switchyard-session-id", "x-session-id"]
    assert doc["written_at"].endswith("Z")
    toml = doc["deployment_toml"]
    assert 'base_url = "http://127.0.0.1:9/v1"' in toml  # interpolated values are recorded ...
    assert SECRET not in toml and "sk-literal" not in toml  # ... except secrets
    assert "api_key = '<redacted>'" in toml and "\"x-team-token\" = '<redacted>'" in toml
    # Gym's hash is of the file as it is on disk; ours, of the stored (redacted, resolved) text.
    assert doc["deployment_sha256"] == hashlib.sha256(Path(rendered.source).read_bytes()).hexdigest()
    assert doc["deployment_toml_sha256"] == hashlib.sha256(toml.encode()).hexdigest()
    assert doc["proxy_provenance"] is None  # hosted: the manifest identifies the proxy itself
    assert mode_of(path) == 0o600
    assert [p.name for p in condition.iterdir()] == ["switchyard-condition.json"]  # no temp file left


def test_secrets_are_hidden_even_when_given_the_raw_rendered_text(tmp_path, rendered):
    assert SECRET in rendered.text
    doc = read(hosted_manifest(tmp_path, rendered, text=rendered.text))
    assert SECRET not in doc["deployment_toml"] and "sk-literal" not in doc["deployment_toml"]


def test_same_condition_same_hash_whatever_the_secret(tmp_path, monkeypatch):
    path = tmp_path / "deploy.toml"
    path.write_text(DEPLOYMENT)
    hashes = []
    for token in (SECRET, SECRET + "-rotated"):
        monkeypatch.setenv("TEAM_TOKEN", token)
        doc = read(hosted_manifest(tmp_path / token, profiles.render(path)))
        hashes.append(doc["deployment_toml_sha256"])
    assert hashes[0] == hashes[1]
    monkeypatch.setenv("UP_URL", "http://127.0.0.1:10/v1")
    assert read(hosted_manifest(tmp_path / "other", profiles.render(path)))["deployment_toml_sha256"] != hashes[0]


def test_attached_manifest_records_the_proxy(tmp_path):
    path = provenance.write_manifest(
        tmp_path,
        route="policy",
        mode="attach",
        proxy_root_url="http://10.1.2.3:4000/v1",
        deployment_path=None,
        rendered_text=None,
        session_id_headers=["x-switchyard-session-id"],
        proxy_provenance={"switchyard_commit": "abc123"},
    )
    doc = read(path)
    assert doc["mode"] == "attached" and doc["proxy_root_url"] == "http://10.1.2.3:4000"
    assert doc["deployment_sha256"] is None and doc["deployment_toml"] is None and doc["deployment_path"] is None
    # Whoever runs an attached proxy says what it is; the local wheel's version would be a guess.
    assert doc["proxy_provenance"] == {"switchyard_commit": "abc123"} and doc["nemo_switchyard_version"] is None


def test_rewriting_the_manifest_replaces_it(tmp_path, rendered):
    hosted_manifest(tmp_path, rendered)
    path = provenance.write_manifest(
        tmp_path,
        route="other",
        mode="launch-process",
        proxy_root_url=None,
        deployment_path=None,
        rendered_text=None,
        session_id_headers=[],
    )
    assert read(path)["route"] == "other" and read(path)["mode"] == "hosted"
    assert len(list(tmp_path.iterdir())) == 2  # deploy.toml and the manifest


def test_no_condition_dir_writes_nothing(tmp_path, rendered, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hosted_manifest(None, rendered) is None
    assert hosted_manifest("", rendered) is None
    assert asyncio.run(provenance.snapshot_stats(None, "http://127.0.0.1:9")) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.toml"]


def test_unwritable_condition_dir_warns_and_does_not_raise(tmp_path, rendered, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="switchyard_model.provenance"):
        assert hosted_manifest(blocker / "cond", rendered) is None
    assert "cannot write the condition manifest" in caplog.text
    assert SECRET not in caplog.text


def test_missing_distribution_yields_null_version(tmp_path, rendered, monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name == "nemo-switchyard":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    doc = read(hosted_manifest(tmp_path, rendered))
    assert doc["nemo_switchyard_version"] is None
    assert doc["switchyard_model_version"] == real("switchyard-model")


# ---- stats snapshot (real hosted Switchyard) ------------------------------------------------


class _ChatUpstream(BaseHTTPRequestHandler):
    """A minimal chat-completions model server, so Switchyard has a real call to count."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        request = orjson.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        body = orjson.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def switchyard(tmp_path, monkeypatch):
    """A real Switchyard in front of a stub upstream, created and closed on the test's (main) thread."""
    from switchyard_rust.server import Server

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _ChatUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    monkeypatch.setenv("UP_URL", f"http://127.0.0.1:{upstream.server_address[1]}/v1")
    monkeypatch.setenv("TEAM_TOKEN", SECRET)
    source = tmp_path / "deploy.toml"
    source.write_text(DEPLOYMENT)
    private = profiles.write_private(profiles.render(source))
    server = Server(str(private), port=0)
    profiles.remove_private(private)
    try:
        yield server.base_url
    finally:
        server.close(timeout_secs=2.0)
        upstream.shutdown()
        upstream.server_close()


def test_stats_snapshot_after_traffic(tmp_path, switchyard):
    reply = httpx.post(
        f"{switchyard}/v1/chat/completions",
        timeout=10,
        json={"model": "up", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert reply.status_code == 200
    path = asyncio.run(provenance.snapshot_stats(tmp_path / "cond", switchyard + "/v1", 2.0, mode="launch-hosted"))
    assert path == tmp_path / "cond" / "switchyard-stats.json"
    doc = read(path)  # Gym's shape: the stats wrapped, with what they cover
    assert set(doc) == {"scope", "mode", "written_at", "stats"}
    assert doc["mode"] == "hosted" and doc["scope"].startswith("this run")
    stats = doc["stats"]
    assert stats["total_requests"] == 1 and stats["models"]["up/model"]["calls"] == 1
    assert mode_of(path) == 0o600


class _GuardedStats(BaseHTTPRequestHandler):
    """A /v1/stats that wants the caller's key and team header, or that hangs for `delay` seconds."""

    delay = 0.0

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        threading.Event().wait(self.delay)
        allowed = self.headers.get("authorization") == "Bearer k-1" and self.headers.get("x-team") == "t"
        body = b'{"total_requests": 7}' if allowed else b'{"error": "unauthorized"}'
        self.send_response(200 if allowed else 401)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def guarded_stats():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GuardedStats)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]  # the hung call's client left
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _GuardedStats.delay = 0.0
    server.shutdown()
    server.server_close()


def test_stats_are_fetched_as_model_calls_are_authenticated(tmp_path, guarded_stats):
    assert asyncio.run(provenance.snapshot_stats(tmp_path / "anon", guarded_stats)) is None
    path = asyncio.run(
        provenance.snapshot_stats(tmp_path, guarded_stats, api_key="k-1", default_headers={"x-team": "t"})
    )
    doc = read(path)
    assert doc["stats"] == {"total_requests": 7} and doc["mode"] == "attached"
    assert doc["scope"] == "proxy-lifetime aggregate"  # a shared proxy counts every run it served


def test_stats_give_up_after_half_a_second(tmp_path, guarded_stats):
    """Gym kills its servers about a second after asking them to stop: the snapshot must not outlast that."""
    _GuardedStats.delay = 3.0
    started = time.monotonic()
    assert asyncio.run(provenance.snapshot_stats(tmp_path, guarded_stats, api_key="k-1")) is None
    # It gave up (no file) before the endpoint would have answered; the cap itself is the default below.
    assert time.monotonic() - started < _GuardedStats.delay
    assert inspect.signature(provenance.snapshot_stats).parameters["timeout_s"].default == 0.5


def test_unreachable_stats_endpoint_warns_and_does_not_raise(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="switchyard_model.provenance"):
        assert (
            asyncio.run(provenance.snapshot_stats(tmp_path, f"http://127.0.0.1:{free_port()}", timeout_s=2.0)) is None
        )
    assert "cannot snapshot Switchyard stats" in caplog.text
    assert not (tmp_path / "switchyard-stats.json").exists()


def test_stats_http_error_warns(tmp_path, switchyard, caplog):
    with caplog.at_level(logging.WARNING, logger="switchyard_model.provenance"):
        assert asyncio.run(provenance.snapshot_stats(tmp_path, switchyard + "/not-here")) is None
    assert "404" in caplog.text


def test_stats_snapshot_needs_a_proxy_to_ask(tmp_path):
    assert asyncio.run(provenance.snapshot_stats(tmp_path, None)) is None
    assert list(tmp_path.iterdir()) == []


def test_stats_into_unwritable_dir_warns(tmp_path, switchyard, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="switchyard_model.provenance"):
        assert asyncio.run(provenance.snapshot_stats(blocker / "cond", switchyard)) is None
    assert "cannot write the stats snapshot" in caplog.text
