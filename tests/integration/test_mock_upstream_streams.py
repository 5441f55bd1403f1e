"""The mock upstream as a real process: streams chunk by chunk, pacing, disconnects, stream cuts."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import orjson
import pytest

from server.dev.mock_upstream.generation import filler_text
from tests.support.mock_chat import SYSTEM, TOKEN_EXTRAS, TOOLS, user
from tests.support.procs import start_mock_upstream, wait_for


@pytest.fixture(scope="module")
def upstream():
    proc, url = start_mock_upstream()
    try:
        yield proc, url
    finally:
        proc.stop()


def sse_events(response: httpx.Response) -> list[Any]:
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def stream_chat(url: str, messages: list[dict[str, Any]], tools: list[Any] | None = None, **extra: Any) -> list[Any]:
    body = {"model": "mock-model", "messages": messages, "stream": True, **extra}
    if tools is not None:
        body["tools"] = tools
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            return sse_events(response)


def wait_for_stats(url: str, predicate, timeout: float = 5.0) -> dict[str, int]:
    """The mock's counters once `predicate` holds for them (or as they are when `timeout` passes)."""
    polled: list[dict[str, int]] = []

    def holds() -> bool:
        polled.append(httpx.get(url + "/mock/stats").json())
        return predicate(polled[-1])

    wait_for(holds, timeout, interval=0.02)
    return polled[-1]


@pytest.mark.parametrize(
    "text",
    [
        "hello there, stream me something",
        'think and call [[mock:reasoning]] [[mock:tool bash {"command": "echo hi", "env": {"A": "1"}}]] '
        '[[mock:tool read {"path": "README.md"}]]',
    ],
)
def test_stream_matches_non_stream_chunk_by_chunk(upstream, text: str) -> None:
    _, url = upstream
    messages = [SYSTEM, user(text)]
    extras = {**TOKEN_EXTRAS, "stream_options": {"include_usage": True}}
    events = stream_chat(url, messages, TOOLS, **extras)
    whole = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "tools": TOOLS, **TOKEN_EXTRAS}).json()
    choice = whole["choices"][0]

    assert events[-1] == "[DONE]"
    first, chunks, usage = events[0], events[1:-2], events[-2]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks)
    assert len({e["id"] for e in events[:-1]}) == 1

    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    *content_chunks, final = chunks
    assert final["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in content_chunks)

    ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    assert ids == choice["token_ids"]
    logprobs = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert logprobs == choice["logprobs"]["content"]
    for chunk in content_chunks:  # one visible token per chunk by default
        entry_tokens = chunk["choices"][0]["token_ids"]
        assert entry_tokens and len(chunk["choices"][0]["logprobs"]["content"]) == len(entry_tokens)

    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    assert content == (choice["message"]["content"] or "")
    assert reasoning == (choice["message"]["reasoning_content"] or "")
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for delta in chunk["choices"][0]["delta"].get("tool_calls", []):
            if "id" in delta:
                assert delta["index"] not in calls and delta["type"] == "function"
                calls[delta["index"]] = {
                    "id": delta["id"],
                    "type": "function",
                    "function": {"name": delta["function"]["name"], "arguments": ""},
                }
            calls[delta["index"]]["function"]["arguments"] += delta["function"].get("arguments", "")
    assert [calls[i] for i in sorted(calls)] == choice["message"]["tool_calls"]


def test_stream_without_extras_and_with_bigger_chunks(upstream) -> None:
    _, url = upstream
    events = stream_chat(url, [user("[[mock:tokens 40]] [[mock:chunk 8]]")])
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])  # no usage chunk unless asked
    assert all("token_ids" not in e["choices"][0] and e["choices"][0]["logprobs"] is None for e in events[:-1])
    assert all("prompt_token_ids" not in e for e in events[:-1])
    text_chunks = [e for e in events[1:-2]]
    assert len(text_chunks) == 5
    assert "".join(e["choices"][0]["delta"]["content"] for e in text_chunks) == filler_text(40)


def test_openai_sdk_reads_the_stream(upstream) -> None:
    openai = pytest.importorskip("openai")
    _, url = upstream
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-local", http_client=httpx.Client())
    stream = client.chat.completions.create(
        model="mock-model",
        messages=[user('[[mock:tool bash {"command": "pwd"}]]')],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    arguments, names, finish, usage = "", [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                arguments += (call.function.arguments or "") if call.function else ""
    assert names == ["bash"] and json.loads(arguments) == {"command": "pwd"} and finish == "tool_calls"
    assert usage is not None and usage.completion_tokens > 0


def test_stream_cancellation_is_counted(upstream) -> None:
    _, url = upstream
    httpx.post(url + "/mock/reset")
    body = {"messages": [user("[[mock:tokens 200]] [[mock:slow 50]]")], "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(6)) if line]
            assert received and received[0].startswith("data: ")
            assert httpx.get(url + "/mock/stats").json()["in_flight"] == 1
    stats = wait_for_stats(url, lambda s: s["cancelled"] == 1 and s["in_flight"] == 0)
    assert stats["cancelled"] == 1 and stats["in_flight"] == 0 and stats["completed"] == 0


def test_hang_and_sleep(upstream) -> None:
    _, url = upstream
    httpx.post(url + "/mock/reset")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", json={"messages": [user("[[mock:hang 10]]")]}, timeout=0.3)
    stats = wait_for_stats(url, lambda s: s["cancelled"] == 1)
    assert stats["cancelled"] == 1 and stats["in_flight"] == 0

    started = time.monotonic()
    answer = httpx.post(url + "/v1/chat/completions", json={"messages": [user("[[mock:sleep 300]]")]}, timeout=10)
    assert answer.status_code == 200 and time.monotonic() - started >= 0.3

    # Streams: headers at once, the first chunk after the sleep, then `slow` between chunks.
    body = {"messages": [user("[[mock:sleep 300]] [[mock:slow 100]] [[mock:tokens 2]]")], "stream": True}
    with httpx.Client(timeout=10) as client:
        started = time.monotonic()
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            headers_at = time.monotonic() - started
            arrivals = []
            for line in response.iter_lines():
                if line:
                    arrivals.append(time.monotonic() - started)
    assert arrivals[0] >= 0.3 and headers_at < arrivals[0]  # headers first, the first chunk after the sleep
    assert arrivals[-1] - arrivals[0] >= 0.1 * (len(arrivals) - 1) * 0.9


def test_streamcut_drops_the_connection(upstream) -> None:
    proc, url = upstream
    httpx.post(url + "/mock/reset")
    body = {"messages": [user("[[mock:streamcut 3]] [[mock:tokens 20]]")], "stream": True}
    received = []
    with httpx.Client(timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if line:
                        received.append(line)
    assert len(received) == 3 and "data: [DONE]" not in received
    stats = wait_for_stats(url, lambda s: s["cut"] == 1)
    assert stats["cut"] == 1 and stats["in_flight"] == 0
    assert "Traceback" not in proc.output()
