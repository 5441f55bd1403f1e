"""The `[[mock:...]]` directives: the parser, and what each directive does to a reply."""

from __future__ import annotations

import json

import pytest

from server.dev.mock_upstream.directives import parse_directives
from server.dev.mock_upstream.tokenizer import IM_END_ID, SPECIAL_TOKENS
from tests.support.mock_chat import SYSTEM, TOOLS, AppClient, assistant_from, tokenizer, user


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
