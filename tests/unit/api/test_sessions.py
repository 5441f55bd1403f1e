"""The /v1/sessions HTTP API: envelopes, ordering, 404s, traversal, trees, rollouts and deletes."""

from __future__ import annotations

import hashlib
import time

import orjson
import pytest
from starlette.testclient import TestClient

from server.capture.read import rebuilds
from server.capture.rollout import RolloutError
from server.capture.store import CaptureStore
from server.capture.write.record import RecordInput
from tests.support.captures import captured_call as call
from tests.support.captures import chat_response
from tests.support.captures import submit_all as add
from tests.support.session_apps import sessions_app


@pytest.fixture
def store(tmp_path):
    capture = CaptureStore(tmp_path / "captures")
    capture.start()
    yield capture
    capture.close()


@pytest.fixture
def client(store):
    app = sessions_app(store)
    with TestClient(app) as test_client:
        yield test_client


def populate(store):
    add(
        store,
        call("root-1", captured_at="2026-01-01T00:00:00.000000+00:00"),
        call("sub-1", parent="root-1"),
        call("sub-2", parent="root-1"),
        call("subsub", parent="sub-1"),
        call("root-2"),
    )


def assert_openai_error(response, status):
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def test_list_sessions_envelope_and_tree(client, store):
    populate(store)
    response = client.get("/v1/sessions")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["schema_version"] == 1
    assert body["has_more"] is False
    assert body["next_after"] is None
    assert {s["session_id"]: s["parent_session_id"] for s in body["sessions"]} == {
        "root-1": None,
        "root-2": None,
        "sub-1": "root-1",
        "sub-2": "root-1",
        "subsub": "sub-1",
    }
    first = body["sessions"][0]
    assert set(first) >= {"session_id", "parent_session_id", "record_count", "first_captured_at", "last_captured_at"}


def test_list_sessions_empty(client):
    assert client.get("/v1/sessions").json() == {
        "schema_version": 1,
        "sessions": [],
        "has_more": False,
        "next_after": None,
    }


def test_list_filters(client, store):
    populate(store)

    def ids(params):
        return [s["session_id"] for s in client.get("/v1/sessions", params=params).json()["sessions"]]

    assert ids({"parent": "root-1"}) == ["sub-1", "sub-2"]
    assert ids({"roots_only": "true"}) == ["root-1", "root-2"]
    assert ids({"roots_only": "false"}) == ["root-1", "root-2", "sub-1", "sub-2", "subsub"]
    assert ids({"parent": "nobody"}) == []


def test_list_paging(client, store):
    populate(store)
    seen, after = [], None
    for _ in range(10):
        params = {"limit": "2"} | ({"after": after} if after else {})
        body = client.get("/v1/sessions", params=params).json()
        seen += [s["session_id"] for s in body["sessions"]]
        if not body["has_more"]:
            assert body["next_after"] is None
            break
        after = body["next_after"]
        assert after == body["sessions"][-1]["session_id"]
    assert seen == ["root-1", "root-2", "sub-1", "sub-2", "subsub"]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "abc"}, "limit"),
        ({"limit": "100001"}, "limit"),
        ({"roots_only": "maybe"}, "roots_only"),
        ({"parent": "../ x"}, "parent"),
        ({"after": ".."}, "after"),
    ],
)
def test_list_rejects_bad_query(client, params, param):
    error = assert_openai_error(client.get("/v1/sessions", params=params), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_completions_envelope(client, store):
    add(store, call("sess-1"), call("sess-1", response=chat_response([1, 2, 3, 7, 8, 9], [10])))
    response = client.get("/v1/sessions/sess-1/completions")
    assert response.status_code == 200
    body = response.json()
    assert body["schema_version"] == 1
    assert body["session_id"] == "sess-1"
    assert body["skipped"] == 0
    assert len(body["completions"]) == 2
    assert [r["generation_token_ids"] for r in body["completions"]] == [[7, 8], [10]]
    assert all(r["session_id"] == "sess-1" and r["is_valid"] for r in body["completions"])


def test_a_read_sees_calls_queued_before_it(client, store, monkeypatch):
    # A slow disk: the record is still queued when the trainer asks for the session.
    real_write = store.writer._write

    def slow_write(record):
        time.sleep(0.3)
        return real_write(record)

    monkeypatch.setattr(store.writer, "_write", slow_write)
    assert store.submit_call(RecordInput(**call("just-finished")))
    body = client.get("/v1/sessions/just-finished/completions").json()
    assert len(body["completions"]) == 1
    assert store.submit_call(RecordInput(**call("just-finished-2")))
    ids = [s["session_id"] for s in client.get("/v1/sessions").json()["sessions"]]
    assert "just-finished-2" in ids


def test_completions_sorted_by_captured_at_then_uuid(client, store):
    # File names (uuids) in reverse order of time: order must come from (captured_at, uuid).
    add(
        store,
        call("sess-1", record_uuid="c", captured_at="2026-01-01T00:00:00.000001+00:00"),
        call("sess-1", record_uuid="b", captured_at="2026-01-01T00:00:00.000002+00:00"),
        call("sess-1", record_uuid="a", captured_at="2026-01-01T00:00:00.000003+00:00"),
        call("sess-1", record_uuid="0", captured_at="2026-01-01T00:00:00.000003+00:00"),
    )
    body = client.get("/v1/sessions/sess-1/completions").json()
    assert [r["uuid"] for r in body["completions"]] == ["c", "b", "0", "a"]


def test_completions_skip_a_torn_record_and_serve_the_rest(client, store):
    add(store, call("sess-1"))
    directory = store.capture_dir / "sessions" / hashlib.sha256(b"sess-1").hexdigest()
    (directory / "0000-torn.json").write_bytes(b'{"schema_version": 1, "uu')
    body = client.get("/v1/sessions/sess-1/completions").json()
    assert len(body["completions"]) == 1
    assert body["skipped"] == 1


def test_ids_a_sanitiser_would_merge_stay_isolated(client, store):
    add(store, call("tenant.a", response=chat_response([1], [2])), call("tenant_a", response=chat_response([5], [6])))
    a = client.get("/v1/sessions/tenant.a/completions").json()["completions"]
    b = client.get("/v1/sessions/tenant_a/completions").json()["completions"]
    assert [r["prompt_token_ids"] for r in a] == [[1]]
    assert [r["prompt_token_ids"] for r in b] == [[5]]


def test_unknown_session_is_404(client, store):
    populate(store)
    for path in ("/v1/sessions/never/completions", "/v1/sessions/never/tree", "/v1/sessions/never/rollout"):
        error = assert_openai_error(client.get(path), 404)
        assert error["code"] == "session_not_found"
    assert_openai_error(client.delete("/v1/sessions/never"), 404)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sessions/%2E%2E/completions",
        "/v1/sessions/..%2F%20x/completions",
        "/v1/sessions/a%20b/completions",
        "/v1/sessions/a%0Ab/completions",
        "/v1/sessions/" + "x" * 201 + "/completions",
        "/v1/sessions/%2E%2E/tree",
        "/v1/sessions/%2E%2E/rollout",
    ],
)
def test_invalid_ids_are_404_and_never_reach_the_store(client, store, path, monkeypatch):
    (store.capture_dir / "secret.json").write_bytes(orjson.dumps({"secret": True}))
    (store.capture_dir / "sessions" / "secret.json").write_bytes(orjson.dumps({"secret": True}))

    def forbidden(*args, **kwargs):
        raise AssertionError("an invalid id reached the store")

    for name in ("read_completions", "session_info", "children", "delete_session"):
        monkeypatch.setattr(store, name, forbidden)
    response = client.get(path)
    assert response.status_code == 404
    assert "secret" not in response.text
    assert client.delete(path.rsplit("/", 1)[0]).status_code in (404, 405)


def test_tree_is_nested(client, store):
    populate(store)
    tree = client.get("/v1/sessions/root-1/tree").json()
    assert tree == {
        "session_id": "root-1",
        "parent_session_id": None,
        "parent_missing": False,
        "record_count": 1,
        "runs": [None],
        "children": [
            {
                "session_id": "sub-1",
                "parent_session_id": "root-1",
                "parent_missing": False,
                "record_count": 1,
                "runs": [None],
                "children": [
                    {
                        "session_id": "subsub",
                        "parent_session_id": "sub-1",
                        "parent_missing": False,
                        "record_count": 1,
                        "runs": [None],
                        "children": [],
                    }
                ],
            },
            {
                "session_id": "sub-2",
                "parent_session_id": "root-1",
                "parent_missing": False,
                "record_count": 1,
                "runs": [None],
                "children": [],
            },
        ],
    }
    assert client.get("/v1/sessions/sub-1/tree").json()["children"][0]["session_id"] == "subsub"


def test_tree_survives_a_parent_cycle(client, store):
    add(store, call("a", parent="b"), call("b", parent="a"))
    tree = client.get("/v1/sessions/a/tree").json()
    assert tree["children"][0]["session_id"] == "b"
    assert tree["children"][0]["children"] == []


def test_delete(client, store):
    populate(store)
    add(store, call("sub-2", parent="root-1"))
    response = client.delete("/v1/sessions/sub-2")
    assert response.status_code == 200
    assert response.json() == {"deleted": True, "session_id": "sub-2", "records": 2}
    assert_openai_error(client.get("/v1/sessions/sub-2/completions"), 404)
    assert "sub-2" not in [s["session_id"] for s in client.get("/v1/sessions").json()["sessions"]]
    assert [c["session_id"] for c in client.get("/v1/sessions/root-1/tree").json()["children"]] == ["sub-1"]
    assert_openai_error(client.delete("/v1/sessions/sub-2"), 404)


def test_a_session_whose_parent_never_made_a_call_is_a_root_marked_parent_missing(client, store):
    # A worker under a job id that itself never called the model: a root, or it would be in no tree at all.
    add(store, call("worker-1", parent="job-7"), call("root-1"), call("sub-1", parent="root-1"))
    roots = client.get("/v1/sessions", params={"roots_only": "true"}).json()["sessions"]
    assert [(s["session_id"], s["parent_session_id"], s["parent_missing"]) for s in roots] == [
        ("root-1", None, False),
        ("worker-1", "job-7", True),  # the recorded parent is kept, and said to be missing
    ]
    listed = client.get("/v1/sessions").json()["sessions"]
    assert {s["session_id"]: s["parent_missing"] for s in listed} == {"root-1": False, "sub-1": False, "worker-1": True}
    assert client.get("/v1/sessions/worker-1/tree").json()["parent_missing"] is True


def test_deleting_a_parent_never_hides_its_children(client, store):
    populate(store)
    assert client.delete("/v1/sessions/root-1").status_code == 200
    roots = client.get("/v1/sessions", params={"roots_only": "true"}).json()["sessions"]
    assert [(s["session_id"], s["parent_missing"]) for s in roots] == [
        ("root-2", False),
        ("sub-1", True),
        ("sub-2", True),
    ]
    # The orphan keeps its own sub-tree.
    assert [c["session_id"] for c in client.get("/v1/sessions/sub-1/tree").json()["children"]] == ["subsub"]


def test_capture_disabled_is_503():
    app = sessions_app(None)
    with TestClient(app) as test_client:
        error = assert_openai_error(test_client.get("/v1/sessions"), 503)
        assert error["code"] == "capture_disabled"


# ---- rollout endpoint -------------------------------------------------------------------------


@pytest.fixture
def fake_rollout(monkeypatch):
    """Stands in for the reconstruction: records how the endpoint calls it."""
    calls = []

    def reconstruct_tree(session_id, load_records, children_of, *, allow_partial=True, lost_records=None):
        calls.append({"session_id": session_id, "allow_partial": allow_partial, "lost": lost_records(session_id)})
        if session_id == "broken":
            raise RolloutError("record 0 prompt does not extend the reconstructed history")
        subagents = []
        stack = list(children_of(session_id))
        while stack:
            child = stack.pop(0)
            subagents.append({"session_id": child, "record_uuids": [r["uuid"] for r in load_records(child)]})
            stack.extend(children_of(child))
        return {
            "session_id": session_id,
            "record_uuids": [r["uuid"] for r in load_records(session_id)],
            "subagents": subagents,
        }

    monkeypatch.setattr(rebuilds, "reconstruct_tree", reconstruct_tree)
    return calls


def test_rollout_passes_records_children_and_allow_partial(client, store, fake_rollout):
    populate(store)
    body = client.get("/v1/sessions/root-1/rollout").json()
    assert body["session_id"] == "root-1"
    assert len(body["record_uuids"]) == 1
    assert [s["session_id"] for s in body["subagents"]] == ["sub-1", "sub-2", "subsub"]
    assert all(len(s["record_uuids"]) == 1 for s in body["subagents"])
    assert fake_rollout[-1]["allow_partial"] is True
    client.get("/v1/sessions/root-1/rollout", params={"allow_partial": "false"})
    assert fake_rollout[-1]["allow_partial"] is False
    assert_openai_error(client.get("/v1/sessions/root-1/rollout", params={"allow_partial": "perhaps"}), 400)


def test_rollout_reconstruction_error_is_422(client, store, fake_rollout):
    add(store, call("broken"))
    error = assert_openai_error(client.get("/v1/sessions/broken/rollout"), 422)
    assert "does not extend" in error["message"]


def test_real_rollout_of_a_two_call_session_with_a_subagent(client, store):
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "edit", "arguments": "{}"}}
    system = {"role": "system", "content": "You are helpful."}
    user = {"role": "user", "content": "Fix the bug."}
    first_reply = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    add(
        store,
        call(
            "root-r",
            messages=[system, user],
            response=chat_response([1, 2, 3], [4, 5], content=None, tool_calls=[tool_call]),
            captured_at="2026-01-01T00:00:01.000000+00:00",
        ),
        call(
            "root-r",
            messages=[system, user, first_reply, {"role": "tool", "tool_call_id": "call_1", "content": "edited ok"}],
            response=chat_response([1, 2, 3, 4, 5, 6], [7], content="All fixed."),
            captured_at="2026-01-01T00:00:02.000000+00:00",
        ),
        call("child-r", parent="root-r", messages=[user], response=chat_response([1, 9], [10], content="sub answer")),
    )
    response = client.get("/v1/sessions/root-r/rollout", params={"allow_partial": "false"})
    assert response.status_code == 200, response.text
    rollout = response.json()
    assert rollout["session_id"] == "root-r"
    assert rollout["partial_reason"] is None
    assert rollout["mask_sample"] is False
    assert len(rollout["record_uuids"]) == 2
    generated = [item for item in rollout["output"] if "generation_token_ids" in item]
    assert [item["generation_token_ids"] for item in generated] == [[4, 5], [7]]
    assert [s["session_id"] for s in rollout["subagents"]] == ["child-r"]
    assert rollout["subagents"][0]["parent_session_id"] == "root-r"


def test_real_rollout_rejects_a_broken_chain_when_strict(client, store):
    add(
        store,
        call("chain", response=chat_response([1, 2, 3], [4]), captured_at="2026-01-01T00:00:01.000000+00:00"),
        call(
            "chain",
            # Goes on with the conversation (not a new first call: that would be a new dispatch),
            # with tokens that do not extend it.
            messages=[
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "different"},
            ],
            response=chat_response([9, 9], [5]),
            captured_at="2026-01-01T00:00:02.000000+00:00",
        ),
    )
    strict = client.get("/v1/sessions/chain/rollout", params={"allow_partial": "false"})
    assert strict.status_code == 422
    lenient = client.get("/v1/sessions/chain/rollout").json()
    assert lenient["mask_sample"] is True
    assert len(lenient["record_uuids"]) == 1


def test_a_large_rollout_and_records_are_streamed_from_a_spool_file_with_their_length(store):
    """Over the inline size the body never sits in the server whole: it is sent from an unlinked
    file, piece by piece, with its Content-Length, and the bytes are those of a rollout kept whole."""
    from server.capture.read.rebuilds import RolloutBuilder

    add(
        store,
        call("big", response=chat_response(list(range(1, 4000)), [4000, 4001])),
        call("big", request_id="req-2", response=chat_response(list(range(1, 4003)), [5000])),
    )
    spooling = RolloutBuilder(store.sessions_dir, workers=0, inline_bytes=0)
    inline = RolloutBuilder(store.sessions_dir, workers=0)
    try:
        with TestClient(sessions_app(store, spooling)) as spooled_client:
            spooled = [spooled_client.get(f"/v1/sessions/big/{what}") for what in ("rollout", "completions")]
            missing = spooled_client.get("/v1/sessions/never/completions")
        with TestClient(sessions_app(store, inline)) as inline_client:
            whole = [inline_client.get(f"/v1/sessions/big/{what}") for what in ("rollout", "completions")]
    finally:
        spooling.close()
        inline.close()
    for spooled_one, whole_one in zip(spooled, whole, strict=True):
        assert spooled_one.status_code == whole_one.status_code == 200
        assert spooled_one.content == whole_one.content and len(spooled_one.content) > 2 * 4000
        assert spooled_one.headers["content-length"] == str(len(whole_one.content))
        assert "content-length" in whole_one.headers  # as a plain response has it
    assert [r["session_id"] for r in whole[1].json()["completions"]] == ["big", "big"]
    assert_openai_error(missing, 404)


def test_a_spooled_body_is_handed_to_a_server_that_sends_files_itself(store):
    """Where the HTTP server offers ASGI's pathsend (granian), the response names the spooled file
    and no byte of the body passes through the app; the file holds exactly the rollout."""
    import asyncio

    from server.capture.read.rebuilds import RolloutBuilder

    add(store, call("big", response=chat_response(list(range(1, 4000)), [4000, 4001])))
    spooling = RolloutBuilder(store.sessions_dir, workers=0, inline_bytes=0)
    app = sessions_app(store, spooling)
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    def get(extensions: dict) -> list[dict]:
        sent.clear()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/v1/sessions/big/rollout",
            "raw_path": b"/v1/sessions/big/rollout",
            "query_string": b"",
            "root_path": "",
            "headers": [],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 80),
            "extensions": extensions,
        }
        asyncio.run(app(scope, receive, send))
        return list(sent)

    try:
        with_pathsend = get({"http.response.pathsend": {}})
        assert [m["type"] for m in with_pathsend] == ["http.response.start", "http.response.pathsend"]
        with open(with_pathsend[1]["path"], "rb") as named:
            named_bytes = named.read()
        without = get({})  # the control: a server without the extension gets the bytes from the app
    finally:
        spooling.close()
    assert {m["type"] for m in without[1:]} == {"http.response.body"}
    body = b"".join(m["body"] for m in without[1:])
    assert named_bytes == body
    headers = dict(with_pathsend[0]["headers"])
    assert headers[b"content-length"] == str(len(body)).encode()
    assert headers[b"content-type"] == b"application/json"
    assert orjson.loads(body)["session_id"] == "big"


# ---- chains endpoint --------------------------------------------------------------------------


def test_chains_of_a_broken_session_cover_every_call_and_name_the_break(client, store):
    from tests.support.scripted_sessions import scripted

    records = scripted("broken-s", ["extend", "compact", "extend"])
    kid = scripted("kid-s", ["extend"], parent="broken-s")
    for record in records + kid:
        assert store.submit(record)
    assert store.flush(10)
    body = client.get("/v1/sessions/broken-s/chains").json()
    assert body["schema_version"] == 1 and body["session_id"] == "broken-s"
    assert [chain["record_uuids"] for chain in body["chains"]] == [
        [r["uuid"] for r in records[:2]],
        [r["uuid"] for r in records[2:]],
    ]
    assert body["breaks"][0]["kind"] == "compacted"
    assert body["trainable_fraction"] == 1.0 and body["rollout_fraction"] == 0.0
    assert [sub["session_id"] for sub in body["subagents"]] == ["kid-s"]
    rollout = client.get("/v1/sessions/broken-s/rollout").json()
    assert rollout["record_uuids"] == body["chains"][0]["record_uuids"]
    assert "the client compacted the history" in rollout["partial_reason"]


def test_chains_refuse_unknown_and_invalid_sessions_like_the_rollout(client, store):
    assert_openai_error(client.get("/v1/sessions/never/chains"), 404)
    assert_openai_error(client.get("/v1/sessions/%2E%2E/chains"), 404)
    assert_openai_error(client.get("/v1/sessions/never/chains", params={"run": "no such"}), 400)
