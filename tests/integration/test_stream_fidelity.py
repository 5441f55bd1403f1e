"""What a chat client gets is what the model server sent: nothing Switchyard adds on the way reaches it.

Switchyard asks the model server for usage on every stream (`stream_options.include_usage: true`,
even when the client did not), so the model server ends the stream with a usage-only chunk
(`"choices": []`). Relayed, that chunk breaks the most common client loop, `chunk.choices[0]`.
These tests compare, call by call, the mock model server's own answer to the same request with what
the client receives through the chain.
"""

from __future__ import annotations

import httpx
import orjson
import pytest
from openai import OpenAI

TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
PROMPT = 'hi there [[mock:reasoning]] [[mock:tool get {"a": 1}]]'


def sse_chunks(text: str) -> list[dict]:
    chunks = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = orjson.loads(line[6:])
            chunk.pop("id", None)
            chunk.pop("created", None)
            chunks.append(chunk)
    return chunks


def test_the_openai_docs_first_stream_loop_works(chain):
    client = OpenAI(base_url=chain.v1, api_key="dummy")
    stream = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Say this is a test"}],
        stream=True,
        extra_headers={"x-session-id": "docs-loop"},
    )
    text = ""
    for chunk in stream:
        text += chunk.choices[0].delta.content or ""  # IndexError on a usage-only chunk
    assert text.startswith("OK. You said: Say this is a test")
    # The usage is still known to the server: it is in the record.
    (record,) = chain.records("docs-loop", wait_s=10)
    assert record["usage"]["completion_tokens"] == len(record["generation_token_ids"])


@pytest.mark.parametrize("stream_options", [None, {"include_usage": False}, {"include_usage": True}])
@pytest.mark.parametrize("session", [None, "fidelity-captured"])
def test_a_chat_stream_arrives_as_the_model_server_sent_it(chain, stream_options, session):
    body: dict = {"model": "mock-model", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    body["tools"] = TOOLS
    if stream_options is not None:
        body["stream_options"] = stream_options
    direct = httpx.post(chain.upstream_url + "/v1/chat/completions", json=body, timeout=30)
    session_id = f"{session}-{orjson.dumps(stream_options).decode()}"  # e.g. fidelity-captured-{"include_usage":true}
    headers = {"x-session-id": session_id} if session else {}
    relayed = httpx.post(chain.v1 + "/chat/completions", json=body, headers=headers, timeout=30)
    assert relayed.status_code == 200
    expected, got = sse_chunks(direct.text), sse_chunks(relayed.text)
    # Chunk for chunk, field for field (apart from the completion id and time): nothing added, nothing lost.
    assert got == expected
    asked_for_usage = bool(stream_options and stream_options.get("include_usage"))
    assert (got[-1]["choices"] == [] and "usage" in got[-1]) is asked_for_usage
    if session:
        # Whatever the client asked, the record has the usage (the server asks for it upstream itself).
        (record,) = chain.records(session_id, wait_s=10)
        assert record["usage"]["prompt_tokens"] == len(record["prompt_token_ids"])


def test_a_non_stream_answer_arrives_as_the_model_server_sent_it(chain):
    body = {"model": "mock-model", "messages": [{"role": "user", "content": PROMPT}], "tools": TOOLS}
    direct = httpx.post(chain.upstream_url + "/v1/chat/completions", json=body, timeout=30).json()
    relayed = httpx.post(chain.v1 + "/chat/completions", json=body, headers={"x-session-id": "fidelity-plain"}).json()
    for answer in (direct, relayed):
        answer.pop("id")
        answer.pop("created")
    assert relayed == direct
