"""Non-stream answers through the mock's ASGI app: shape, token exactness, /tokenize, the prefix property."""

from __future__ import annotations

import json
import math

import pytest

from server.dev.mock_upstream.template import GENERATION_PROMPT, render_prompt
from server.dev.mock_upstream.tokenizer import IM_END_ID, SPECIAL_TOKENS, piece_id
from tests.support.mock_chat import SYSTEM, TOKEN_EXTRAS, TOOLS, AppClient, assistant_from, ids_of, tokenizer, user


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
