"""The engine's chat-form `/tokenize`: the template render of a call's messages, one round trip per call.

A call needs two renders: its messages without the generation prompt (the next call's cut point)
and with it (to find the environment suffix). For templates whose generation prompt is a plain
suffix, which is every common one, the generation prompt's ids are learned once per template
configuration and appended locally, so the steady state is one round trip per call.

Answers are kept briefly, keyed by the exact request bytes (a retried call, or a side call that
sends the same messages, needs no round trip); the same bytes to the same engine render the same ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from server.injection.ids import id_list_json
from server.upstream import http1
from server.urls import root_url

log = logging.getLogger("switchyard_model.injection")


# A /tokenize answer: the ids, the engine's max_model_len if it said, and the ids' compact JSON.
_Answer = tuple[list[int], int | None, bytes]


class TokenizeError(Exception):
    """The engine's /tokenize did not give a usable answer."""


@dataclass(frozen=True, slots=True)
class Render:
    prefix: list[int]  # the messages' render without the generation prompt
    prompt: list[int]  # ... with it: what the engine's own chat template would use as the prompt
    max_model_len: int | None
    prefix_json: bytes  # `prefix` as compact JSON (server.injection.ids): matched and digested as bytes


class TokenizeClient:
    """Asks one engine's `/tokenize` (at its root: the `/v1` base URL without `/v1`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_connections: int = 64,
        cache_entries: int = 64,
        cache_ttl_s: float = 60.0,
    ) -> None:
        root = root_url(base_url)
        self.base_url = root
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._pool = http1.Pool(
            root,
            connect_timeout=min(timeout_s, 10.0),
            read_timeout=timeout_s,
            max_connections=max_connections,
            headers=headers,
        )
        self._timeout_s = timeout_s
        # Per template configuration: the generation prompt's ids, or None when it is not a plain suffix.
        self._generation_prompts: dict[bytes, list[int] | None] = {}
        # request bytes -> (when asked, the answer). The answers' lists are shared: nothing mutates them.
        self._answers: OrderedDict[bytes, tuple[float, _Answer]] = OrderedDict()
        self._cache_entries = cache_entries
        self._cache_ttl_s = cache_ttl_s

    async def _tokenize(self, body: dict[str, Any]) -> _Answer:
        payload = orjson.dumps(body)
        kept = self._answers.get(payload)
        now = time.monotonic()
        if kept is not None and now - kept[0] <= self._cache_ttl_s:
            self._answers.move_to_end(payload)
            return kept[1]
        answer = await self._ask(payload)
        if self._cache_entries > 0:
            self._answers[payload] = (now, answer)
            self._answers.move_to_end(payload)
            if len(self._answers) > self._cache_entries:
                self._answers.popitem(last=False)
        return answer

    async def _ask(self, payload: bytes) -> _Answer:
        try:
            # One deadline for the round trip, and the pool's lean whole-answer path (no per-phase waits).
            status, _, raw = await self._pool.fetch("/tokenize", payload, {}, self._timeout_s)
        except http1.HTTPError as exc:
            raise TokenizeError(f"{self.base_url}/tokenize: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise TokenizeError(f"{self.base_url}/tokenize answered HTTP {status}: {raw[:200]!r}")
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise TokenizeError(f"{self.base_url}/tokenize answered invalid JSON") from exc
        tokens = doc.get("tokens") if isinstance(doc, dict) else None
        encoded = id_list_json(tokens)  # this list is every prompt id: checked in one C pass
        if encoded is None or tokens is None:
            raise TokenizeError(f"{self.base_url}/tokenize answered without a token list")
        length = doc.get("max_model_len")
        return tokens, length if type(length) is int and length > 0 else None, encoded

    async def render(self, messages: list[Any], tools: Any, template: dict[str, Any]) -> Render:
        """Render `messages` (with `tools` and template options such as chat_template_kwargs)."""
        body: dict[str, Any] = {"messages": messages, **template}
        if tools:
            body["tools"] = tools
        key = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
        if key not in self._generation_prompts:
            (prefix, length, prefix_json), (prompt, _, _) = await asyncio.gather(
                self._tokenize({**body, "add_generation_prompt": False}),
                self._tokenize({**body, "add_generation_prompt": True}),
            )
            if len(prompt) >= len(prefix) and prompt[: len(prefix)] == prefix:
                self._generation_prompts[key] = prompt[len(prefix) :]
            else:
                log.warning(
                    "this chat template's generation prompt is not a plain suffix: two /tokenize calls per call"
                )
                self._generation_prompts[key] = None
            return Render(prefix, prompt, length, prefix_json)
        suffix = self._generation_prompts[key]
        if suffix is None:
            (prefix, length, prefix_json), (prompt, _, _) = await asyncio.gather(
                self._tokenize({**body, "add_generation_prompt": False}),
                self._tokenize({**body, "add_generation_prompt": True}),
            )
            return Render(prefix, prompt, length, prefix_json)
        prefix, length, prefix_json = await self._tokenize({**body, "add_generation_prompt": False})
        return Render(prefix, prefix + suffix, length, prefix_json)

    def close(self) -> None:
        self._pool.close()


# Request fields that change what the chat template renders; /tokenize must see the same ones.
TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "add_special_tokens", "documents")


def template_options(request: dict[str, Any]) -> dict[str, Any]:
    return {name: request[name] for name in TEMPLATE_FIELDS if request.get(name) is not None}
