"""The Messages translation: requests to chat, chat answers and streams back to Messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.errors import OpenAIError
from server.stateful.sealing import ReasoningSeal
from server.translate.messages_request import messages_to_chat
from server.translate.messages_response import chat_to_message
from server.translate.messages_stream import MessagesStreamTranslator

SEAL = ReasoningSeal(b"k" * 32)


def unseal(token, param):
    return SEAL.open(token, param)


def translate(**body):
    return messages_to_chat({"max_tokens": 100, **body}, unseal)


def test_system_blocks_and_mid_conversation_system_messages_in_both_forms():
    chat = translate(
        system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "env"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": "env"},
        ],
    ).body
    assert chat["messages"] == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "env"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "env"},
    ]
    assert chat["max_tokens"] == 100


def test_tool_use_and_results_become_a_chat_tool_turn_in_order():
    chat = translate(
        messages=[
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "running"},
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "false"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a.txt"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "exit 1", "is_error": True},
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                ],
            },
        ],
        tools=[{"name": "Bash", "input_schema": {"type": "object"}, "defer_loading": True}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ).body
    assistant = chat["messages"][1]
    assert assistant["content"] == "running"
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        {"command": "ls"},
        {"command": "false"},
    ]
    assert chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: exit 1"},
        {"role": "user", "content": "<system-reminder>x</system-reminder>"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    "choice, expected",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice(choice, expected):
    chat = translate(
        messages=[{"role": "user", "content": "x"}], tools=[{"name": "f", "input_schema": {}}], tool_choice=choice
    )
    assert chat.body["tool_choice"] == expected


def test_what_claude_code_sends_is_accepted():
    translated = translate(
        model="claude-opus-5-5",
        max_tokens=128000,
        stream=True,
        thinking={"type": "adaptive", "display": "omitted"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "medium"},
        metadata={"user_id": "{}"},
        messages=[{"role": "user", "content": "x"}],
        stop_sequences=["END"],
        temperature=0.5,
        top_k=4,
    )
    assert translated.show_thinking is False and translated.stop_sequences == ["END"]
    assert translated.body["reasoning_effort"] == "medium" and translated.body["stop"] == ["END"]
    assert translated.body["top_k"] == 4 and translated.body["temperature"] == 0.5


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}, "frobnicate"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "on"}}, "thinking.type"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(body, param):
    with pytest.raises(OpenAIError) as caught:
        messages_to_chat({"max_tokens": 10, **body}, unseal)
    assert caught.value.status == 400 and caught.value.param == param


def _sent_back(thinking: str, signature: str):
    return translate(
        messages=[
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": thinking, "signature": signature},
                    {"type": "text", "text": "a"},
                ],
            },
            {"role": "user", "content": "more"},
        ]
    ).body["messages"][1]


def test_a_signed_thinking_block_gives_back_the_sealed_reasoning():
    signature = SEAL.seal("exact reasoning")
    assert _sent_back("exact reasoning", signature)["reasoning_content"] == "exact reasoning"
    # display: omitted returns the text empty; the signature alone carries it.
    assert _sent_back("", signature)["reasoning_content"] == "exact reasoning"


def test_a_tampered_or_foreign_thinking_block_is_refused():
    signature = SEAL.seal("exact reasoning")
    with pytest.raises(OpenAIError):  # the text edited, the signature kept
        _sent_back("other reasoning", signature)
    tampered = signature[:-4] + ("AAAA" if not signature.endswith("AAAA") else "BBBB")
    with pytest.raises(OpenAIError):
        _sent_back("exact reasoning", tampered)
    with pytest.raises(OpenAIError):  # sealed by another key
        _sent_back("exact reasoning", ReasoningSeal(b"x" * 32).seal("exact reasoning"))


def _chat(message, finish="stop", **choice):
    return {
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 3}},
    }


def _message(chat, **kw):
    args = {"message_id": "msg_1", "seal": SEAL.seal, "show_thinking": True, "stop_sequences": [], "token_ids": False}
    return chat_to_message(chat, **{**args, **kw})


def test_an_answer_with_reasoning_text_and_a_call():
    message = _message(
        _chat(
            {
                "role": "assistant",
                "content": "let me look",
                "reasoning_content": "think",
                "tool_calls": [{"id": "c1", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}],
            },
            "tool_calls",
        )
    )
    thinking, text, call = message["content"]
    assert thinking["thinking"] == "think" and SEAL.open(thinking["signature"], "x") == "think"
    assert text == {"type": "text", "text": "let me look"}
    assert call == {"type": "tool_use", "id": "c1", "name": "Bash", "input": {"command": "ls"}}
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {
        "input_tokens": 7,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 3,
    }


def test_stop_reasons():
    assert _message(_chat({"content": "x"}, "length"))["stop_reason"] == "max_tokens"
    assert _message(_chat({"content": "x"}))["stop_reason"] == "end_turn"
    stopped = _message(_chat({"content": "x"}, stop_reason="END"), stop_sequences=["END"])
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")


def _chunk(delta=None, finish=None, **top):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "c", "model": "m", "choices": [choice], **top}


def _stream(chunks, show_thinking=True):
    writer = MessagesStreamTranslator(
        message_id="msg_1", model="m", seal=SEAL.seal, show_thinking=show_thinking, stop_sequences=[], token_ids=False
    )
    events = [e for chunk in chunks for e in writer.feed(chunk)]
    return events + writer.finish()


CHUNKS = [
    _chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
    _chunk({"reasoning_content": "hm"}),
    _chunk({"content": "ok"}),
    _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "Bash", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command":'}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "ls"}'}}]}),
    _chunk(finish="tool_calls"),
    {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}},
]


def test_stream_events_in_anthropic_order():
    events = _stream(CHUNKS)
    kinds = [(e["type"], e.get("delta", {}).get("type") or e.get("content_block", {}).get("type")) for e in events]
    assert kinds == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[0]["message"]["usage"]["input_tokens"] == 3
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2]
    assert SEAL.open(events[4]["delta"]["signature"], "x") == "hm"
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] == 6


def test_omitted_thinking_streams_only_its_signature():
    events = _stream(CHUNKS, show_thinking=False)
    assert not any(e.get("delta", {}).get("type") == "thinking_delta" for e in events)
    assert any(e.get("delta", {}).get("type") == "signature_delta" for e in events)


def test_a_failure_mid_stream_ends_with_an_error_event():
    writer = MessagesStreamTranslator(
        message_id="m", model="m", seal=SEAL.seal, show_thinking=True, stop_sequences=[], token_ids=False
    )
    writer.feed(CHUNKS[0])
    writer.feed(CHUNKS[2])
    events = writer.fail(OpenAIError(502, "cut"))
    assert events == [{"type": "error", "error": {"type": "api_error", "message": "cut"}}]
    assert writer.finish() == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "x"])},
    optional={"text": _json, "id": _json, "name": _json, "input": _json, "content": _json, "signature": _json},
)
_any_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]), "content": st.text() | st.lists(_block, max_size=3)}
)
_fields = {key: _json for key in ("system", "tools", "stop_sequences", "top_k", "metadata")}
_fields.update(
    output_config=st.fixed_dictionaries({}, optional={"effort": _json, "format": _json}),
    thinking=st.fixed_dictionaries({"type": _json}, optional={"budget_tokens": _json, "display": _json}),
    tool_choice=st.fixed_dictionaries({"type": _json}, optional={"name": _json, "disable_parallel_tool_use": _json}),
)


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(
        {"messages": st.lists(_any_message, min_size=1, max_size=3), "max_tokens": st.integers(1, 10**6)},
        optional=_fields,
    )
)
def test_any_body_is_translated_or_refused_with_a_400(body):
    """A hostile body never crashes the translator: it translates, or it is a 400 naming a field."""
    try:
        messages_to_chat(body, unseal)
    except OpenAIError as error:
        assert error.status == 400 and error.param


@pytest.mark.parametrize(
    "status, kind",
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (529, "overloaded_error"),
        (422, "invalid_request_error"),
    ],
)
def test_errors_take_anthropics_types_by_status(status, kind):
    from server.errors import anthropic_error_dict

    assert anthropic_error_dict(OpenAIError(status, "why")) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }
