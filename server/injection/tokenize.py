"""The engine's chat-form `/tokenize`: the template render of a call's messages, one round trip per call.

A call needs two renders: its messages without the generation prompt (the next call's cut point)
and with it (to find the environment suffix). For templates whose generation prompt is a plain
suffix, which is every common one, the generation prompt's ids are learned once per template
configuration and appended locally, so the steady state is one round trip per call.

Answers are kept briefly, keyed by the exact request bytes (a retried call, or a side call that
sends the same messages, needs no round trip); the same bytes to the same engine render the same ids.
An answer's ids stay the JSON bytes they came as (server.injection.id_lists): at tens of thousands of
ids, making each a Python int costs more than the rest of the call's bookkeeping.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from server.injection.id_lists import begins_with, count_ids, id_list_json, ids_after, looks_like_id_list
from server.upstream import http1
from server.urls import root_url

log = logging.getLogger("switchyard_model.injection")


# A /tokenize answer: the ids as compact JSON (server.injection.id_lists), how many, the engine's max_model_len if it said.
_Answer = tuple[bytes, int, int | None]
_TOKENS_KEY = b'"tokens":['


class TokenizeError(Exception):
    """The engine's /tokenize did not give a usable answer."""


@dataclass(frozen=True, slots=True)
class Render:
    """A call's messages as the chat template renders them, without the generation prompt (`prefix`,
    where the next call is cut) and with it (`prompt`). The ids stay compact JSON (server.injection.id_lists):
    a call matches, cuts and digests them as bytes and parses only the ids after its chain's cut."""

    prefix_json: bytes
    prefix_len: int
    max_model_len: int | None
    generation_prompt: tuple[int, ...] = ()  # what the template appends to the prefix for a reply ...
    whole_prompt: list[int] | None = None  # ... or the prompt rendered on its own, when that is not a plain suffix

    @property
    def prefix(self) -> list[int]:
        ids: list[int] = orjson.loads(self.prefix_json)
        return ids

    @property
    def prompt(self) -> list[int]:
        return self.whole_prompt if self.whole_prompt is not None else self.prefix + list(self.generation_prompt)

    @property
    def prompt_len(self) -> int:
        return (
            len(self.whole_prompt) if self.whole_prompt is not None else self.prefix_len + len(self.generation_prompt)
        )

    def prompt_after(self, head_json: bytes) -> list[int]:
        """The prompt's ids after `head_json`, an id list the prefix begins with (a chain's cut point)."""
        if self.whole_prompt is not None:
            return self.whole_prompt[count_ids(head_json) :]
        return ids_after(self.prefix_json, head_json) + list(self.generation_prompt)

    @classmethod
    def of_lists(cls, prefix: list[int], prompt: list[int], max_model_len: int | None) -> Render:
        """A render made here (the `renderers` bridge, tests) from its two id lists."""
        return cls(orjson.dumps(prefix), len(prefix), max_model_len, whole_prompt=list(prompt))


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
        self._generation_prompts: dict[bytes, tuple[int, ...] | None] = {}
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
        answer = _tokens_cut_out(raw)
        if answer is not None:
            return answer
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise TokenizeError(f"{self.base_url}/tokenize answered invalid JSON") from exc
        tokens = doc.get("tokens") if isinstance(doc, dict) else None
        encoded = id_list_json(tokens)  # this list is every prompt id: checked in one C pass
        if encoded is None or tokens is None:
            raise TokenizeError(f"{self.base_url}/tokenize answered without a token list")
        return encoded, len(tokens), _model_len(doc)

    async def render(self, messages: list[Any], tools: Any, template: dict[str, Any]) -> Render:
        """Render `messages` (with `tools` and template options such as chat_template_kwargs)."""
        body: dict[str, Any] = {"messages": messages, **template}
        if tools:
            body["tools"] = tools
        try:
            return await self._render(body, orjson.dumps(template, option=orjson.OPT_SORT_KEYS))
        except ValueError as exc:  # an answer of digits and commas that are not plain JSON integers (`01`)
            raise TokenizeError(f"{self.base_url}/tokenize answered ids that are not JSON integers") from exc

    async def _render(self, body: dict[str, Any], key: bytes) -> Render:
        if key not in self._generation_prompts:
            (prefix_json, n, length), (prompt_json, m, _) = await asyncio.gather(
                self._tokenize({**body, "add_generation_prompt": False}),
                self._tokenize({**body, "add_generation_prompt": True}),
            )
            if m >= n and begins_with(prompt_json, prefix_json):
                self._generation_prompts[key] = tuple(ids_after(prompt_json, prefix_json))
            else:
                log.warning(
                    "this chat template's generation prompt is not a plain suffix: two /tokenize calls per call"
                )
                self._generation_prompts[key] = None
            return Render(prefix_json, n, length, whole_prompt=ids_after(prompt_json, b"[]"))
        suffix = self._generation_prompts[key]
        if suffix is None:
            (prefix_json, n, length), (prompt_json, _, _) = await asyncio.gather(
                self._tokenize({**body, "add_generation_prompt": False}),
                self._tokenize({**body, "add_generation_prompt": True}),
            )
            return Render(prefix_json, n, length, whole_prompt=ids_after(prompt_json, b"[]"))
        prefix_json, n, length = await self._tokenize({**body, "add_generation_prompt": False})
        return Render(prefix_json, n, length, generation_prompt=suffix)

    def close(self) -> None:
        self._pool.close()


def _model_len(doc: dict[str, Any]) -> int | None:
    length = doc.get("max_model_len")
    return length if type(length) is int and length > 0 else None


def _tokens_cut_out(raw: bytes) -> _Answer | None:
    """A vLLM-shaped answer's `tokens` array taken as it came, without making a Python int per id;
    None when the answer is laid out otherwise (then it is parsed whole).

    The cut is the top-level `tokens` value exactly when the array holds only digits and commas, the
    rest of the answer parses with an empty list in its place, and the engine's own `count` agrees
    with the commas (an empty element would add one).
    """
    at = raw.find(_TOKENS_KEY)
    if at < 0:
        return None
    start = at + len(_TOKENS_KEY) - 1
    end = raw.find(b"]", start)
    if end < 0:
        return None
    encoded = raw[start : end + 1]
    if not looks_like_id_list(encoded):
        return None
    try:
        rest = orjson.loads(raw[:start] + b"[]" + raw[end + 1 :])
    except orjson.JSONDecodeError:
        return None
    n = count_ids(encoded)
    if not isinstance(rest, dict) or rest.get("tokens") != [] or rest.get("count") != n:
        return None
    return encoded, n, _model_len(rest)


# Request fields that change what the chat template renders; /tokenize must see the same ones.
TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "add_special_tokens", "documents")


def template_options(request: dict[str, Any]) -> dict[str, Any]:
    return {name: request[name] for name in TEMPLATE_FIELDS if request.get(name) is not None}
