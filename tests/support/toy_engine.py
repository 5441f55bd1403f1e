"""An in-process toy reasoning engine for injection unit tests: a template that drops past reasoning.

Words are tokens. A message renders as `START role words EOT NL`; an assistant turn in the history
renders without its reasoning, while a generation is `THINK reasoning ENDTHINK content EOT`, so a
plain multi-turn session breaks token contiguity at every turn, as with Qwen3-class templates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from server.injection.tokenize import Render

START, EOT, NL, THINK, ENDTHINK = 1, 2, 3, 4, 5
ROLES = {"system": 10, "user": 11, "assistant": 12, "tool": 13}


class Vocab:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def words(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, 100 + len(self.ids)) for w in text.split()]


def _text(message: dict[str, Any]) -> str:
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or ():
        parts.append("call " + call["function"]["name"])
    return " ".join(p for p in parts if p)


@dataclass
class ToyEngine:
    """Serves chat bodies like an engine; `mode` = honor | ignore | reject the token-in field."""

    mode: str = "honor"
    field_path: tuple[str, ...] = ("kv_transfer_params", "prompt_token_ids")
    history_only: bool = False  # nemo_rl: splice the template tail after the history
    max_model_len: int = 100000
    vocab: Vocab = field(default_factory=Vocab)
    prompts: list[list[int]] = field(default_factory=list)  # every prompt the engine used
    tokenize_calls: int = 0

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [START, ROLES[m["role"]], *self.vocab.words(_text(m)), EOT, NL]
        return ids + ([START, ROLES["assistant"]] if add_generation_prompt else [])

    async def tokenize(self, messages: list[dict[str, Any]], tools: Any, template: dict[str, Any]) -> Render:
        self.tokenize_calls += 1
        prefix = self.render(messages, False)
        return Render(orjson.dumps(prefix), len(prefix), self.max_model_len, (START, ROLES["assistant"]))

    def _sent(self, body: dict[str, Any]) -> list[int] | None:
        value: Any = body
        for key in self.field_path:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, list) else None

    def chat(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """Answer `body` with `reply` = {content, reasoning, tool_calls?, max_tokens?}."""
        sent = self._sent(body)
        if sent is not None and self.mode == "reject":
            raise ValueError(f"unknown field {'.'.join(self.field_path)}")
        rendered = self.render(body["messages"], True)
        if sent is not None and self.mode == "honor":
            if self.history_only:
                cut = len(sent) - 1 - sent[::-1].index(EOT)
                k = sum(1 for t in sent[: cut + 1] if t == EOT)
                positions = [i for i, t in enumerate(rendered) if t == EOT]
                prompt = sent[: cut + 1] + rendered[positions[k - 1] + 1 :]
            else:
                prompt = list(sent)
        else:
            prompt = rendered
        self.prompts.append(prompt)
        gen = [THINK, *self.vocab.words(reply.get("reasoning", "hmm")), ENDTHINK]
        gen += self.vocab.words(reply.get("content", "") + " " + " ".join("call " + n for n in reply.get("tools", ())))
        gen.append(EOT)
        finish = "tool_calls" if reply.get("tools") else "stop"
        limit = body.get("max_tokens")
        if type(limit) is int and len(gen) > limit:
            gen, finish = gen[:limit], "length"
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content", "")}
        if reply.get("tools"):
            message["tool_calls"] = [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
                for i, n in enumerate(reply["tools"])
            ]
        return {
            "id": "x",
            "model": "toy",
            "prompt_token_ids": prompt,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "token_ids": gen}],
        }


# Where each engine reads the ids, written down here independently of server.injection.id_fields (so a
# wrong field there fails the tests); one entry per engine of id_fields.ENGINES (tests/test_lists.py).
ENGINE_FIELDS: dict[str, tuple[str, ...]] = {
    "vllm": ("kv_transfer_params", "prompt_token_ids"),
    "sglang": ("input_ids",),
    "nemo_rl": ("required_prefix_token_ids",),
}


def engine_for(transport: str, mode: str = "honor") -> ToyEngine:
    """A ToyEngine reading the field `transport` sends (and splicing, as NeMo-RL's engine does, for `nemo_rl`)."""
    return ToyEngine(mode=mode, field_path=ENGINE_FIELDS[transport], history_only=transport == "nemo_rl")


class ToyTokenizer:
    """The TokenizeClient surface over a ToyEngine (can be told to fail)."""

    def __init__(self, engine: ToyEngine) -> None:
        self.engine = engine
        self.fail = False

    async def render(self, messages: list[dict[str, Any]], tools: Any, template: dict[str, Any]) -> Render:
        if self.fail:
            from server.injection.tokenize import TokenizeError

            raise TokenizeError("scripted failure")
        return await self.engine.tokenize(messages, tools, template)


class ToyBridge(ToyTokenizer):
    """A local renderer's surface (the `renderers` bridge's) over a ToyEngine.

    Like Qwen3's renderer it declines to bridge a new user turn, so the injector's whole-render
    fallback is exercised too. `bridged` counts the calls it did bridge.
    """

    def __init__(self, engine: ToyEngine) -> None:
        super().__init__(engine)
        self.bridged = 0

    async def render_prefix(self, messages: list[dict[str, Any]], tools: Any, template: dict[str, Any]) -> list[int]:
        return (await self.render(messages, tools, template)).prefix

    async def bridge(
        self, prompt: list[int], generation: list[int], new_messages: list[Any], tools: Any, template: dict[str, Any]
    ) -> list[int] | None:
        if any(m.get("role") == "user" for m in new_messages):
            return None
        self.bridged += 1
        return prompt + generation + [NL] + self.engine.render(new_messages, True)


def assistant_turn(chat: dict[str, Any]) -> dict[str, Any]:
    """What a client sends back: the reply without its reasoning."""
    message = chat["choices"][0]["message"]
    out = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def extends(prompt: list[int], prior: dict[str, Any]) -> bool:
    before = prior["prompt_token_ids"] + prior["choices"][0]["token_ids"]
    return prompt[: len(before)] == before and len(prompt) > len(before)
