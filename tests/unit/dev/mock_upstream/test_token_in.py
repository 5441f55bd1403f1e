"""The mock's reasoning template and token-in fields: what the injection tests stand on.

The drop-reasoning template must break contiguity on its own (the negative control for every
injection test); the token-in fields must be honoured, validated and spliced like the engines do.
"""

from __future__ import annotations

import pytest

from server.dev.mock_upstream.tokenizer import IM_END_ID, VOCAB_SIZE
from tests.support.mock_chat import SYSTEM, TOKEN_EXTRAS, TOOLS, AppClient, assistant_from, user

FIRST = [SYSTEM, user('look [[mock:reasoning]] [[mock:tool bash {"command": "ls"}]] [[mock:next]]')]


def _second_turn(answer: dict) -> list[dict]:
    call = answer["choices"][0]["message"]["tool_calls"][0]
    return FIRST + [assistant_from(answer), {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]


def _extends(answer: dict, prior: dict) -> bool:
    before = prior["prompt_token_ids"] + prior["choices"][0]["token_ids"]
    return answer["prompt_token_ids"][: len(before)] == before


def test_the_drop_reasoning_template_breaks_contiguity_and_keep_does_not():
    for template, contiguous in (("keep-reasoning", True), ("drop-reasoning", False)):
        app = AppClient(template=template)
        first = app.chat(FIRST, TOOLS, **TOKEN_EXTRAS)
        assert first["choices"][0]["message"]["reasoning_content"]
        messages = _second_turn(first)
        if template == "keep-reasoning":  # a client that sends reasoning back
            messages[2]["reasoning_content"] = first["choices"][0]["message"]["reasoning_content"]
        second = app.chat(messages, TOOLS, **TOKEN_EXTRAS)
        assert _extends(second, first) is contiguous, template


@pytest.mark.parametrize("field", ["kv_transfer_params", "prompt_token_ids", "input_ids"])
def test_prompt_ids_in_the_request_are_the_prompt(field):
    app = AppClient(template="drop-reasoning")
    first = app.chat(FIRST, TOOLS, **TOKEN_EXTRAS)
    ids = [*first["prompt_token_ids"], *first["choices"][0]["token_ids"], 77777]
    extra = (
        {"kv_transfer_params": {"prompt_token_ids": ids, "other": 1}} if field == "kv_transfer_params" else {field: ids}
    )
    second = app.chat(_second_turn(first), TOOLS, **TOKEN_EXTRAS, **extra)
    assert second["prompt_token_ids"] == ids


def test_whole_prompt_ids_skip_the_template_render_and_the_splice_does_not(monkeypatch):
    """Like vLLM: ids that are the whole prompt are used as they are (the template is not rendered);
    NeMo-RL's splice renders it. Counted on the mock's render, which the injection bench relies on."""
    app = AppClient(template="drop-reasoning")
    first = app.chat(FIRST, TOOLS, **TOKEN_EXTRAS)
    history = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    state = app.app.state.mock
    renders = []
    render = state.prompt_ids
    monkeypatch.setattr(state, "prompt_ids", lambda *a, **kw: renders.append(1) or render(*a, **kw))
    messages = _second_turn(first)
    app.chat(messages, TOOLS, **TOKEN_EXTRAS, kv_transfer_params={"prompt_token_ids": [*history, 7777]})
    assert renders == []
    app.chat(messages, TOOLS, **TOKEN_EXTRAS, required_prefix_token_ids=history)
    assert renders == [1]
    app.chat(messages, TOOLS, **TOKEN_EXTRAS)
    assert renders == [1, 1]


def test_required_prefix_is_spliced_after_its_last_end_of_turn():
    app = AppClient(template="drop-reasoning")
    first = app.chat(FIRST, TOOLS, **TOKEN_EXTRAS)
    history = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert history[-1] == IM_END_ID
    messages = _second_turn(first)
    plain = app.chat(messages, TOOLS, **TOKEN_EXTRAS)["prompt_token_ids"]
    spliced = app.chat(messages, TOOLS, **TOKEN_EXTRAS, required_prefix_token_ids=history)["prompt_token_ids"]
    assert spliced[: len(history)] == history
    # What follows is the template's own tail after the re-rendered assistant turn.
    turns = history.count(IM_END_ID)
    cut = [i for i, t in enumerate(plain) if t == IM_END_ID][turns - 1]
    assert spliced[len(history) :] == plain[cut + 1 :]


@pytest.mark.parametrize("bad", [[], [-1], [VOCAB_SIZE], ["7"], "1 2", [3, True], [3, 2.0], [3, -1], [3, VOCAB_SIZE]])
def test_invalid_ids_are_rejected_naming_the_field(bad):
    app = AppClient()
    response = app.post(
        "/v1/chat/completions", {"messages": [user("hi")], "kv_transfer_params": {"prompt_token_ids": bad}}
    )
    assert response.status_code == 400 and "kv_transfer_params.prompt_token_ids" in response.json()["error"]["message"]


def test_an_engine_that_ignores_the_fields_renders_its_template():
    app = AppClient(template="drop-reasoning", token_in="ignore")
    first = app.chat(FIRST, TOOLS, **TOKEN_EXTRAS)
    messages = _second_turn(first)
    plain = app.chat(messages, TOOLS, **TOKEN_EXTRAS)["prompt_token_ids"]
    sent = app.chat(messages, TOOLS, **TOKEN_EXTRAS, input_ids=[5, 5, 5])["prompt_token_ids"]
    assert sent == plain


def test_chat_form_tokenize_follows_the_template_mode_and_config_switches_it():
    app = AppClient(template="drop-reasoning")
    first = app.chat(FIRST, TOOLS, **TOKEN_EXTRAS)
    messages = _second_turn(first)
    messages[2]["reasoning_content"] = "secret thoughts"
    body = {"messages": messages, "tools": TOOLS, "add_generation_prompt": True}
    dropped = app.post("/tokenize", body).json()["tokens"]
    assert dropped == app.chat(messages, TOOLS, **TOKEN_EXTRAS)["prompt_token_ids"]
    no_prompt = app.post("/tokenize", {**body, "add_generation_prompt": False}).json()["tokens"]
    assert dropped[: len(no_prompt)] == no_prompt and len(dropped) > len(no_prompt)
    assert app.post("/mock/config", {"template": "keep-reasoning"}).json()["template"] == "keep-reasoning"
    kept = app.post("/tokenize", body).json()["tokens"]
    assert len(kept) > len(dropped)
    assert app.post("/mock/config", {"token_in": "nonsense"}).status_code == 400
