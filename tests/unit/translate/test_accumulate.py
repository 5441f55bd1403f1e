"""ChatStreamAccumulator: a stream of chat chunks folds into the non-stream chat.completion."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.translate.accumulate import ChatStreamAccumulator

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1795956046, "model": "fake/ok"}


def chunk(delta=None, *, finish=None, index=0, **choice_extra):
    choice = {"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish, **choice_extra}
    return {**HEAD, "choices": [choice]}


def usage_chunk(prompt=5, completion=4):
    return {
        **HEAD,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def logprob(token_id, value):
    return {"token": f"token_id:{token_id}", "logprob": value, "bytes": None, "top_logprobs": []}


def feed_all(chunks):
    acc = ChatStreamAccumulator()
    for c in chunks:
        acc.feed(c)
    return acc


def test_text_stream_matches_the_non_stream_shape_with_vllm_extras():
    chunks = [
        {**chunk({"role": "assistant", "content": ""}), "prompt_token_ids": [151644, 872, 198]},
        chunk({"content": "Hello"}, token_ids=[9707], logprobs={"content": [logprob(9707, -0.1)]}),
        chunk({"content": " from"}, token_ids=[504], logprobs={"content": [logprob(504, -0.2)]}),
        chunk({"content": " fake"}, finish="stop", token_ids=[12418], logprobs={"content": [logprob(12418, -0.3)]}),
        usage_chunk(3, 3),
    ]
    result = feed_all(chunks).result()
    assert result == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1795956046,
        "model": "fake/ok",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from fake"},
                "logprobs": {"content": [logprob(9707, -0.1), logprob(504, -0.2), logprob(12418, -0.3)]},
                "finish_reason": "stop",
                "token_ids": [9707, 504, 12418],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        "prompt_token_ids": [151644, 872, 198],
    }


def test_tool_calls_merge_by_index_with_arguments_byte_for_byte():
    # Two parallel calls whose deltas interleave; spacing and unicode must survive untouched.
    chunks = [
        chunk({"role": "assistant", "content": None}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "exec_command", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": '}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path":'},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"echo héllo"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": ' "/tmp/x" }'}}]}, finish="tool_calls"),
    ]
    acc = feed_all(chunks)
    message = acc.result()["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "exec_command", "arguments": '{"cmd": "echo héllo"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": '{"path": "/tmp/x" }'}},
    ]
    assert acc.finish_reason == "tool_calls"


def test_reasoning_content_and_the_newer_reasoning_key_both_accumulate():
    old = feed_all(
        [
            chunk({"reasoning_content": "I should "}),
            chunk({"reasoning_content": "greet."}),
            chunk({"content": "Hi"}, finish="stop"),
        ]
    )
    new = feed_all(
        [chunk({"reasoning": "I should "}), chunk({"reasoning": "greet."}), chunk({"content": "Hi"}, finish="stop")]
    )
    for acc in (old, new):
        message = acc.result()["choices"][0]["message"]
        assert message["reasoning_content"] == "I should greet."
        assert message["content"] == "Hi"


def test_no_reasoning_key_when_none_was_streamed_and_content_none_when_never_sent():
    acc = feed_all(
        [
            chunk({"role": "assistant"}),
            chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ]
                }
            ),
        ]
    )
    message = acc.result()["choices"][0]["message"]
    assert "reasoning_content" not in message
    assert message["content"] is None
    # An empty content delta means "content is the empty string", as vLLM's first chunk says.
    assert feed_all([chunk({"content": ""})]).result()["choices"][0]["message"]["content"] == ""


def test_only_choice_zero_is_accumulated_but_all_choices_are_counted():
    acc = feed_all(
        [
            {
                **HEAD,
                "choices": [
                    {"index": 0, "delta": {"content": "zero"}, "finish_reason": None},
                    {"index": 1, "delta": {"content": "one"}, "finish_reason": None},
                ],
            },
            chunk({"content": "!"}, index=1, finish="stop"),
            chunk({}, finish="length"),
        ]
    )
    assert acc.n_choices == 2
    result = acc.result()
    assert result["choices"][0]["message"]["content"] == "zero"
    assert result["choices"][0]["finish_reason"] == "length"


def test_usage_comes_from_the_usage_chunk_and_missing_extras_stay_absent():
    acc = feed_all([chunk({"content": "x"}, finish="stop"), usage_chunk(7, 1)])
    result = acc.result()
    assert result["usage"] == {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
    assert "prompt_token_ids" not in result
    assert "token_ids" not in result["choices"][0]
    assert result["choices"][0]["logprobs"] is None
    assert feed_all([chunk({"content": "x"})]).result()["usage"] is None


def test_result_can_be_taken_mid_stream_and_is_not_aliased_to_the_state():
    acc = ChatStreamAccumulator()
    acc.feed(chunk({"content": "a"}, token_ids=[1], logprobs={"content": [logprob(1, -1.0)]}))
    first = acc.result()
    first["choices"][0]["token_ids"].append(99)
    first["choices"][0]["logprobs"]["content"].clear()
    acc.feed(chunk({"content": "b"}, token_ids=[2], logprobs={"content": [logprob(2, -2.0)]}))
    second = acc.result()
    assert second["choices"][0]["message"]["content"] == "ab"
    assert second["choices"][0]["token_ids"] == [1, 2]
    assert len(second["choices"][0]["logprobs"]["content"]) == 2


def test_first_values_win_for_identity_and_prompt_ids():
    acc = feed_all(
        [
            {**chunk({"content": "a"}), "prompt_token_ids": [1, 2]},
            {**chunk({"content": "b"}), "id": "other", "model": "other", "prompt_token_ids": [9]},
        ]
    )
    result = acc.result()
    assert (result["id"], result["model"], result["prompt_token_ids"]) == ("chatcmpl-1", "fake/ok", [1, 2])
    assert acc.chunks == 2


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=150, deadline=None)
@given(text=st.text(), arguments=st.text(min_size=1), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_of_text_and_arguments_reassembles_exactly(text, arguments, cuts):
    chunks = [chunk({"content": piece}) for piece in _split(text, cuts)]
    pieces = _split(arguments, cuts)
    chunks.append(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": pieces[0]}}
                ]
            }
        )
    )
    chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces[1:]]
    message = feed_all(chunks).result()["choices"][0]["message"]
    assert (message["content"] or "") == text
    assert message["tool_calls"][0]["function"]["arguments"] == arguments


def test_chunks_from_completion_round_trips_through_the_accumulator():
    from server.translate.accumulate import ChatStreamAccumulator, chunks_from_completion

    chat = {
        "id": "c1",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "token_ids": [7, 8, 9],
                "logprobs": {
                    "content": [
                        {"token": "a", "logprob": -0.1},
                        {"token": "b", "logprob": -0.2},
                        {"token": "c", "logprob": -0.3},
                    ]
                },
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "reasoning_content": "think",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    }
    acc = ChatStreamAccumulator()
    for chunk in chunks_from_completion(chat):
        acc.feed(chunk)
    result = acc.result()
    assert result["prompt_token_ids"] == [1, 2, 3]
    choice = result["choices"][0]
    assert choice["token_ids"] == [7, 8, 9] and choice["finish_reason"] == "tool_calls"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.1, -0.2, -0.3]
    assert choice["message"]["content"] == "hi" and choice["message"]["reasoning_content"] == "think"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert result["usage"]["total_tokens"] == 6
