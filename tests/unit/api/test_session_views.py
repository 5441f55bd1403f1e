"""The viewer's reads: list filters and summaries, a session's timeline, one call; read-only `sessions view` app."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from server.viewer.offline import create_view_app
from tests.support.viewer_data import write_demo_sessions

FILLERS = 12


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    capture_dir = tmp_path_factory.mktemp("captures")
    write_demo_sessions(capture_dir, fillers=FILLERS)
    with TestClient(create_view_app(capture_dir), base_url="http://127.0.0.1") as client:
        yield client


def ids(client, **params) -> list[str]:
    response = client.get("/v1/sessions", params={"limit": 1000, **params})
    assert response.status_code == 200, response.text
    return [s["session_id"] for s in response.json()["sessions"]]


def test_the_plain_list_is_unchanged_and_summaries_are_opt_in(client):
    plain = client.get("/v1/sessions").json()["sessions"]
    assert set(plain[0]) == {
        "session_id",
        "parent_session_id",
        "parent_missing",
        "record_count",
        "first_captured_at",
        "last_captured_at",
        "runs",
        "identified_by",
    }
    rich = client.get("/v1/sessions", params={"summary": "true", "q": "agent-main"}).json()["sessions"]
    summary = rich[0]["summary"]
    assert summary["calls"] == rich[0]["record_count"] == 3
    assert summary["finish_reasons"] == {"tool_calls": 2, "stop": 1}
    assert summary["rollout"] == "whole" and summary["models"] == ["mock-model"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"q": "MAIN"}, ["agent-main", "agent-main-sub1"]),
        ({"kind": "child"}, ["agent-main-sub1"]),
        ({"kind": "root", "q": "agent"}, ["agent-main"]),
        ({"roots_only": "true", "q": "agent"}, ["agent-main"]),
        ({"status": "partial"}, ["broken-reasoning"]),
        ({"status": "masked"}, ["broken-reasoning"]),
        # broken-reasoning has an "s" too, but its rollout is partial.
        ({"status": "whole", "q": "s"}, ["agent-main-sub1", "xss-session"]),
        ({"model": "MODEL-B"}, [f"filler-{i:03d}" for i in range(1, FILLERS, 2)]),
        ({"route": "route-x"}, [f"filler-{i:03d}" for i in range(0, FILLERS, 2)]),
        ({"since": "2025-03-02T00:00:00Z"}, [f"filler-{i:03d}" for i in range(FILLERS // 2, FILLERS)]),
        ({"until": "2025-03-01T23:59:59+00:00", "q": "filler"}, [f"filler-{i:03d}" for i in range(FILLERS // 2)]),
        ({"parent": "agent-main"}, ["agent-main-sub1"]),
    ],
)
def test_list_filters(client, params, expected):
    assert ids(client, **params) == expected


def test_filtered_pages_follow_on_without_gaps_or_repeats(client):
    seen, after = [], None
    while True:
        page = client.get(
            "/v1/sessions", params={"model": "model-a", "limit": 2, **({"after": after} if after else {})}
        )
        body = page.json()
        seen += [s["session_id"] for s in body["sessions"]]
        assert len(body["sessions"]) <= 2
        if not body["has_more"]:
            break
        after = body["next_after"]
    assert seen == [f"filler-{i:03d}" for i in range(0, FILLERS, 2)]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"status": "done"}, "status"),
        ({"kind": "leaf"}, "kind"),
        ({"since": "yesterday"}, "since"),
        ({"summary": "maybe"}, "summary"),
        ({"q": "x" * 201}, "q"),
        ({"roots_only": "true", "kind": "child"}, "kind"),
        ({"after": "../ x"}, "after"),
    ],
)
def test_bad_list_parameters_are_a_400_naming_the_parameter(client, params, param):
    response = client.get("/v1/sessions", params=params)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_timeline_of_a_session_with_a_subagent(client):
    body = client.get("/v1/sessions/agent-main/timeline").json()
    assert [c["index"] for c in body["calls"]] == [0, 1, 2]
    assert [c["contiguity"]["kind"] for c in body["calls"]] == ["first", "extends", "extends"]
    assert body["calls"][1]["spawned"] == ["agent-main-sub1"]
    assert body["tree"]["children"][0]["spawned_by"] == body["calls"][1]["uuid"]
    assert body["summary"]["calls"] == 3 and body["rollout"]["status"] == "whole"
    # Served from the cache the second time, identically.
    assert client.get("/v1/sessions/agent-main/timeline").json() == body


def test_one_call_has_its_tokens_and_texts(client):
    timeline = client.get("/v1/sessions/xss-session/timeline").json()
    uuid = timeline["calls"][-1]["uuid"]
    record = client.get(f"/v1/sessions/xss-session/completions/{uuid}").json()
    assert record["uuid"] == uuid
    assert len(record["generation_token_texts"]) == len(record["generation_token_ids"])
    assert client.get("/v1/sessions/xss-session/completions/nope").status_code == 404
    # A call of another session is not served under this one.
    other = client.get("/v1/sessions/agent-main/timeline").json()["calls"][0]["uuid"]
    assert client.get(f"/v1/sessions/xss-session/completions/{other}").json()["error"]["code"] == "call_not_found"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sessions/..%2F..%2Fetc/timeline",
        "/v1/sessions/.hidden/timeline",
        "/v1/sessions/nobody/timeline",
        "/v1/sessions/agent-main/completions/..%2Fx",
        "/v1/sessions/agent-main/completions/.x",
    ],
)
def test_bad_or_unknown_ids_are_404_in_the_openai_shape(client, path):
    response = client.get(path)
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_the_view_app_is_read_only(client):
    response = client.delete("/v1/sessions/agent-main")
    assert response.status_code in (404, 405)  # no delete route at all
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert "agent-main" in ids(client)


def test_the_ui_is_served_with_its_security_headers(client):
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and "app.js" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    script = client.get("/ui/session.js")
    assert script.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert client.get("/ui/../server/viewer/offline.py").status_code == 404


@pytest.mark.integration
def test_a_timeline_is_built_in_the_rebuild_worker_and_matches_the_one_built_in_a_thread(tmp_path):
    """Looking at a long session must not hold the serving interpreter: the records are read and
    compared in the worker process; the answer is the same as the thread-built one."""
    from server.api import session_views
    from server.capture.read.rebuilds import RolloutBuilder
    from server.capture.store import CaptureStore
    from tests.support.session_apps import sessions_app

    capture_dir = tmp_path / "captures"
    write_demo_sessions(capture_dir, fillers=FILLERS)
    store = CaptureStore(capture_dir)
    store.start()
    builder = RolloutBuilder(store.sessions_dir, workers=1)
    ran = []
    real_run = builder.run

    async def spying_run(fn, *args):
        ran.append(fn.__name__)
        return await real_run(fn, *args)

    builder.run = spying_run
    try:
        app = sessions_app(store, builder, routes=session_views.routes)
        with TestClient(app) as worker_client:
            in_worker = worker_client.get("/v1/sessions/agent-main/timeline")
            missing = worker_client.get("/v1/sessions/never-was/timeline")
        with TestClient(sessions_app(store, routes=session_views.routes)) as thread_client:
            in_thread = thread_client.get("/v1/sessions/agent-main/timeline")
    finally:
        builder.close()
        store.close()
    assert in_worker.status_code == 200, in_worker.text
    assert ran == ["timeline_parts"]
    assert in_worker.json() == in_thread.json()
    assert in_worker.json()["tree"]["children"] and in_worker.json()["summary"]["calls"] == 3
    assert missing.status_code == 404
