"""Chat stream chunks -> Responses stream events: order, item lifecycle, and what the SDK reads back."""

from __future__ import annotations

import logging

import orjson
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from server.http import sse
from server.translate.request import responses_to_chat
from server.translate.response import chat_to_response
from server.translate.stream import ResponsesStreamTranslator
from tests.support.translate import (
    FN_EXEC,
    NS_AGENTS,
    OPEN_RESPONSES_KEYS,
    PROMPT_IDS,
    lp,
    sdk_client,
)

# ---- streaming -----------------------------------------------------------------------------------

STREAM_EVENTS = TypeAdapter(ResponseStreamEvent)
HEAD = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1795956046, "model": "fake/ok"}


def ck(delta=None, *, finish=None, token_ids=None, logprobs=None, **top):
    choice = {
        "index": 0,
        "delta": delta or {},
        "logprobs": {"content": logprobs} if logprobs else None,
        "finish_reason": finish,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {**HEAD, "choices": [choice], **top}


def usage_ck(prompt=5, completion=4):
    return {
        **HEAD,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def tc(index, *, id=None, name=None, args=None):
    call: dict = {"index": index}
    if id:
        call["id"], call["type"] = id, "function"
    function = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    call["function"] = function
    return ck({"tool_calls": [call]})


def writer_for(request=None, tool_map=None, token_ids=False):
    request = request or {"model": "sy/route", "input": "x", "stream": True}
    return ResponsesStreamTranslator(
        request, tool_map, response_id="resp_abc", created_at=1795956000, model="target/model", token_ids=token_ids
    )


COMPLETED_AT = 1795956050


def wire(events: list[dict], *, last: bool = False) -> bytes:
    """Events framed as the endpoint frames them; the last batch ends the stream with [DONE]."""
    return sse.encode_responses_events(events) + (sse.DONE if last else b"")


def run_stream(chunks, *, writer=None, end="finish", **kw) -> tuple[bytes, ResponsesStreamTranslator]:
    writer = writer or writer_for(**kw)
    raw = wire(writer.start())
    for c in chunks:
        raw += wire(writer.feed(c))
    closing = (
        writer.finish(COMPLETED_AT) if end == "finish" else writer.fail("upstream went away", "upstream_stream_cut")
    )
    raw += wire(closing, last=True)
    return raw, writer


def parse_sse(raw: bytes) -> list[dict]:
    """Strict framing check: `event: T\\ndata: {json}\\n\\n` with T == type, then exactly one [DONE]."""
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"", "the stream must end with a blank line"
    assert frames[-2] == b"data: [DONE]", "the stream must end with [DONE]"
    events = []
    for frame in frames[:-2]:
        event_line, data_line = frame.split(b"\n")
        assert event_line.startswith(b"event: ") and data_line.startswith(b"data: ")
        data = orjson.loads(data_line[6:])
        assert event_line[7:].decode() == data["type"]
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    check_item_lifecycle(events)
    return events


def check_item_lifecycle(events: list[dict]) -> None:
    """What the SDK does not enforce but Codex needs: every item added is done (unless the response
    failed), nothing refers to an item outside its added..done window, one item open at a time."""
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    terminal = events[-1]["type"]
    assert terminal in ("response.completed", "response.incomplete", "response.failed")
    assert not any(e["type"] in ("response.completed", "response.incomplete", "response.failed") for e in events[:-1])
    open_index: int | None = None
    closed: set[int] = set()
    for e in events[2:-1]:
        index = e.get("output_index")
        if e["type"] == "response.output_item.added":
            assert open_index is None, "a new item opened before the previous one was done"
            assert index == len(closed), "output indices must be dense and in order"
            open_index = index
        elif e["type"] == "response.output_item.done":
            assert index == open_index
            closed.add(index)
            open_index = None
        elif index is not None:
            assert index == open_index, f"{e['type']} outside its item's window"
    if terminal != "response.failed":
        assert open_index is None, "an item was never finished"
        assert len(closed) == len(events[-1]["response"]["output"])


def sdk_accumulate(events: list[dict], tools=None):
    """Every event validated strictly against the SDK's types, then run through its stream state."""
    state = ResponseStreamState(input_tools=tools if tools is not None else omit, text_format=omit)
    for data in events:
        state.handle_event(STREAM_EVENTS.validate_python(data))
    return state._completed_response


def types(events):
    return [e["type"] for e in events]


TEXT_CHUNKS = [
    ck({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT_IDS),
    ck({"content": "Hello"}, token_ids=[9707], logprobs=[lp(9707, -0.1)]),
    ck({"content": " there"}, token_ids=[504], logprobs=[lp(504, -0.2)]),
    ck({}, finish="stop", token_ids=[], logprobs=[]),
    usage_ck(5, 2),
]


def test_text_stream_event_sequence():
    raw, writer = run_stream(TEXT_CHUNKS)
    events = parse_sse(raw)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    for lifecycle in (events[0], events[1], events[-1]):
        assert OPEN_RESPONSES_KEYS <= lifecycle["response"].keys()
        Response.model_validate(lifecycle["response"])
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    item_ids = {e.get("item_id") or e.get("item", {}).get("id") for e in events[2:-1]}
    assert item_ids == {"msg_abc_0"}
    assert {e["output_index"] for e in events[2:-1]} == {0}
    assert events[6]["text"] == "Hello there"
    completed = sdk_accumulate(events)
    assert completed.output_text == "Hello there"
    assert writer.response == events[-1]["response"]
    assert writer.response["usage"]["input_tokens"] == 5 and writer.response["model"] == "fake/ok"


def test_stream_final_response_equals_the_non_stream_translation():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    chunks = [
        ck({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT_IDS),
        ck({"reasoning_content": "plan"}, token_ids=[1], logprobs=[lp(1, -0.5)]),
        ck({"content": "Calling."}, token_ids=[2], logprobs=[lp(2, -0.5)]),
        tc(0, id="call_1", name="multi_agent_v1__spawn_agent", args='{"task": '),
        tc(0, args='"x"}'),
        tc(1, id="call_2", name="exec_command", args='{"cmd": "ls"}'),
        ck({}, finish="tool_calls", token_ids=[3, 4], logprobs=[lp(3, -0.5), lp(4, -0.5)]),
        usage_ck(),
    ]
    request = {"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]}
    raw, writer = run_stream(chunks, writer=writer_for(request, translated.tool_map, token_ids=True))
    expected = chat_to_response(
        writer.accumulator.result(),
        request,
        translated.tool_map,
        response_id="resp_abc",
        created_at=1795956000,
        token_ids=True,
        completed_at=COMPLETED_AT,
    )
    streamed = dict(writer.response)
    assert streamed["completed_at"] == COMPLETED_AT
    assert streamed == expected
    sdk_accumulate(parse_sse(raw), tools=request["tools"])


def test_tool_call_stream_keeps_arguments_byte_for_byte_and_restores_namespace():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [NS_AGENTS]})
    pieces = ['{"ta', 'sk": "say ', "h\u00e9llo", '"}']
    chunks = [
        ck({"role": "assistant", "content": None}),
        tc(0, id="call_1", name="multi_agent_v1__spawn_agent", args=""),
    ]
    chunks += [tc(0, args=p) for p in pieces]
    chunks += [ck({}, finish="tool_calls"), usage_ck()]
    request = {"model": "m", "input": "x", "tools": [NS_AGENTS]}
    raw, writer = run_stream(chunks, writer=writer_for(request, translated.tool_map))
    events = parse_sse(raw)
    assert types(events) == ["response.created", "response.in_progress", "response.output_item.added"] + [
        "response.function_call_arguments.delta"
    ] * 4 + ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added, done = events[2]["item"], events[-2]["item"]
    assert (added["name"], added["namespace"], added["call_id"], added["arguments"]) == (
        "spawn_agent",
        "multi_agent_v1",
        "call_1",
        "",
    )
    assert [e["delta"] for e in events[3:7]] == pieces
    assert done["arguments"] == events[-3]["arguments"] == "".join(pieces)
    completed = sdk_accumulate(events, tools=request["tools"])
    # The SDK found the strict tool inside the namespace and parsed its arguments.
    assert completed.output[0].parsed_arguments == {"task": "say h\u00e9llo"}


def test_parallel_tool_calls_are_closed_in_order():
    chunks = [
        tc(0, id="a", name="exec_command", args='{"cmd":"1"}'),
        tc(1, id="b", name="exec_command", args='{"cmd":'),
        tc(1, args='"2"}'),
        ck({}, finish="tool_calls"),
        usage_ck(),
    ]
    raw, writer = run_stream(chunks)
    events = parse_sse(raw)
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["output_index"] for e in events[2:-1]] == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert [(i["call_id"], i["arguments"]) for i in writer.response["output"]] == [
        ("a", '{"cmd":"1"}'),
        ("b", '{"cmd":"2"}'),
    ]
    sdk_accumulate(events)


def test_text_then_tool_call_closes_the_message_first():
    chunks = [ck({"content": "Let me check."}), tc(0, id="c", name="f", args="{}"), ck({}, finish="tool_calls")]
    events = parse_sse(run_stream(chunks)[0])
    kinds = types(events)
    assert kinds.index("response.output_item.done") < kinds.index("response.output_item.added", 3)
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "message",
        "function_call",
    ]
    sdk_accumulate(events)


def test_reasoning_stream_events():
    chunks = [
        ck({"reasoning": "Think"}),
        ck({"reasoning_content": "ing."}),
        ck({"content": "Done"}),
        ck({}, finish="stop"),
    ]
    raw, writer = run_stream(chunks)
    events = parse_sse(raw)
    assert types(events)[2:10] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert events[2]["item"]["type"] == "reasoning" and events[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert events[6]["text"] == "Thinking."
    assert writer.response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert sdk_accumulate(events).output_text == "Done"


def test_refusal_stream_events():
    raw, writer = run_stream([ck({"refusal": "I can"}), ck({"refusal": "'t."}), ck({}, finish="stop")])
    events = parse_sse(raw)
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert writer.response["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't."}]
    sdk_accumulate(events)


def test_length_stop_ends_with_response_incomplete():
    raw, writer = run_stream([ck({"content": "cut"}), ck({}, finish="length"), usage_ck()])
    events = parse_sse(raw)
    assert events[-1]["type"] == "response.incomplete"
    response = events[-1]["response"]
    Response.model_validate(response)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete" == response["output"][-1]["status"]
    sdk_accumulate(events)


def test_failure_stream_sends_error_then_failed_and_leaves_open_items_unfinished():
    chunks = [ck({"content": "Hi"}), tc(0, id="c", name="f", args='{"half')]
    raw, writer = run_stream(chunks, end="fail")
    events = parse_sse(raw)
    assert types(events)[-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "upstream went away" and events[-2]["code"] == "upstream_stream_cut"
    failed = events[-1]["response"]
    Response.model_validate(failed)
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "upstream went away"}
    # The message was finished (the call started after it); the half tool call never was.
    assert [i["type"] for i in failed["output"]] == ["message"]
    done_items = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert done_items == ["message"]
    sdk_accumulate(events)
    assert writer.finish(COMPLETED_AT) == [] and writer.feed(ck({"content": "late"})) == []


def test_fail_before_start_still_opens_with_response_created():
    writer = writer_for()
    events = parse_sse(wire(writer.fail("rate limited", "rate_limit_exceeded"), last=True))
    assert types(events) == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "rate_limit_exceeded"
    sdk_accumulate(events)


def test_empty_generation_streams_an_empty_message():
    events = parse_sse(run_stream([ck({"role": "assistant", "content": ""}), ck({}, finish="stop")])[0])
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    sdk_accumulate(events)


def test_start_is_idempotent_and_feed_starts_implicitly():
    writer = writer_for()
    raw = wire(writer.feed(ck({"content": "a"})))
    assert writer.start() == []
    raw += wire(writer.finish(COMPLETED_AT), last=True)
    assert types(parse_sse(raw))[:2] == ["response.created", "response.in_progress"]
    assert writer.feed(ck({"role": "assistant"})) == []


def test_triple_rides_only_on_the_completed_responses_last_item():
    raw, writer = run_stream(TEXT_CHUNKS, token_ids=True)
    events = parse_sse(raw)
    last = events[-1]["response"]["output"][-1]
    assert (last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"]) == (
        PROMPT_IDS,
        [9707, 504],
        [-0.1, -0.2],
    )
    assert all("generation_token_ids" not in e.get("item", {}) for e in events[:-1])
    assert "generation_token_ids" not in run_stream(TEXT_CHUNKS)[1].response["output"][-1]


def test_tool_call_name_arriving_after_its_first_delta_is_buffered():
    chunks = [tc(0, id="c", args='{"a"'), tc(0, name="exec_command", args=": 1}"), ck({}, finish="tool_calls")]
    events = parse_sse(run_stream(chunks)[0])
    assert events[2]["item"]["name"] == "exec_command"
    # What arrived before the name is released as one delta when the item opens.
    assert [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"] == ['{"a": 1}']
    sdk_accumulate(events)


def test_interleaved_late_arguments_reach_the_final_response(caplog):
    chunks = [
        tc(0, id="a", name="f", args='{"x":'),
        tc(1, id="b", name="g", args="{}"),
        tc(0, args="1}"),
        ck({}, finish="tool_calls"),
    ]
    with caplog.at_level(logging.DEBUG):
        raw, writer = run_stream(chunks)
    assert writer.response["output"][0]["arguments"] == '{"x":1}'
    # Counted for the caller to log; translation itself logs nothing.
    assert writer.late_tool_deltas == 1 and caplog.records == []
    sdk_accumulate(parse_sse(raw))


def test_stream_text_logprobs_when_asked():
    request = {"model": "m", "input": "x", "top_logprobs": 0}
    raw, writer = run_stream(TEXT_CHUNKS, writer=writer_for(request))
    deltas = [e for e in parse_sse(raw) if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"][0]["logprob"] for d in deltas] == [-0.1, -0.2]
    assert len(writer.response["output"][0]["content"][0]["logprobs"]) == 2


# ---- through the real openai client, offline -----------------------------------------------------


def test_openai_client_streams_our_events_to_a_final_response():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    chunks = [
        ck({"content": "Spawning."}),
        tc(0, id="call_9", name="multi_agent_v1__spawn_agent", args='{"task": "t"}'),
        ck({}, finish="tool_calls"),
        usage_ck(),
    ]
    request = {"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]}
    raw, _ = run_stream(chunks, writer=writer_for(request, translated.tool_map))
    client = sdk_client(raw, "text/event-stream")
    with client.responses.stream(model="m", input="x", tools=request["tools"]) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert final.output_text == "Spawning."
    call = final.output[1]
    assert (call.name, call.namespace, call.call_id, call.parsed_arguments) == (
        "spawn_agent",
        "multi_agent_v1",
        "call_9",
        {"task": "t"},
    )
    assert final.usage.input_tokens_details.cache_write_tokens == 0
