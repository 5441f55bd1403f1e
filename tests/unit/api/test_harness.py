"""The in-process harness itself (tests/support/inprocess.py): the lifespan runs both ways, scripted
answers reach the client through the production path, unscripted ones come from the mock engine, and
the example in docs/architecture.md ("Adding a route") runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from starlette.responses import PlainTextResponse

from tests.support.inprocess import ScriptedUpstream, in_process_server

REPO = Path(__file__).resolve().parents[3]
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def chat_answer(text: str) -> dict:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1,
        "model": "scripted-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def chunk(delta: dict, finish: str | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with in_process_server(tmp_path_factory.mktemp("harness")) as server:
        yield server


def test_the_lifespan_runs_on_start_and_on_stop(tmp_path):
    with in_process_server(tmp_path) as server:
        assert server.state.ready and server.state.upstream is not None
        assert server.get("/health").json()["status"] == "ok"
        # Attached to the scripted upstream: the routes came from its /v1/models (the mock engine's).
        assert server.state.route == "mock-model"
        assert (server.upstream.requests[0].method, server.upstream.requests[0].path) == ("GET", "/v1/models")
    assert not server.state.ready and server.state.upstream is None  # shutdown ran


def test_a_startup_failure_is_raised_not_hidden(tmp_path):
    """An upstream whose /v1/models fails: the lifespan's own error reaches the test, and nothing is left running."""
    down = ScriptedUpstream(fallback=PlainTextResponse("down", status_code=503))
    with pytest.raises(RuntimeError, match="cannot list Switchyard's routes"):
        with in_process_server(tmp_path, down):
            pass


def test_a_scripted_answer_is_translated_for_the_client(server):
    server.upstream.reply(json=chat_answer("scripted words"))
    reply = server.post("/v1/responses", {"input": "hello"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["output"][-1]["content"][0]["text"] == "scripted words"
    # What the server sent upstream, as the upstream received it: a chat call for the route.
    sent = server.upstream.model_calls[-1]
    assert sent.path == "/v1/chat/completions" and sent.json()["model"] == "mock-model"
    assert sent.json()["messages"][-1] == {"role": "user", "content": "hello"}


def test_unscripted_calls_go_to_the_mock_engine(server):
    """Negative control for the one above: without a script the mock engine answers (its directives work)."""
    reply = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "[[mock:say plain words]]"}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] != "scripted words"


def test_a_scripted_upstream_error_reaches_the_client_in_the_openai_shape(server):
    server.upstream.reply(429, {"error": {"message": "slow down", "type": "rate_limit", "param": None, "code": None}})
    reply = server.post("/v1/chat/completions", CHAT)
    assert reply.status_code == 429, reply.text
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def _stream_events(server) -> list[bytes]:
    reply = server.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert reply.status_code == 200
    return [line.removeprefix(b"data: ") for line in reply.content.splitlines() if line.startswith(b"data: ")]


@pytest.mark.parametrize(
    ("end", "code"),
    [("early", "upstream_stream_cut"), ("drop", "upstream_disconnected"), ("done", None)],
    ids=["ended before [DONE]", "connection dropped", "whole (negative control)"],
)
def test_a_scripted_stream_that_breaks_off_ends_in_an_error_event(server, end, code):
    server.upstream.stream([chunk({"role": "assistant", "content": "par"}), chunk({"content": "tial"})], end=end)
    events = _stream_events(server)
    assert b"par" in events[0] and b"tial" in events[1]  # what came before the break was relayed
    if code is None:
        assert events[-1] == b"[DONE]" and b'"error"' not in b"".join(events)
    else:
        error = orjson.loads(events[-1])["error"]
        assert error["code"] == code, error


def test_the_architecture_docs_example_runs(tmp_path):
    """docs/architecture.md's "Adding a route" test is run as written, so the example stays true."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Adding a route", 1)[1].split("\n## ", 1)[0]
    blocks = [block for block in re.findall(r"```python\n(.*?)```", section, re.S) if "def test_" in block]
    assert len(blocks) == 1, "the section shows one test"
    namespace: dict = {}
    exec(compile(blocks[0], "architecture.md", "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0](tmp_path)
