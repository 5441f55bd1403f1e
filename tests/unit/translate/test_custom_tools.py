"""Freeform (`custom`) tools: offered upstream as one-string functions, calls back as custom_tool_call items."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from openai.types.responses import Response, ResponseCustomToolCall

from server.stateful.replay import rebuilt_events
from server.translate.custom_tools import INPUT_ARGUMENT, InputDecoder, decode_input, encode_input
from server.translate.request import responses_to_chat
from server.translate.response import response_to_chat
from tests.support.translate import FN_EXEC, WEB_SEARCH, chat, chat_completion, error_of, sdk_client, to_response
from tests.unit.translate.test_stream import (
    check_item_lifecycle,
    ck,
    parse_sse,
    run_stream,
    sdk_accumulate,
    tc,
    types,
    usage_ck,
    writer_for,
)

GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch. This is a FREEFORM tool.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
NS_CUSTOM = {
    "type": "namespace",
    "name": "editor",
    "tools": [{"type": "custom", "name": "write", "description": "Write text"}],
}
PATCH = '*** Begin Patch\n*** Update File: a.py\n@@\n-x = "old"\n+x = "new \\u00e9 😀"\n*** End Patch\n'


# ---- the tool, offered upstream ---------------------------------------------------------------------


def test_custom_tool_becomes_a_function_with_one_string_argument_and_the_grammar_in_its_description():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, APPLY_PATCH, WEB_SEARCH]})
    assert translated.dropped_tool_types == ["web_search"]
    function = translated.body["tools"][1]["function"]
    assert function["name"] == "apply_patch"
    assert function["parameters"]["properties"].keys() == {INPUT_ARGUMENT}
    assert function["parameters"]["properties"][INPUT_ARGUMENT]["type"] == "string"
    assert function["parameters"]["required"] == [INPUT_ARGUMENT]
    assert function["description"].startswith(APPLY_PATCH["description"])
    assert "Lark grammar" in function["description"] and GRAMMAR in function["description"]
    assert translated.tool_map.is_custom("apply_patch") and not translated.tool_map.is_custom("exec_command")


def test_plain_text_custom_tool_and_one_inside_a_namespace():
    translated = responses_to_chat(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "custom", "name": "note", "format": {"type": "text"}}, NS_CUSTOM],
        }
    )
    note, write = (t["function"] for t in translated.body["tools"])
    assert "description" not in note  # no description and no grammar: nothing to say
    assert write["name"] == "editor__write" and write["description"] == "Write text"
    assert translated.tool_map.is_custom("note") and translated.tool_map.is_custom("editor__write")
    regex = chat(
        {
            "input": "x",
            "tools": [
                {
                    "type": "custom",
                    "name": "d",
                    "format": {**APPLY_PATCH["format"], "syntax": "regex", "definition": r"\d+"},
                }
            ],
        }
    )
    assert regex["tools"][0]["function"]["description"].endswith("regular expression:\n\\d+")


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "custom"}, "tools[0].name"),
        ({"type": "custom", "name": "t", "format": "lark"}, "tools[0].format"),
        ({"type": "custom", "name": "t", "format": {"type": "json"}}, "tools[0].format.type"),
        (
            {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "peg", "definition": "x"}},
            "tools[0].format.syntax",
        ),
        (
            {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "lark"}},
            "tools[0].format.definition",
        ),
        ({"type": "custom", "name": "t", "description": 3}, "tools[0].description"),
    ],
)
def test_malformed_custom_tools_are_a_400_naming_the_field(tool, param):
    assert error_of({"input": "x", "tools": [tool]}).param == param


def test_tool_choice_can_name_a_custom_tool():
    body = chat(
        {"input": "x", "tools": [FN_EXEC, APPLY_PATCH], "tool_choice": {"type": "custom", "name": "apply_patch"}}
    )
    assert body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    allowed = chat(
        {
            "input": "x",
            "tools": [FN_EXEC, APPLY_PATCH],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "custom", "name": "apply_patch"}],
            },
        }
    )
    assert [t["function"]["name"] for t in allowed["tools"]] == ["apply_patch"] and allowed["tool_choice"] == "required"
    # The kind must match the tool's: a custom choice naming a function tool (or the reverse) is a 400.
    wrong = error_of(
        {"input": "x", "tools": [FN_EXEC, APPLY_PATCH], "tool_choice": {"type": "custom", "name": "exec_command"}}
    )
    assert wrong.param == "tool_choice" and "custom tools" in wrong.message
    assert error_of({"input": "x", "tools": [APPLY_PATCH], "tool_choice": {"type": "function", "name": "apply_patch"}})


# ---- the history, sent back --------------------------------------------------------------------------


def test_custom_tool_call_and_its_output_go_back_as_a_tool_call_and_a_tool_message():
    messages = chat(
        {
            "tools": [APPLY_PATCH],
            "input": [
                {"type": "message", "role": "user", "content": "edit a.py"},
                {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch", "input": PATCH},
                {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Success. Updated a.py"},
            ],
        }
    )["messages"]
    call = messages[1]["tool_calls"][0]
    assert messages[1]["role"] == "assistant"
    assert call["id"] == "call_1" and call["function"]["name"] == "apply_patch"
    assert json.loads(call["function"]["arguments"]) == {INPUT_ARGUMENT: PATCH}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "Success. Updated a.py"}
    # The arguments are spelled as a model writes them, so the text survives a round trip exactly.
    assert decode_input(call["function"]["arguments"]) == PATCH


def test_malformed_custom_tool_call_items_are_a_400():
    item = {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}
    assert error_of({"input": [item]}).param == "input[0].input"
    assert (
        error_of({"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": 5}]}).param
        == "input[0].output"
    )


# ---- decoding the model's arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "plain", PATCH, 'quote " backslash \\ slash / \b\f\n\r\t', "\u0001 é ☃ 😀 \U0001f600"]
)
def test_decoder_gives_the_text_back_however_the_arguments_are_split(text):
    rng = random.Random(text)
    spellings = [
        encode_input(text),
        json.dumps({INPUT_ARGUMENT: text}),  # ASCII escapes, surrogate pairs included
        json.dumps({INPUT_ARGUMENT: text}, indent=2),
        json.dumps({INPUT_ARGUMENT: text}, separators=(",", ":")),
    ]
    for arguments in spellings:
        assert decode_input(arguments) == text
        for _ in range(40):
            cuts = sorted(rng.sample(range(len(arguments) + 1), min(len(arguments) + 1, rng.randint(1, 8))))
            decoder, streamed, previous = InputDecoder(), "", 0
            for cut in [*cuts, len(arguments)]:
                streamed += decoder.feed(arguments[previous:cut])
                previous = cut
            assert streamed == text == decoder.text, (arguments, cuts)
            assert decoder.state == "end"


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ('{"cmd": "echo hi"}', "echo hi"),  # another key, but the only string: still the model's text
        ('{"input": "a", "extra": 1}', "a"),
        ('"a bare JSON string"', "a bare JSON string"),
        ("*** Begin Patch\nnot JSON at all", "*** Begin Patch\nnot JSON at all"),  # raw text passes through
        ('{"input": 42}', '{"input": 42}'),
        ('{"input": "cut short by a length st', "cut short by a length st"),
        ('{"input": "line\nwith a raw newline"}', "line\nwith a raw newline"),
        ('{"input": "lone \\ud800 surrogate"}', "lone ? surrogate"),
        ("", ""),
    ],
)
def test_decoding_is_lenient(arguments, text):
    assert decode_input(arguments) == text


# ---- the call, back to the client ------------------------------------------------------------------------


def _translated():
    return responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, APPLY_PATCH]})


def test_non_stream_call_to_a_custom_tool_is_a_custom_tool_call_item_the_sdk_parses():
    translated = _translated()
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_p", "type": "function", "function": {"name": "apply_patch", "arguments": encode_input(PATCH)}},
            {"id": "call_e", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'}},
        ],
    }
    response = to_response(chat_completion(message, finish="tool_calls"), tool_map=translated.tool_map)
    parsed = Response.model_validate(response)
    call = parsed.output[0]
    assert isinstance(call, ResponseCustomToolCall)
    assert (call.type, call.call_id, call.name, call.input, call.id) == (
        "custom_tool_call",
        "call_p",
        "apply_patch",
        PATCH,
        "ctc_abc_0",
    )
    assert parsed.output[1].type == "function_call" and parsed.output[1].arguments == '{"cmd":"ls"}'
    # Through the real client as well, and back to chat form (the passthrough capture path).
    client = sdk_client(json.dumps(response).encode(), "application/json")
    via_sdk = client.responses.create(model="m", input="x", tools=[APPLY_PATCH])
    assert via_sdk.output[0].input == PATCH
    back = response_to_chat(response)["choices"][0]["message"]["tool_calls"][0]
    assert back["function"] == {"name": "apply_patch", "arguments": encode_input(PATCH)}


def _patch_chunks(pieces):
    return [
        ck({"role": "assistant", "content": ""}),
        ck({"content": "Patching."}),
        tc(0, id="call_p", name="apply_patch", args=""),
        *[tc(0, args=piece) for piece in pieces],
        ck({}, finish="tool_calls"),
        usage_ck(),
    ]


def test_stream_call_to_a_custom_tool_sends_input_deltas_and_done_with_the_decoded_text():
    translated = _translated()
    arguments = json.dumps({INPUT_ARGUMENT: PATCH})  # escapes (\n, \", \uXXXX pairs) split across fragments
    pieces = [arguments[i : i + 7] for i in range(0, len(arguments), 7)]
    request = {"model": "m", "input": "x", "tools": [FN_EXEC, APPLY_PATCH], "stream": True}
    raw, writer = run_stream(_patch_chunks(pieces), writer=writer_for(request, translated.tool_map))
    events = parse_sse(raw)
    call_events = [e for e in events if e.get("output_index") == 1]
    kinds = types(call_events)
    assert kinds[0] == "response.output_item.added" and kinds[-2:] == [
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    assert set(kinds[1:-2]) == {"response.custom_tool_call_input.delta"} and len(kinds) > 4
    assert not any("function_call" in kind for kind in types(events))
    added = call_events[0]["item"]
    assert (added["type"], added["name"], added["call_id"], added["input"]) == (
        "custom_tool_call",
        "apply_patch",
        "call_p",
        "",
    )
    assert "".join(e["delta"] for e in call_events[1:-2]) == PATCH
    assert call_events[-2]["input"] == PATCH and call_events[-1]["item"]["input"] == PATCH
    assert {e["item_id"] for e in call_events[1:-1]} == {"ctc_abc_1"}
    # The SDK validates every event and assembles the same response the non-stream path gives.
    completed = sdk_accumulate(events, tools=request["tools"])
    assert isinstance(completed.output[1], ResponseCustomToolCall) and completed.output[1].input == PATCH
    expected = to_response(writer.accumulator.result(), request, translated.tool_map)
    assert {**writer.response, "completed_at": None} == {**expected, "completed_at": None}


def test_stream_of_arguments_that_are_not_the_expected_json_still_ends_with_the_raw_text():
    raw, _ = run_stream(
        _patch_chunks(["*** Begin", " Patch\n", "*** End Patch\n"]),
        writer=writer_for({"model": "m", "input": "x"}, _translated().tool_map),
    )
    events = parse_sse(raw)
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert "".join(deltas) == done["input"] == "*** Begin Patch\n*** End Patch\n"


def test_stream_through_the_openai_client():
    translated = _translated()
    raw, _ = run_stream(_patch_chunks([encode_input(PATCH)]), writer=writer_for(None, translated.tool_map))
    client = sdk_client(raw, "text/event-stream")
    with client.responses.stream(model="m", input="x", tools=[APPLY_PATCH]) as stream:
        seen = [event for event in stream]
        final = stream.get_final_response()
    assert [e.type for e in seen if "custom_tool_call_input" in e.type][-1] == "response.custom_tool_call_input.done"
    assert final.output[1].type == "custom_tool_call" and final.output[1].input == PATCH


def test_a_stored_response_replays_its_custom_tool_call():
    response = to_response(
        chat_completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "apply_patch", "arguments": encode_input(PATCH)},
                    }
                ],
            },
            finish="tool_calls",
        ),
        tool_map=_translated().tool_map,
    )
    events = list(rebuilt_events(response))
    check_item_lifecycle(events)
    assert types(events)[2:6] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    assert events[2]["item"]["input"] == "" and events[3]["delta"] == events[4]["input"] == PATCH
    assert sdk_accumulate(events).output[0].input == PATCH


# ---- what Codex really sends -------------------------------------------------------------------------------

# Codex CLI 0.171.0's second request with a freeform apply_patch (model catalog entry with
# `apply_patch_tool_type: "freeform"`), after the model's call patched a file: its `custom` tool, the
# echoed custom_tool_call and Codex's custom_tool_call_output. Long texts are trimmed; shapes are as sent.
CODEX_REQUEST = Path(__file__).parents[2] / "support" / "codex_freeform_request.json"


def test_codex_freeform_apply_patch_request_translates():
    body = json.loads(CODEX_REQUEST.read_text())
    assert {"type": "custom", "name": "apply_patch"}.items() <= body["tools"][3].items()
    translated = responses_to_chat(body)
    assert translated.dropped_tool_types == ["web_search"]
    function = next(t["function"] for t in translated.body["tools"] if t["function"]["name"] == "apply_patch")
    assert body["tools"][3]["format"]["definition"] in function["description"]
    call_item, output_item = body["input"][-2:]
    assert (call_item["type"], output_item["type"]) == ("custom_tool_call", "custom_tool_call_output")
    assistant, tool = translated.body["messages"][-2:]
    [call] = assistant["tool_calls"]
    assert call["id"] == call_item["call_id"] and decode_input(call["function"]["arguments"]) == call_item["input"]
    assert tool == {"role": "tool", "tool_call_id": output_item["call_id"], "content": output_item["output"]}


def test_a_custom_tool_inside_a_namespace_is_called_and_sent_back_namespaced():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [NS_CUSTOM]})
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "editor__write", "arguments": '{"input":"t"}'}}
        ],
    }
    item = to_response(chat_completion(message, finish="tool_calls"), tool_map=translated.tool_map)["output"][0]
    assert (item["type"], item["name"], item["namespace"], item["input"]) == (
        "custom_tool_call",
        "write",
        "editor",
        "t",
    )
    history = chat({"tools": [NS_CUSTOM], "input": [{**item, "status": "completed"}]})["messages"]
    assert history[0]["tool_calls"][0]["function"] == {"name": "editor__write", "arguments": encode_input("t")}
