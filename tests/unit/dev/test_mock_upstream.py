"""Tests for the deterministic vLLM-compatible mock upstream: template, tokens, directives, streams."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.dev.mock_upstream import (
    GENERATION_PROMPT,
    IM_END_ID,
    SPECIAL_TOKENS,
    Tokenizer,
    canonical_arguments,
    create_app,
    filler_text,
    parse_directives,
    piece_id,
    render_prompt,
    split_pieces,
)
from tests.support.procs import start_mock_upstream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "task",
            "description": "Start a sub-agent",
            "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}}},
        },
    },
]
SYSTEM = {"role": "system", "content": "You are a coding agent. Be brief."}
TOKEN_EXTRAS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}

tokenizer = Tokenizer()


class AppClient:
    """Synchronous calls into the app through httpx.ASGITransport (non-stream answers only)."""

    def __init__(self, **kw: Any) -> None:
        self.app = create_app(**kw)

    async def _request(self, method: str, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mock") as client:
            if content is not None:
                return await client.request(method, path, content=content, headers={"content-type": "application/json"})
            return await client.request(method, path, json=body)

    def post(self, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
        return asyncio.run(self._request("POST", path, body, content))

    def get(self, path: str) -> httpx.Response:
        return asyncio.run(self._request("GET", path))

    def chat(self, messages: list[dict[str, Any]], tools: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "mock-model", "messages": messages, **extra}
        if tools is not None:
            body["tools"] = tools
        response = self.post("/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture()
def app() -> AppClient:
    return AppClient()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant_from(answer: dict[str, Any], reserialise=lambda args: args) -> dict[str, Any]:
    """The assistant message a client would send back next turn (arguments re-serialised its way)."""
    message = answer["choices"][0]["message"]
    out: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
    if message["tool_calls"]:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": reserialise(c["function"]["arguments"])},
            }
            for c in message["tool_calls"]
        ]
    return out


def ids_of(answer: dict[str, Any]) -> tuple[list[int], list[int]]:
    return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]


# --------------------------------------------------------------------------------------------
# Tokenizer and template
# --------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_pieces_cover_the_text_exactly(text: str) -> None:
    assert "".join(split_pieces(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_reply_ids_reappear_unchanged_after_the_generation_prompt(body: str) -> None:
    # The header rule: whatever the reply starts with (spaces, newlines), the next turn's
    # tokenisation of "<|im_start|>assistant\n" + reply + "<|im_end|>" keeps the reply's ids.
    whole = tokenizer.encode(GENERATION_PROMPT + body + "<|im_end|>\n")
    assert whole == tokenizer.encode(GENERATION_PROMPT) + tokenizer.encode(body) + [IM_END_ID] + tokenizer.encode("\n")


def test_token_ids_are_fixed() -> None:
    assert tokenizer.encode("<|im_start|>user\nHello, world!<|im_end|>") == [
        1,
        piece_id("user"),
        piece_id("\n"),
        piece_id("Hello"),
        piece_id(","),
        piece_id(" world"),
        piece_id("!"),
        2,
    ]
    assert SPECIAL_TOKENS["<|im_start|>"] == 1 and SPECIAL_TOKENS["<|im_end|>"] == 2
    assert all(1000 <= piece_id(p) < 101000 for p in ("a", " b", "!!", "\n\n"))
    assert split_pieces("x  y\tz_1 (ok)") == ["x", "  ", "y", "\t", "z_1", " (", "ok", ")"]
    assert len(tokenizer.encode(filler_text(37))) == 37


def test_template_renders_arguments_canonically() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls",  "n": [1, 2]}'},
    }
    compact = {**call, "function": {"name": "bash", "arguments": '{"command":"ls","n":[1,2]}'}}
    base = [SYSTEM, user("hi")]
    spaced = render_prompt([*base, {"role": "assistant", "content": "", "tool_calls": [call]}], TOOLS)
    tight = render_prompt([*base, {"role": "assistant", "content": None, "tool_calls": [compact]}], TOOLS)
    assert spaced == tight
    assert '<tool_call>\n{"name":"bash","arguments":{"command":"ls","n":[1,2]}}\n</tool_call>' in spaced
    assert canonical_arguments("not json") == '"not json"'
    # Tools go into the first system block; the prompt ends with the generation prompt.
    assert spaced.startswith("<|im_start|>system\nYou are a coding agent. Be brief.\n\n# Tools")
    assert spaced.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_directive_parser() -> None:
    d = parse_directives(
        'go [[mock:tool bash {"command": "ls ]]"}]] [[mock:reasoning]] [[mock:slow 5]] [[mock:bogus 1]]'
    )
    assert d.steps[0].tools == [("bash", {"command": "ls ]]"})]
    assert d.reasoning and d.slow_ms == 5
    assert "bogus" in d.stripped_text and "bash" not in d.stripped_text
    # Malformed ones are plain text.
    assert parse_directives("[[mock:length x]] [[mock:tool]] [[mock:error 200]]").steps[0].length is None
    assert parse_directives("[[mock:error 200]]").error is None
    d = parse_directives("[[mock:error 429 2.5 times=3]]")
    assert d.error == (429, 2.5, 3)


# --------------------------------------------------------------------------------------------
# Non-stream answers through the app
# --------------------------------------------------------------------------------------------


def test_default_reply_shape_and_token_exactness(app: AppClient) -> None:
    answer = app.chat([SYSTEM, user("please summarise the repository layout")], TOOLS, **TOKEN_EXTRAS)
    assert answer["object"] == "chat.completion" and answer["model"] == "mock-model"
    choice = answer["choices"][0]
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] == "OK. You said: please summarise the repository layout"
    assert message["reasoning_content"] is None and message["tool_calls"] == []
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    prompt, generated = ids_of(answer)
    assert prompt == tokenizer.encode(render_prompt([SYSTEM, user("please summarise the repository layout")], TOOLS))
    assert generated == tokenizer.encode(message["content"]) + [IM_END_ID]
    assert answer["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(generated),
        "total_tokens": len(prompt) + len(generated),
    }
    entries = choice["logprobs"]["content"]
    assert [int(e["token"].removeprefix("token_id:")) for e in entries] == generated
    assert all(math.isfinite(e["logprob"]) and e["logprob"] < 0 and e["top_logprobs"] == [] for e in entries)


def test_extras_absent_unless_asked(app: AppClient) -> None:
    answer = app.chat([user("hello")])
    assert "prompt_token_ids" not in answer and "token_ids" not in answer["choices"][0]
    assert answer["choices"][0]["logprobs"] is None
    assert answer["usage"]["completion_tokens"] == len(tokenizer.encode("OK. You said: hello")) + 1


def test_deterministic_across_requests_and_apps() -> None:
    messages = [SYSTEM, user('look [[mock:tool bash {"command": "ls"}]] [[mock:reasoning]]')]
    answers = [AppClient().chat(messages, TOOLS, **TOKEN_EXTRAS) for _ in range(2)]
    answers.append(AppClient().chat(messages, TOOLS, **TOKEN_EXTRAS))
    for answer in answers:
        answer.pop("id"), answer.pop("created")
    assert answers[0] == answers[1] == answers[2]


def test_logprob_formats(app: AppClient) -> None:
    messages = [user("tell me")]
    as_ids = app.chat(messages, return_token_ids=True, logprobs=True, top_logprobs=3, return_tokens_as_token_ids=True)
    as_text = app.chat(messages, return_token_ids=True, logprobs=True, top_logprobs=3)
    generated = as_ids["choices"][0]["token_ids"]
    for entry_ids, entry_text, token_id in zip(
        as_ids["choices"][0]["logprobs"]["content"],
        as_text["choices"][0]["logprobs"]["content"],
        generated,
        strict=True,
    ):
        assert entry_ids["token"] == f"token_id:{token_id}"
        assert entry_ids["bytes"] == list(entry_ids["token"].encode())
        assert entry_ids["logprob"] == entry_text["logprob"]
        top = entry_ids["top_logprobs"]
        assert len(top) == 3 and top[0]["token"] == entry_ids["token"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert all(t["token"].startswith("token_id:") for t in top)
    texts = [e["token"] for e in as_text["choices"][0]["logprobs"]["content"]]
    assert "".join(texts) == "OK. You said: tell me<|im_end|>"
    assert (
        app.post("/v1/chat/completions", {"messages": messages, "logprobs": True, "top_logprobs": 21}).status_code
        == 400
    )


def test_tokenize_agrees_with_prompt_token_ids(app: AppClient) -> None:
    messages = [
        SYSTEM,
        user("count me"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "print(1)\n"},
    ]
    answer = app.chat(messages, TOOLS, return_token_ids=True)
    tokenized = app.post("/tokenize", {"model": "mock-model", "messages": messages, "tools": TOOLS}).json()
    assert tokenized["tokens"] == answer["prompt_token_ids"]
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == 32768
    # The rendered prompt as one string tokenises the same way as the per-message blocks.
    as_prompt = app.post("/tokenize", {"prompt": render_prompt(messages, TOOLS), "return_token_strs": True}).json()
    assert as_prompt["tokens"] == answer["prompt_token_ids"]
    assert "".join(as_prompt["token_strs"]) == render_prompt(messages, TOOLS)
    without = app.post("/tokenize", {"messages": messages, "tools": TOOLS, "add_generation_prompt": False}).json()
    assert without["tokens"] == answer["prompt_token_ids"][: -len(tokenizer.encode(GENERATION_PROMPT))]
    assert app.post("/tokenize", {"nothing": 1}).status_code == 400


@pytest.mark.parametrize("style", ["verbatim", "compact", "spaced", "reordered-spacing"])
def test_prefix_property_over_three_turns(app: AppClient, style: str) -> None:
    reserialise = {
        "verbatim": lambda a: a,
        "compact": lambda a: json.dumps(json.loads(a), separators=(",", ":")),  # what opencode sends back
        "spaced": lambda a: json.dumps(json.loads(a)),
        "reordered-spacing": lambda a: json.dumps(json.loads(a), indent=2),
    }[style]
    first = [SYSTEM, user('list files [[mock:tool bash {"command": "ls -la", "timeout": 30}]]')]
    turn1 = app.chat(first, TOOLS, **TOKEN_EXTRAS)
    assert turn1["choices"][0]["finish_reason"] == "tool_calls"
    call = turn1["choices"][0]["message"]["tool_calls"][0]
    second = [
        *first,
        assistant_from(turn1, reserialise),
        {"role": "tool", "tool_call_id": call["id"], "content": "a.py\nb.py\n"},
    ]
    turn2 = app.chat(second, TOOLS, **TOKEN_EXTRAS)
    assert turn2["choices"][0]["message"]["content"].startswith("Done.")
    third = [*second, assistant_from(turn2), user("thanks, now stop")]
    turn3 = app.chat(third, TOOLS, **TOKEN_EXTRAS)

    for before, after in ((turn1, turn2), (turn2, turn3)):
        prompt, generated = ids_of(before)
        history = prompt + generated
        assert ids_of(after)[0][: len(history)] == history
        assert generated[-1] == IM_END_ID
        # The template's newline after <|im_end|> follows the generated ids.
        assert ids_of(after)[0][len(history)] == piece_id("\n")


def test_prefix_property_holds_with_reasoning_echoed_back(app: AppClient) -> None:
    first = [user("think first [[mock:reasoning]]")]
    turn1 = app.chat(first, **TOKEN_EXTRAS)
    message = turn1["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"].startswith("OK. You said: think first")
    assert turn1["choices"][0]["token_ids"][0] == SPECIAL_TOKENS["<think>"]
    echoed = {"role": "assistant", "content": message["content"], "reasoning_content": message["reasoning_content"]}
    turn2 = app.chat([*first, echoed, user("and then?")], **TOKEN_EXTRAS)
    history = turn1["prompt_token_ids"] + turn1["choices"][0]["token_ids"]
    assert turn2["prompt_token_ids"][: len(history)] == history


def test_drift_breaks_retokenisation(app: AppClient) -> None:
    for drift, holds in (("", True), (" [[mock:drift]]", False)):
        first = [user("say something" + drift)]
        turn1 = app.chat(first, **TOKEN_EXTRAS)
        turn2 = app.chat([*first, assistant_from(turn1), user("again")], **TOKEN_EXTRAS)
        prompt, generated = ids_of(turn1)
        assert turn2["prompt_token_ids"][: len(prompt)] == prompt
        assert (turn2["prompt_token_ids"][: len(prompt) + len(generated)] == prompt + generated) is holds
    # Same text either way; only its tokenisation differs.
    plain = app.chat([user("say something")], **TOKEN_EXTRAS)["choices"][0]
    drifted = app.chat([user("say something [[mock:drift]]")], **TOKEN_EXTRAS)["choices"][0]
    assert drifted["message"]["content"] == plain["message"]["content"]
    assert len(drifted["token_ids"]) == len(plain["token_ids"]) + 1


# --------------------------------------------------------------------------------------------
# Directives
# --------------------------------------------------------------------------------------------


def test_tool_directive_needs_the_tool(app: AppClient) -> None:
    messages = [user('[[mock:tool bash {"command": "ls"}]]')]
    without = app.chat(messages)["choices"][0]
    assert without["finish_reason"] == "stop" and without["message"]["tool_calls"] == []
    with_other = app.chat(messages, [TOOLS[1]])["choices"][0]
    assert with_other["finish_reason"] == "stop"
    none_choice = app.chat(messages, TOOLS, tool_choice="none")["choices"][0]
    assert none_choice["finish_reason"] == "stop"
    called = app.chat(messages, TOOLS)["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None
    assert called["message"]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command":"ls"}'}
    assert called["message"]["tool_calls"][0]["id"].startswith("chatcmpl-tool-")


def test_parallel_tool_calls(app: AppClient) -> None:
    messages = [user('[[mock:tool read {"path": "a"}]] then [[mock:tool read {"path": "b"}]] [[mock:tool nope]]')]
    choice = app.chat(messages, TOOLS, return_token_ids=True)["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"path": "a"}, {"path": "b"}]
    assert len({c["id"] for c in calls}) == 2
    assert choice["token_ids"].count(SPECIAL_TOKENS["<tool_call>"]) == 2


def test_nested_directive_fires_only_in_the_sub_agent(app: AppClient) -> None:
    task_prompt = 'inspect the tree [[mock:tool bash {"command": "find ."}]]'
    parent = [SYSTEM, user("delegate [[mock:tool task " + json.dumps({"prompt": task_prompt}) + "]]")]
    calls = app.chat(parent, TOOLS)["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["task"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"prompt": task_prompt}
    child = [SYSTEM, user(task_prompt)]
    child_calls = app.chat(child, TOOLS[:2])["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in child_calls] == [
        ("bash", {"command": "find ."})
    ]


def test_tool_result_ends_the_loop_and_next_scripts_more_steps(app: AppClient) -> None:
    messages = [user('[[mock:tool read {"path": "x"}]] [[mock:next]] [[mock:tool bash {"command": "ls"}]]')]
    names = []
    for _ in range(3):
        choice = app.chat(messages, TOOLS)["choices"][0]
        calls = choice["message"]["tool_calls"]
        if not calls:
            break
        names.append(calls[0]["function"]["name"])
        messages = [
            *messages,
            assistant_from({"choices": [choice]}),
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": f"output of {names[-1]}"},
        ]
    assert names == ["read", "bash"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "Done. The tool said: output of bash"


def test_length_and_tokens(app: AppClient) -> None:
    cut = app.chat([user("[[mock:length 7]]")], return_token_ids=True)["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 7 and IM_END_ID not in cut["token_ids"]
    assert tokenizer.encode(cut["message"]["content"]) == cut["token_ids"]
    # The cut reply sent back next turn still extends the token history (then <|im_end|> follows).
    first = [user("[[mock:length 7]]")]
    turn1 = app.chat(first, return_token_ids=True)
    turn2 = app.chat([*first, assistant_from(turn1), user("go on")], return_token_ids=True)
    history = turn1["prompt_token_ids"] + turn1["choices"][0]["token_ids"]
    assert turn2["prompt_token_ids"][: len(history) + 1] == history + [IM_END_ID]
    exact = app.chat([user("[[mock:tokens 50]]")], return_token_ids=True)["choices"][0]
    assert exact["finish_reason"] == "stop" and len(exact["token_ids"]) == 51
    assert len(tokenizer.encode(exact["message"]["content"])) == 50
    capped = app.chat([user("[[mock:tokens 50]]")], return_token_ids=True, max_tokens=10)["choices"][0]
    assert capped["finish_reason"] == "length" and capped["token_ids"] == exact["token_ids"][:10]
    # EOS counts against max_tokens, as in vLLM: 50 text tokens + <|im_end|> do not fit in 50.
    assert app.chat([user("[[mock:tokens 50]]")], max_tokens=50)["choices"][0]["finish_reason"] == "length"
    assert app.chat([user("[[mock:tokens 50]]")], max_tokens=51)["choices"][0]["finish_reason"] == "stop"
    said = app.chat([user("[[mock:say Exactly this.]]")])["choices"][0]["message"]["content"]
    assert said == "Exactly this."


def test_scripted_errors(app: AppClient) -> None:
    response = app.post("/v1/chat/completions", {"messages": [user("[[mock:error 503]]")]})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "mock_error" and "retry-after" not in response.headers
    limited = app.post("/v1/chat/completions", {"messages": [user("[[mock:error 429]]")]})
    assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert app.post("/v1/chat/completions", {"messages": [user("[[mock:error 429 0]]")]}).headers["retry-after"] == "0"
    flaky = {"messages": [user("[[mock:error 500 times=2]]")]}
    assert [app.post("/v1/chat/completions", flaky).status_code for _ in range(3)] == [500, 500, 200]
    bad = app.post("/v1/chat/completions", {"messages": [user("[[mock:badjson]]")]})
    assert bad.status_code == 200
    with pytest.raises(ValueError):
        json.loads(bad.text)


def test_request_validation_and_context_length() -> None:
    small = AppClient(max_model_len=64)
    bad_json = small.post("/v1/chat/completions", content=b"{nope")
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"
    assert small.post("/v1/chat/completions", {"model": "m"}).status_code == 400
    assert small.post("/v1/chat/completions", {"messages": [user("x")], "n": 2}).status_code == 400
    too_long = small.post("/v1/chat/completions", {"messages": [user("word " * 100)]})
    assert too_long.status_code == 400 and "maximum context length is 64 tokens" in too_long.json()["error"]["message"]
    # A generation budget beyond the context is clamped to what is left (finish "length").
    messages = [user("hi [[mock:tokens 100]]")]
    clamped = small.post(
        "/v1/chat/completions", {"messages": messages, "max_tokens": 32000, "return_token_ids": True}
    ).json()
    assert clamped["choices"][0]["finish_reason"] == "length"
    assert len(clamped["prompt_token_ids"]) + len(clamped["choices"][0]["token_ids"]) == 64


def test_models_health_and_observation_endpoints(app: AppClient) -> None:
    models = app.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "mock-model" and models["data"][0]["max_model_len"] == 32768
    assert app.get("/health").status_code == 200
    app.chat([user("first")])
    app.post("/v1/chat/completions", {"messages": [user("[[mock:error 500]]")]})
    logged = app.get("/mock/requests").json()["requests"]
    assert [r["path"] for r in logged] == ["/v1/chat/completions"] * 2
    assert (
        logged[0]["body"]["messages"] == [user("first")] and logged[0]["headers"]["content-type"] == "application/json"
    )
    assert len(app.get("/mock/requests?last=1").json()["requests"]) == 1
    stats = app.get("/mock/stats").json()
    assert stats["requests"] == 2 and stats["completed"] == 2 and stats["errors"] == 1 and stats["in_flight"] == 0
    assert app.post("/mock/reset").status_code == 200
    assert app.get("/mock/requests").json()["requests"] == []
    assert app.get("/mock/stats").json()["requests"] == 0


# --------------------------------------------------------------------------------------------
# A real process: streams, timing, disconnects
# --------------------------------------------------------------------------------------------


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
    with httpx.Client(timeout=30, trust_env=False) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            return sse_events(response)


def wait_for_stats(url: str, predicate, timeout: float = 5.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(url + "/mock/stats", trust_env=False).json()
        if predicate(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


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
    whole = httpx.post(
        url + "/v1/chat/completions", json={"messages": messages, "tools": TOOLS, **TOKEN_EXTRAS}, trust_env=False
    ).json()
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
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-local", http_client=httpx.Client(trust_env=False))
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
    httpx.post(url + "/mock/reset", trust_env=False)
    body = {"messages": [user("[[mock:tokens 200]] [[mock:slow 50]]")], "stream": True}
    with httpx.Client(timeout=30, trust_env=False) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(6)) if line]
            assert received and received[0].startswith("data: ")
            assert httpx.get(url + "/mock/stats", trust_env=False).json()["in_flight"] == 1
    stats = wait_for_stats(url, lambda s: s["cancelled"] == 1 and s["in_flight"] == 0)
    assert stats["cancelled"] == 1 and stats["in_flight"] == 0 and stats["completed"] == 0


def test_hang_and_sleep(upstream) -> None:
    _, url = upstream
    httpx.post(url + "/mock/reset", trust_env=False)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            url + "/v1/chat/completions", json={"messages": [user("[[mock:hang 10]]")]}, timeout=0.3, trust_env=False
        )
    stats = wait_for_stats(url, lambda s: s["cancelled"] == 1)
    assert stats["cancelled"] == 1 and stats["in_flight"] == 0

    started = time.monotonic()
    answer = httpx.post(
        url + "/v1/chat/completions", json={"messages": [user("[[mock:sleep 300]]")]}, trust_env=False, timeout=10
    )
    assert answer.status_code == 200 and time.monotonic() - started >= 0.3

    # Streams: headers at once, the first chunk after the sleep, then `slow` between chunks.
    body = {"messages": [user("[[mock:sleep 300]] [[mock:slow 100]] [[mock:tokens 2]]")], "stream": True}
    with httpx.Client(timeout=10, trust_env=False) as client:
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
    httpx.post(url + "/mock/reset", trust_env=False)
    body = {"messages": [user("[[mock:streamcut 3]] [[mock:tokens 20]]")], "stream": True}
    received = []
    with httpx.Client(timeout=10, trust_env=False) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if line:
                        received.append(line)
    assert len(received) == 3 and "data: [DONE]" not in received
    stats = wait_for_stats(url, lambda s: s["cut"] == 1)
    assert stats["cut"] == 1 and stats["in_flight"] == 0
    assert "Traceback" not in proc.output()
