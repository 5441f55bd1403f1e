"""A web page cannot drive a keyless server on 127.0.0.1 through a browser: no DNS rebinding, no CSRF.

The attacks as a browser makes them: a request whose `Host` is the attacker's name (the page's
origin, rebound to 127.0.0.1), and a cross-site `text/plain` POST (sent without a preflight), both
against `serve` and against `sessions view`.
"""

from __future__ import annotations

import httpx
import pytest
import yaml

from tests.integration.test_viewer import start_view
from tests.support.procs import start_server

REBOUND = {"host": "rebind.attacker.example"}


@pytest.fixture(scope="module")
def keyless(mock_upstream, tmp_path_factory):
    directory = tmp_path_factory.mktemp("keyless")
    config = directory / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {"switchyard_base_url": mock_upstream + "/v1", "switchyard_model": "route-a", "capture_dir": str(directory)}
        )
    )
    proc, url = start_server("--config", str(config))
    yield url, directory
    proc.stop()


def test_a_rebound_host_name_is_refused(keyless):
    url, _ = keyless
    for path in ("/v1/models", "/v1/sessions", "/health", "/ui/"):
        refused = httpx.get(url + path, headers=REBOUND, timeout=30)
        assert refused.status_code == 421, (path, refused.text)
        assert refused.json()["error"]["code"] == "host_not_allowed"
    posted = httpx.post(
        url + "/ng-rollout/victim/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
        headers=REBOUND,
        timeout=30,
    )
    assert posted.status_code == 421
    for host in ("localhost", "127.0.0.1", url.removeprefix("http://")):
        assert httpx.get(url + "/v1/sessions", headers={"host": host}, timeout=30).status_code == 200


def test_a_cross_site_post_is_not_served_or_recorded(keyless):
    url, _ = keyless
    body = b'{"model": "x", "input": "forged by another site"}'
    for headers in (
        {"content-type": "text/plain;charset=UTF-8", "origin": "https://evil.example"},
        {"content-type": "application/x-www-form-urlencoded", "origin": "https://evil.example"},
        {"origin": "https://evil.example"},  # a Blob body without a type: no content type at all
    ):
        forged = httpx.post(url + "/ng-rollout/victim/v1/responses", content=body, headers=headers)
        assert forged.status_code == 415, (headers, forged.text)
        assert forged.json()["error"]["code"] == "unsupported_media_type"
    assert httpx.get(url + "/v1/sessions/victim/completions", timeout=30).status_code == 404
    # Real clients: JSON, or (curl, scripts) no content type and no Origin.
    ok = httpx.post(url + "/ng-rollout/victim/v1/responses", content=body, timeout=30)
    assert ok.status_code == 200, ok.text
    sdk_like = httpx.post(url + "/v1/responses", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert sdk_like.status_code == 200


def test_sessions_view_refuses_a_rebound_host(keyless):
    _, capture_dir = keyless
    proc, view_url = start_view(capture_dir)
    try:
        root = view_url.removesuffix("/ui/")
        assert httpx.get(root + "/v1/sessions", headers=REBOUND, timeout=30).status_code == 421
        assert httpx.get(root + "/v1/sessions", timeout=30).status_code == 200
    finally:
        proc.stop()


def test_session_ids_the_server_accepts_reach_every_view_route(keyless):
    url, _ = keyless
    session_id = "swe:django/1234:0"  # a `/` and `:` inside: valid as a header id
    reply = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-session-id": session_id},
        timeout=30,
    )
    assert reply.status_code == 200
    encoded = httpx.URL(url).copy_with(raw_path=b"/v1/sessions/swe:django%2F1234:0/timeline")
    timeline = httpx.get(encoded, timeout=30)
    assert timeline.status_code == 200, timeline.text
    record_uuid = timeline.json()["calls"][0]["uuid"]
    one = httpx.get(
        httpx.URL(url).copy_with(raw_path=f"/v1/sessions/swe:django%2F1234:0/completions/{record_uuid}".encode()),
        timeout=30,
    )
    assert one.status_code == 200 and one.json()["session_id"] == session_id
    for bad in ("/v1/sessions/%20bad/timeline", f"/v1/sessions/%20bad/completions/{record_uuid}"):
        missing = httpx.get(httpx.URL(url).copy_with(raw_path=bad.encode()), timeout=30)
        assert missing.status_code == 404, (bad, missing.text)


def test_the_viewer_redirect_is_relative_and_every_viewer_answer_has_its_policy(keyless):
    url, _ = keyless
    redirect = httpx.get(url + "/ui", headers={"host": "localhost"}, timeout=30)
    assert redirect.status_code in (302, 307) and redirect.headers["location"] == "/ui/"
    missing = httpx.get(url + "/ui/nope.js", timeout=30)
    assert missing.status_code == 404
    for reply in (redirect, missing):
        assert "default-src 'none'" in reply.headers.get("content-security-policy", "")
