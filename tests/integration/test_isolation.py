"""Hostile keys on one server: no key reads, changes or writes into another key's data.

Each test is an attack that must fail (the server in attach mode, straight to the mock upstream,
with `api_keys: [A, B]`): sessions and their records, rollouts, timelines and
deletes scoped to the key that wrote them, a deleted background run staying deleted, sealed
reasoning bound to its key, the seal key file checked, and Switchyard's address kept off `/health`.
"""

from __future__ import annotations

import os

import httpx
import pytest
import yaml

from tests.support.procs import Proc, start_server, wait_for

KEY_A, KEY_B, ADMIN = "key-a-0123456789", "key-b-0123456789", "admin-0123456789"
A = {"authorization": f"Bearer {KEY_A}"}
B = {"authorization": f"Bearer {KEY_B}"}


def write_config(tmp_path, mock_upstream, **settings) -> str:
    config = tmp_path / "cfg.yaml"
    values = {
        "switchyard_base_url": mock_upstream + "/v1",
        "switchyard_model": "route-a",
        "capture_dir": str(tmp_path / "cap"),
        "api_keys": [KEY_A, KEY_B],
        **settings,
    }
    config.write_text(yaml.safe_dump(values))
    return str(config)


def serve(tmp_path, mock_upstream, **settings) -> tuple[Proc, str]:
    return start_server("--config", write_config(tmp_path, mock_upstream, **settings))


def chat(url: str, headers: dict, text: str = "hello", **extra_headers: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": text}]},
        headers={**headers, **extra_headers},
        timeout=30,
    )


def get(url: str, path: str, headers: dict) -> httpx.Response:
    return httpx.get(url + path, headers=headers, timeout=30)


def session_texts(url: str, session_id: str, headers: dict) -> list[str]:
    reply = get(url, f"/v1/sessions/{session_id}/completions", headers)
    assert reply.status_code == 200, reply.text
    return [[m["content"] for m in r["messages"] if m["role"] == "user"][-1] for r in reply.json()["completions"]]


@pytest.fixture(scope="module")
def keyed(mock_upstream, tmp_path_factory):
    proc, url = serve(tmp_path_factory.mktemp("keyed"), mock_upstream)
    yield url
    proc.stop()


def test_a_key_reads_and_deletes_only_its_own_sessions(keyed):
    url = keyed
    assert chat(url, A, "secret of A", **{"x-session-id": "thread-a"}).status_code == 200
    # A conversation's id is its session id: B must not reach it through /v1/sessions either.
    conversation = httpx.post(url + "/v1/conversations", json={}, headers=A, timeout=30).json()
    reply = httpx.post(
        url + "/v1/responses",
        json={"model": "x", "input": "conversation secret", "conversation": conversation["id"]},
        headers=A,
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    for session_id in ("thread-a", conversation["id"]):
        for suffix in ("/completions", "/tree", "/rollout", "/chains", "/timeline"):
            seen = get(url, f"/v1/sessions/{session_id}{suffix}", B)
            assert seen.status_code == 404, (session_id, suffix, seen.text)
            assert seen.json()["error"]["code"] == "session_not_found"
        gone = httpx.delete(f"{url}/v1/sessions/{session_id}", headers=B, timeout=30)
        assert gone.status_code == 404
    record_uuid = get(url, "/v1/sessions/thread-a/completions", A).json()["completions"][0]["uuid"]
    assert get(url, f"/v1/sessions/thread-a/completions/{record_uuid}", B).status_code == 404
    listed_by_b = {s["session_id"] for s in get(url, "/v1/sessions", B).json()["sessions"]}
    listed_by_a = {s["session_id"] for s in get(url, "/v1/sessions", A).json()["sessions"]}
    assert "thread-a" not in listed_by_b and conversation["id"] not in listed_by_b
    assert {"thread-a", conversation["id"]} <= listed_by_a
    # A still has everything: B's delete did nothing.
    assert session_texts(url, "thread-a", A) == ["secret of A"]
    assert get(url, f"/v1/sessions/{conversation['id']}/rollout", A).status_code == 200
    assert get(url, f"/v1/sessions/{conversation['id']}/chains", A).status_code == 200


def test_a_call_under_another_keys_session_is_refused_and_never_lands_there(keyed):
    url = keyed
    assert chat(url, A, "first of A", **{"x-session-id": "rollout-a"}).status_code == 200
    for where in ({"x-session-id": "rollout-a"}, {"x-switchyard-session-id": "rollout-a"}):
        refused = chat(url, B, "B sneaks in", **where)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "session_forbidden"
    prefixed = httpx.post(
        url + "/ng-rollout/rollout-a/v1/responses",
        json={"model": "x", "input": "B via the Gym prefix"},
        headers=B,
        timeout=30,
    )
    assert prefixed.status_code == 403
    # Naming A's session as the parent would put B's session into A's tree: refused too.
    child = chat(url, B, "B's child", **{"x-session-id": "child-b", "x-parent-session-id": "rollout-a"})
    assert child.status_code == 403
    assert session_texts(url, "rollout-a", A) == ["first of A"]
    # B's own sessions still work, and A cannot reach them either.
    assert chat(url, B, "B's own", **{"x-session-id": "rollout-b"}).status_code == 200
    assert session_texts(url, "rollout-b", B) == ["B's own"]
    assert get(url, "/v1/sessions/rollout-b/completions", A).status_code == 404


def test_an_admin_key_sees_every_session(mock_upstream, tmp_path):
    proc, url = serve(tmp_path, mock_upstream, session_api_keys=[ADMIN])
    try:
        assert chat(url, A, "A's", **{"x-session-id": "s-a"}).status_code == 200
        assert chat(url, B, "B's", **{"x-session-id": "s-b"}).status_code == 200
        admin = {"authorization": f"Bearer {ADMIN}"}
        listed = {s["session_id"] for s in get(url, "/v1/sessions", admin).json()["sessions"]}
        assert {"s-a", "s-b"} <= listed
        assert session_texts(url, "s-a", admin) == ["A's"]
        assert get(url, "/v1/sessions/s-a/completions", A).status_code == 401  # model keys stay out
    finally:
        proc.stop()


def background(url: str, text: str) -> httpx.Response:
    body = {"model": "x", "input": text, "background": True}
    return httpx.post(url + "/v1/responses", json=body, headers=A, timeout=30)


def test_deleting_a_running_background_response_sticks(mock_upstream, tmp_path):
    """With one background place per key, A's next run is taken only once the deleted run's task has
    ended (its last write included): the wait is for that, not for a guess at how long it takes."""
    proc, url = serve(tmp_path, mock_upstream, background_max_runs_per_key=1)
    try:
        created = background(url, "private input [[mock:sleep 2000]]").json()
        assert created["status"] in ("queued", "in_progress")
        # Running upstream (not merely queued) when deleted.
        assert wait_for(lambda: get(url, f"/v1/responses/{created['id']}", A).json()["status"] == "in_progress")
        assert wait_for(lambda: httpx.get(mock_upstream + "/mock/stats").json()["in_flight"] >= 1)
        assert background(url, "while it runs").status_code == 429  # the place is the run's while it runs
        deleted = httpx.delete(f"{url}/v1/responses/{created['id']}", headers=A, timeout=30)
        assert deleted.json()["deleted"] is True
        assert wait_for(lambda: background(url, "after it ended").status_code == 200)
        for path in (f"/v1/responses/{created['id']}", f"/v1/responses/{created['id']}/input_items"):
            assert get(url, path, A).status_code == 404, get(url, path, A).text
    finally:
        proc.stop()


def sealed_item(url: str, headers: dict = A) -> dict:
    """A reasoning item sealed for `headers`' key, as a stateless client keeps it."""
    first = httpx.post(
        url + "/v1/responses",
        json={
            "model": "x",
            "input": "think [[mock:reasoning]]",
            "store": False,
            "include": ["reasoning.encrypted_content"],
        },
        headers=headers,
        timeout=30,
    ).json()
    (reasoning,) = [item for item in first["output"] if item["type"] == "reasoning"]
    return {
        "type": "reasoning",
        "id": reasoning["id"],
        "summary": [],
        "encrypted_content": reasoning["encrypted_content"],
    }


def send_back(url: str, headers: dict, item: dict) -> httpx.Response:
    follow_up = {"model": "x", "store": False, "input": [item, {"role": "user", "content": "again"}]}
    return httpx.post(url + "/v1/responses", json=follow_up, headers=headers, timeout=30)


def test_sealed_reasoning_opens_only_for_the_key_that_sealed_it(keyed):
    sealed = sealed_item(keyed, A)
    by_b = send_back(keyed, B, sealed)
    assert by_b.status_code == 400 and by_b.json()["error"]["code"] == "invalid_encrypted_content"
    by_a = send_back(keyed, A, sealed)
    assert by_a.status_code == 200, by_a.text


def messages_call(url: str, key: str, messages: list, **extra_headers: str) -> httpx.Response:
    """A Messages API call as Anthropic's clients send it: the key as `x-api-key`."""
    body = {
        "model": "x",
        "max_tokens": 200,
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "messages": messages,
    }
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", **extra_headers}
    return httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=30)


def test_a_signed_thinking_block_opens_only_for_the_key_that_signed_it(keyed):
    first = messages_call(keyed, KEY_A, [{"role": "user", "content": "think [[mock:reasoning]]"}])
    assert first.status_code == 200, first.text
    thinking = [block for block in first.json()["content"] if block["type"] == "thinking"]
    assert thinking and thinking[0]["signature"], first.text
    history = [
        {"role": "user", "content": "think [[mock:reasoning]]"},
        {"role": "assistant", "content": thinking},
        {"role": "user", "content": "again"},
    ]
    by_b = messages_call(keyed, KEY_B, history)
    assert by_b.status_code == 400 and "signature" in by_b.json()["error"]["message"], by_b.text
    assert messages_call(keyed, KEY_A, history).status_code == 200


def test_an_x_api_key_caller_is_scoped_like_a_bearer_caller(keyed):
    # Anthropic's clients present their key as x-api-key: it must own sessions as a Bearer key does.
    session = {"x-claude-code-session-id": "claude-a"}
    assert messages_call(keyed, KEY_A, [{"role": "user", "content": "A's task"}], **session).status_code == 200
    refused = messages_call(keyed, KEY_B, [{"role": "user", "content": "B sneaks in"}], **session)
    assert refused.status_code == 403, refused.text
    assert session_texts(keyed, "claude-a", A) == ["A's task"]
    assert get(keyed, "/v1/sessions/claude-a/completions", B).status_code == 404


def test_health_does_not_publish_switchyards_address_when_keys_are_set(keyed, mock_upstream):
    health = httpx.get(keyed + "/health", timeout=30).json()
    assert health["proxy"]["url"] is None
    assert mock_upstream not in str(health)


def _serve_until_exit(config: str) -> tuple[int | None, str]:
    proc, _ = start_server("--config", config, wait=False)
    code = wait_for(lambda: proc.popen.poll() is not None, timeout=60) and proc.popen.returncode
    output = proc.output()
    proc.stop()
    return code, output


def test_the_seal_key_file_is_checked_and_never_silently_replaced(mock_upstream, tmp_path):
    config = write_config(tmp_path, mock_upstream)
    key_file = tmp_path / "cap" / "reasoning-seal.key"
    proc, url = start_server("--config", config)
    sealed = sealed_item(url)
    proc.stop()
    original = key_file.read_bytes()
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"

    key_file.unlink()  # lost: a new key would silently break every item sealed before
    code, output = _serve_until_exit(config)
    assert code == 2 and "reasoning-seal.key is missing" in output, output
    assert not key_file.exists()

    elsewhere = tmp_path / "elsewhere.key"
    elsewhere.write_bytes(original)
    os.chmod(elsewhere, 0o600)
    key_file.symlink_to(elsewhere)
    code, output = _serve_until_exit(config)
    assert code == 2 and "symbolic link" in output, output
    key_file.unlink()

    key_file.write_bytes(original)
    os.chmod(key_file, 0o644)
    code, output = _serve_until_exit(config)
    assert code == 2 and "chmod 600" in output, output

    os.chmod(key_file, 0o600)
    key_file.write_bytes(b"not a key at all")
    code, output = _serve_until_exit(config)
    assert code == 2 and "base64" in output, output

    key_file.write_bytes(original)
    proc, url = start_server("--config", config)  # the original key back: it starts again
    try:
        # Same key file, same API key, but a later server run: what the first run sealed stays shut.
        late = send_back(url, A, sealed)
        assert late.status_code == 400 and late.json()["error"]["code"] == "invalid_encrypted_content"
        assert send_back(url, A, sealed_item(url)).status_code == 200
    finally:
        proc.stop()


def test_an_inferred_session_belongs_to_its_key_and_only_its_key_continues_it(keyed):
    """Two keys hold the same conversation without ids: each goes on in a session of its own, which
    only its key can read."""
    task = [{"role": "user", "content": "the same task for both keys"}]
    sessions = {}
    for name, headers in (("a", A), ("b", B)):
        first = httpx.post(
            keyed + "/v1/chat/completions", json={"model": "x", "messages": task}, headers=headers, timeout=30
        )
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]
        messages = [*task, answer, {"role": "user", "content": "go on"}]
        second = httpx.post(
            keyed + "/v1/chat/completions", json={"model": "x", "messages": messages}, headers=headers, timeout=30
        )
        assert second.headers["x-switchyard-session-id"] == first.headers["x-switchyard-session-id"]
        sessions[name] = first.headers["x-switchyard-session-id"]
    assert sessions["a"] != sessions["b"] and all(s.startswith("inferred-") for s in sessions.values())
    assert session_texts(keyed, sessions["a"], A) == ["the same task for both keys", "go on"]
    assert get(keyed, f"/v1/sessions/{sessions['a']}/completions", B).status_code == 404
    assert get(keyed, f"/v1/sessions/{sessions['b']}/completions", A).status_code == 404
