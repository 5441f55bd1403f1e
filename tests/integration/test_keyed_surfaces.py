"""The surfaces beside the model calls, on a server with API keys: `/metrics`, every POST route's
content type, the hosted Switchyard's port, and `sessions view` on a folder such a server wrote.

Each runs real processes: this server (attached to the mock upstream, or hosting Switchyard), and
`switchyard-model sessions view`.
"""

from __future__ import annotations

import re

import httpx
import pytest
import yaml

from tests.integration.test_viewer import start_view
from tests.support.procs import start_server

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"
A = {"authorization": f"Bearer {KEY_A}"}
B = {"authorization": f"Bearer {KEY_B}"}


def serve(tmp_path, mock_upstream: str | None, **settings):
    """This server with keys A and B: attached to the mock, or (mock_upstream None) hosting Switchyard."""
    values = {"capture_dir": str(tmp_path / "cap"), "api_keys": [KEY_A, KEY_B], **settings}
    if mock_upstream is not None:
        values |= {"switchyard_base_url": mock_upstream + "/v1", "switchyard_model": "route-a"}
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(values))
    return config


def chat(url: str, headers: dict, session: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
        headers={**headers, "x-session-id": session},
        timeout=60,
    )


def test_metrics_take_a_key_unless_metrics_open_and_name_no_hosted_switchyard_port(mock_upstream, tmp_path):
    """Before: /metrics answered anyone, and its series carried `server_port="<hosted Switchyard's port>"`."""
    config = serve(tmp_path, None, deployment="demo")
    proc, url = start_server("--config", str(config), env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"})
    try:
        assert chat(url, A, "metered").status_code == 200
        hosted = re.search(r"hosted Switchyard on http://127\.0\.0\.1:(\d+)", proc.output())
        assert hosted is not None, proc.output()
        port = hosted.group(1)
        refused = httpx.get(url + "/metrics", timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        metrics = httpx.get(url + "/metrics", headers=B, timeout=10)
        assert metrics.status_code == 200
        assert "gen_ai_client_operation_duration_seconds_count" in metrics.text  # the call was metered
        assert "server_port" not in metrics.text and f'"{port}"' not in metrics.text, metrics.text
        health = httpx.get(url + "/health", timeout=10).json()  # open, and names no port either
        assert port not in str(health)
        # Switchyard 0.3.0 cannot take a key: the server says so at start.
        assert "the hosted Switchyard takes no API key" in proc.output()
    finally:
        proc.stop()


def test_metrics_open_lets_a_scraper_in_without_a_key(mock_upstream, tmp_path):
    proc, url = start_server("--config", str(serve(tmp_path, mock_upstream, metrics_open=True)))
    try:
        assert httpx.get(url + "/metrics", timeout=10).status_code == 200
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401  # only /metrics opened
    finally:
        proc.stop()


CROSS_SITE_BODIES = [
    pytest.param({"content-type": "text/plain"}, b'{"metadata": {"k": "v"}}', id="text-plain"),
    pytest.param({"content-type": "application/x-www-form-urlencoded"}, b"metadata=1", id="form"),
    pytest.param(
        {"content-type": "multipart/form-data; boundary=x"},
        b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--\r\n',
        id="multipart",
    ),
    pytest.param({"origin": "http://elsewhere.example"}, b"{}", id="browser-without-type"),
]


@pytest.mark.parametrize(("headers", "body"), CROSS_SITE_BODIES)
def test_every_post_route_refuses_a_body_that_is_not_json(mock_upstream, tmp_path, headers, body):
    """Before: `POST /v1/conversations` made a conversation from a text/plain, form or multipart body
    (what a cross-site page can make a browser send); the model routes already refused them."""
    proc, url = start_server("--config", str(serve(tmp_path, mock_upstream, api_keys=[])))
    try:
        for path in ("/v1/conversations", "/v1/conversations/conv_x/items", "/v1/responses/resp_x/cancel"):
            reply = httpx.post(url + path, content=body, headers=headers, timeout=10)
            assert reply.status_code == 415, (path, reply.status_code, reply.text)
            assert reply.json()["error"]["code"] == "unsupported_media_type"
        made = httpx.post(url + "/v1/conversations", json={"metadata": {"k": "v"}}, timeout=10)
        assert made.status_code == 200, made.text  # JSON still goes through
        listed = httpx.get(url + f"/v1/conversations/{made.json()['id']}", timeout=10)
        assert listed.status_code == 200
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def keyed_folder(mock_upstream, tmp_path_factory):
    """A capture folder a keyed server wrote: session `sa` by key A, `sb` by key B."""
    tmp_path = tmp_path_factory.mktemp("keyed")
    proc, url = start_server("--config", str(serve(tmp_path, mock_upstream)))
    try:
        assert chat(url, A, "sa").status_code == 200
        assert chat(url, B, "sb").status_code == 200
    finally:
        proc.stop()
    return tmp_path / "cap"


def session_ids(url: str, headers: dict) -> httpx.Response:
    return httpx.get(url.replace("/ui/", "/v1/sessions"), headers=headers, timeout=30)


def test_sessions_view_on_a_keyed_folder_asks_for_a_key_and_shows_only_its_sessions(keyed_folder):
    """Before: `sessions view` served every key's sessions to anyone who reached its port."""
    proc, url = start_view(keyed_folder)
    try:
        no_key = session_ids(url, {})
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
        as_a = session_ids(url, A)
        assert as_a.status_code == 200
        assert [s["session_id"] for s in as_a.json()["sessions"]] == ["sa"]
        as_b = session_ids(url, B)
        assert [s["session_id"] for s in as_b.json()["sessions"]] == ["sb"]
        base = url.replace("/ui/", "")
        assert httpx.get(f"{base}/v1/sessions/sb/rollout", headers=A, timeout=30).status_code == 404
        assert httpx.get(f"{base}/v1/sessions/sa/rollout", headers=A, timeout=30).status_code == 200
        assert httpx.get(url, timeout=10).status_code == 200  # the page itself loads, and asks for the key
        assert "was written with API keys" in proc.output()
    finally:
        proc.stop()


def test_sessions_view_all_tenants_serves_every_session_and_says_so(keyed_folder):
    proc, url = start_view(keyed_folder, "--all-tenants")
    try:
        listed = session_ids(url, {})
        assert listed.status_code == 200
        assert sorted(s["session_id"] for s in listed.json()["sessions"]) == ["sa", "sb"]
        assert "WARNING" in proc.output() and "EVERY key's sessions" in proc.output()
    finally:
        proc.stop()
