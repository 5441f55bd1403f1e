"""The session write rule (docs/operations.md, "Who may write into a session"), cell by cell, through a real server.

Two servers on capture directories that already hold sessions written while no keys were set (so
unowned): `tenants` has two ordinary keys, `admins` adds an admin key that may make model calls too.
Both run Gym's training-token capture and evaluation log. Every cell of the table is one
parametrized case of `test_the_write_rule_cell_by_cell`; the tests after it are the attacks a review
found (each fails on the server before the rule), and the proof that a refused call leaves nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from tests.integration.test_isolation import ADMIN, KEY_A, KEY_B, A, B, chat, get, session_texts
from tests.support.procs import REPO, Proc, start_server, wait_for

ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}
TRAINING = "training-token-capture"
UNOWNED_POOL = 12  # sessions written before keys were set, per server


class Server:
    """One keyed server and its directories; `unowned` hands out the sessions written with no keys."""

    def __init__(self, url: str, root: Path, unowned: list[str]) -> None:
        self.url, self.root, self._unowned = url, root, unowned

    @property
    def sessions(self) -> Path:
        return self.root / "cap" / "sessions"

    @property
    def tokens(self) -> Path:
        return self.root / "gym" / "tokens"

    @property
    def calls(self) -> Path:
        return self.root / "gym" / "calls"

    def unowned(self) -> str:
        return self._unowned.pop()

    def folder(self, session_id: str) -> Path:
        return self.sessions / hashlib.sha256(session_id.encode()).hexdigest()


def _config(root: Path, mock_upstream: str, **settings) -> str:
    values = {
        "switchyard_base_url": mock_upstream + "/v1",
        "switchyard_model": "route-a",
        "capture_dir": str(root / "cap"),
        "capture_uncorrelated": True,
        "session_inference": False,  # calls without an id recorded as `uncorrelated-*`, not inferred
        "background_max_runs_per_key": 1,
        "max_body_bytes": 256 * 1024,
        "gym": {
            "token_id_capture": {"enabled": True, "dir": str(root / "gym" / "tokens")},
            "observability_enabled": True,
            "model_call_capture_dir": str(root / "gym" / "calls"),
        },
        **settings,
    }
    path = root / f"cfg-{len(list(root.glob('cfg-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _keyed_server(mock_upstream: str, root: Path, **keys) -> tuple[Proc, Server]:
    """First a server with no keys writes the sessions that will be unowned; then the keyed one starts."""
    pytest.importorskip("nemo_gym.token_id_capture", reason="NeMo Gym 0.7.0 is installed by `make venv`")
    keyless, url = start_server("--config", _config(root, mock_upstream))
    unowned = [f"old-{uuid.uuid4().hex[:12]}" for _ in range(UNOWNED_POOL)]
    try:
        for session_id in unowned:
            assert (
                chat(url, {}, f"written before keys: {session_id}", **{"x-session-id": session_id}).status_code == 200
            )
    finally:
        keyless.stop()
    proc, url = start_server("--config", _config(root, mock_upstream, **keys))
    return proc, Server(url, root, unowned)


@pytest.fixture(scope="module")
def tenants(mock_upstream, tmp_path_factory):
    proc, server = _keyed_server(mock_upstream, tmp_path_factory.mktemp("tenants"), api_keys=[KEY_A, KEY_B])
    yield server
    proc.stop()


@pytest.fixture(scope="module")
def admins(mock_upstream, tmp_path_factory):
    proc, server = _keyed_server(
        mock_upstream, tmp_path_factory.mktemp("admins"), api_keys=[KEY_A, KEY_B, ADMIN], session_api_keys=[ADMIN]
    )
    yield server
    proc.stop()


_fresh = itertools.count()


def fresh(kind: str = "s") -> str:
    return f"{kind}-{next(_fresh)}-{uuid.uuid4().hex[:8]}"


# ---- the actions: each writes (or reads) one target session id the way the table's row says --------


def write_as_session(url: str, key: dict, target: str) -> httpx.Response:
    return chat(url, key, f"as the session {target}", **{"x-session-id": target})


def write_as_parent(url: str, key: dict, target: str) -> httpx.Response:
    return chat(url, key, f"a child of {target}", **{"x-session-id": fresh("child"), "x-parent-session-id": target})


def write_as_agents_session(url: str, key: dict, target: str) -> httpx.Response:
    """Claude Code's sub-agent call: the session `target` and an agent id, so the call is `target/<agent>`."""
    agent = {"x-claude-code-session-id": target, "x-claude-code-agent-id": fresh("agent")}
    return chat(url, key, f"a sub-agent of {target}", **agent)


def write_as_gym_rollout(url: str, key: dict, target: str) -> httpx.Response:
    """Gym's training path with an agent id: the call is `target/<agent>`, Gym's token store is `target`'s."""
    return httpx.post(
        f"{url}/ng-rollout/{target}/{TRAINING}/v1/responses",
        json={"model": "x", "input": f"a training call of {target}"},
        headers={**key, "x-claude-code-agent-id": fresh("agent")},
        timeout=30,
    )


def read(url: str, key: dict, target: str) -> httpx.Response:
    return get(url, f"/v1/sessions/{target}/completions", key)


WRITES: dict[str, Callable[[str, dict, str], httpx.Response]] = {
    "session": write_as_session,
    "parent": write_as_parent,
    "agent": write_as_agents_session,
    "gym": write_as_gym_rollout,
}

# ---- the session states, as seen by the acting key ---------------------------------------------------


def make_state(server: Server, state: str, actor: dict, other: dict) -> str:
    """A session id in `state` for `actor`: new, its own, another key's, unowned with records, uncorrelated."""
    target = fresh(state)
    if state == "own":
        assert write_as_session(server.url, actor, target).status_code == 200
    elif state == "other":
        assert write_as_session(server.url, other, target).status_code == 200
    elif state == "unowned":
        target = server.unowned()
    elif state == "uncorrelated":
        request_id = fresh("req")  # recorded as `uncorrelated-<request id>`, with no owner
        reply = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "no session"}]},
            headers={**other, "x-request-id": request_id},
            timeout=30,
        )
        assert reply.status_code == 200
        target = f"uncorrelated-{request_id}"
        assert wait_for(lambda: any(server.folder(target).glob("*.json")))
    return target


# The table in docs/operations.md: (actor, action) -> {state: status}. "ok" = 200.
ORDINARY_WRITE = {"new": 200, "own": 200, "other": 403, "unowned": 403, "uncorrelated": 403}
ADMIN_WRITE = {"new": 200, "own": 200, "other": 403, "unowned": 200, "uncorrelated": 200}
ORDINARY_READ = {"new": 404, "own": 200, "other": 404, "unowned": 404, "uncorrelated": 404}
ADMIN_READ = {"new": 404, "own": 200, "other": 200, "unowned": 200, "uncorrelated": 200}
STATES = ("new", "own", "other", "unowned", "uncorrelated")
CELLS = [(actor, action, state) for actor in ("key", "admin") for action in (*WRITES, "read") for state in STATES]


def expected(actor: str, action: str, state: str) -> int:
    if action == "read":
        return (ADMIN_READ if actor == "admin" else ORDINARY_READ)[state]
    return (ADMIN_WRITE if actor == "admin" else ORDINARY_WRITE)[state]


# The table's rows in docs/operations.md, by the start of their action column.
DOC_ACTIONS = {
    "write as its session": "session",
    "write as the parent": "parent",
    "write as the session of a sub-agent": "agent",
    "write as a Gym rollout": "gym",
    "read": "read",
}


def test_the_table_in_the_docs_is_the_one_tested():
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("#### Who may write into a session") :]
    rows = [line for line in section.splitlines() if line.startswith(("| a key |", "| an admin key |"))]
    documented = {}
    for row in rows:
        actor_text, action_text, *cells = [cell.strip() for cell in row.strip("|").split("|")]
        action = next(key for start, key in DOC_ACTIONS.items() if action_text.startswith(start))
        actor = "admin" if actor_text == "an admin key" else "key"
        for state, cell in zip(STATES, cells, strict=True):
            documented[(actor, action, state)] = int(cell.split()[0].rstrip(","))
    assert documented == {cell: expected(*cell) for cell in CELLS}


def token_entries(server: Server, rollout_id: str) -> int:
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    return len(TokenCaptureStore(server.tokens).read_entries(rollout_id))


@pytest.mark.parametrize("actor, action, state", CELLS, ids=["-".join(cell) for cell in CELLS])
def test_the_write_rule_cell_by_cell(request, actor, action, state):
    server: Server = request.getfixturevalue("admins" if actor == "admin" else "tenants")
    me, other = (ADMIN_HEADERS, A) if actor == "admin" else (A, B)
    target = make_state(server, state, me, other)
    had_owner_file = (server.folder(target) / ".owner").exists()
    entries_before = token_entries(server, target) if action == "gym" else 0
    if action == "read":
        reply = read(server.url, me, target)
    else:
        reply = WRITES[action](server.url, me, target)
    want = expected(actor, action, state)
    assert reply.status_code == want, (actor, action, state, reply.text)
    if want == 403:
        assert reply.json()["error"]["code"] == "session_forbidden"
    if action == "gym":  # Gym's token store follows the session's owner: an entry only where the call may write
        assert token_entries(server, target) == entries_before + (1 if want == 200 else 0)
    if action == "read" or want != 200:
        return
    if state in ("unowned", "uncorrelated"):
        # An admin's write leaves an unowned session unowned: no key took it, the other key still may not write.
        assert not (server.folder(target) / ".owner").exists() and not had_owner_file
    else:
        # The target is the writer's now (it claimed a new one): the other key may not write into it.
        assert write_as_session(server.url, other, target).status_code == 403


# ---- the attacks ----------------------------------------------------------------------------------


def test_an_unowned_session_is_never_claimed_by_a_call_even_a_refused_one(tenants, admins):
    """Before: any key naming an unowned session's id, even in a call refused with 400, became its owner
    and read its whole history."""
    url, unowned = tenants.url, tenants.unowned()
    invalid = httpx.post(
        url + "/v1/chat/completions", json={"model": "x"}, headers={**B, "x-session-id": unowned}, timeout=30
    )
    assert invalid.status_code == 400
    assert write_as_session(url, B, unowned).status_code == 403
    assert write_as_parent(url, B, unowned).status_code == 403
    assert read(url, B, unowned).status_code == 404
    assert read(url, A, unowned).status_code == 404
    assert not (tenants.folder(unowned) / ".owner").exists()
    # The admin key reads it, and may go on writing it.
    unowned = admins.unowned()
    assert write_as_session(admins.url, B, unowned).status_code == 403
    assert [text.startswith("written before keys") for text in session_texts(admins.url, unowned, ADMIN_HEADERS)] == [
        True
    ]
    assert write_as_session(admins.url, ADMIN_HEADERS, unowned).status_code == 200
    assert len(session_texts(admins.url, unowned, ADMIN_HEADERS)) == 2


def test_no_key_can_take_the_session_of_another_keys_uncorrelated_call(tenants):
    """An uncorrelated call is recorded as `uncorrelated-<request id>`, and the request id may be the
    client's: a key that could claim that id beforehand would read the other key's call."""
    url, request_id = tenants.url, fresh("req")
    target = f"uncorrelated-{request_id}"
    assert write_as_session(url, B, target).status_code == 403
    assert write_as_parent(url, B, target).status_code == 403
    reply = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "A's secret, no session"}]},
        headers={**A, "x-request-id": request_id},
        timeout=30,
    )
    assert reply.status_code == 200
    assert wait_for(lambda: any(tenants.folder(target).glob("*.json")))
    assert read(url, B, target).status_code == 404


def test_a_key_cannot_attach_a_child_to_another_keys_future_session(tenants):
    """Before: B naming A's not-yet-started session as its parent became a child in A's tree, so A's
    /tree, /rollout, /chains and /timeline held B's text. Now naming the parent claims it for B: A's
    later call under that id gets the 403 (the id is taken), and A's data never holds B's text."""
    url, parent = tenants.url, fresh("future")
    squat = chat(url, B, "B's text in A's tree", **{"x-session-id": fresh("child"), "x-parent-session-id": parent})
    assert squat.status_code == 200
    started = chat(url, A, "A starts its session", **{"x-session-id": parent})
    assert started.status_code == 403, started.text
    for suffix in ("/tree", "/rollout", "/chains", "/timeline"):
        assert get(url, f"/v1/sessions/{parent}{suffix}", A).status_code == 404


def test_a_key_cannot_take_another_keys_claude_code_sub_agent_id(tenants):
    """Before: B took A's future sub-agent id `S/agent-1` with a plain session header, and A's sub-agent
    then got a 403."""
    url, session = tenants.url, fresh("claude")
    assert chat(url, A, "A's main agent", **{"x-claude-code-session-id": session}).status_code == 200
    taken = chat(url, B, "B squats the sub-agent", **{"x-session-id": f"{session}/agent-1"})
    assert taken.status_code == 403, taken.text
    sub = chat(url, A, "A's sub-agent", **{"x-claude-code-session-id": session, "x-claude-code-agent-id": "agent-1"})
    assert sub.status_code == 200, sub.text
    assert session_texts(url, f"{session}/agent-1", A) == ["A's sub-agent"]
    # A sub-agent id of a session nobody started yet: B may take it, and takes the session with it.
    future = fresh("claude")
    assert chat(url, B, "B first", **{"x-session-id": f"{future}/agent-1"}).status_code == 200
    assert chat(url, A, "A later", **{"x-claude-code-session-id": future}).status_code == 403


def test_gyms_token_store_follows_the_sessions_owner(tenants):
    """Before: on Gym's training path with an agent id, B's call was filed under B's session `R/<agent>`
    but Gym's token store under `R`: if A had not started R yet, B's entry landed in A's R.tokens.jsonl."""
    url, rollout = tenants.url, fresh("rollout")
    assert write_as_gym_rollout(url, B, rollout).status_code == 200
    assert token_entries(tenants, rollout) == 1
    by_a = httpx.post(
        f"{url}/ng-rollout/{rollout}/{TRAINING}/v1/responses",
        json={"model": "x", "input": "A's rollout"},
        headers=A,
        timeout=30,
    )
    assert by_a.status_code == 403, by_a.text
    assert token_entries(tenants, rollout) == 1  # A's training data never mixes with B's entry


# ---- refused calls leave nothing ----------------------------------------------------------------------


def _everything(server: Server) -> set[str]:
    """Every file and folder in the capture directory's sessions and Gym's two directories."""
    found = set()
    for root in (server.sessions, server.tokens, server.calls):
        for path, dirs, files in os.walk(root):
            found.update(os.path.join(path, name) for name in (*dirs, *files))
    return found


def _listed(server: Server, key: dict) -> set[str]:
    return {s["session_id"] for s in get(server.url, "/v1/sessions?limit=1000", key).json()["sessions"]}


def test_a_refused_call_leaves_no_folder_file_or_index_entry(tenants):
    """Before: a call's session folder and owner file were made before its body was checked, and stayed."""
    url = tenants.url
    own, rollout_of_a = fresh("own"), fresh("rollout")
    for session_id in (own, rollout_of_a):
        assert write_as_session(url, A, session_id).status_code == 200
    # One background run of A's holds A's only place: the next one gets the 429.
    running = httpx.post(
        url + "/v1/responses",
        json={"model": "x", "input": "hold [[mock:sleep 20000]]", "background": True},
        headers={**A, "x-session-id": fresh("bg")},
        timeout=30,
    )
    assert running.status_code == 200, running.text
    before, listed_a, listed_b = _everything(tenants), _listed(tenants, A), _listed(tenants, B)

    def refused(path: str, body: object, key: dict, status: int, **headers: str) -> None:
        session = fresh("refused")
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        reply = httpx.post(
            url + path,
            content=raw,
            headers={**key, "content-type": "application/json", "x-session-id": session, **headers},
            timeout=30,
        )
        assert reply.status_code == status, (path, reply.text)
        assert not tenants.folder(session).exists(), (path, status)

    chat_body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    try:
        refused("/v1/chat/completions", {"model": "x"}, A, 400)  # no messages
        refused("/v1/chat/completions", b"{not json", A, 400)
        refused("/v1/responses", {"model": "x", "input": 7}, A, 400)
        refused("/v1/messages", {"model": "x", "max_tokens": 9, "messages": "no"}, A, 400)
        refused("/v1/chat/completions", b" " * (300 * 1024), A, 413)
        refused("/v1/chat/completions", chat_body, {"authorization": "Bearer wrong"}, 401)
        refused("/v1/chat/completions", chat_body, A, 415, **{"content-type": "text/plain"})
        refused("/v1/chat/completions", chat_body, B, 403, **{"x-parent-session-id": own})  # a new child of A's
        refused("/v1/responses", {"model": "x", "input": "again", "background": True}, A, 429)
        # On Gym's paths: neither Gym's token store nor its exchange log gets anything.
        refused(f"/ng-rollout/{fresh('r')}/{TRAINING}/v1/responses", {"model": "x", "input": 7}, A, 400)
        refused(f"/ng-rollout/{fresh('r')}/v1/chat/completions", {"model": "x"}, A, 400)
        refused(f"/ng-rollout/{rollout_of_a}/{TRAINING}/v1/responses", {"model": "x", "input": "B"}, B, 403)
        refused(f"/ng-rollout/{rollout_of_a}/v1/chat/completions", chat_body, B, 403)
        # Gym's exchange of a failed call is written after its answer: give a wrong one time to land.
        assert not wait_for(lambda: _everything(tenants) != before, timeout=1.0)
        assert _listed(tenants, A) == listed_a and _listed(tenants, B) == listed_b
    finally:
        httpx.post(f"{url}/v1/responses/{running.json()['id']}/cancel", headers=A, timeout=30)
