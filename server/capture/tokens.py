"""The token triple (prompt ids, generated ids, log probs): where it lives in chat answers, and when it is sound.

vLLM returns the triple when asked (`return_token_ids`, `logprobs`): top-level `prompt_token_ids`,
per-choice `token_ids` and `logprobs.content`. This module is the one place that knows those
spellings (and the older ones), the one place that judges a triple trainable, and the one place
that reads the reasoning text, which vLLM renamed from `reasoning_content` to `reasoning`.
Everything here is pure and never raises on odd upstream output.
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import Any, NamedTuple, TypeGuard

import orjson

# What we add to a chat request so the upstream (vLLM) returns token ids and log probs.
TOKEN_REQUEST_FIELDS: tuple[tuple[str, Any], ...] = (
    ("return_token_ids", True),
    ("logprobs", True),
    ("top_logprobs", 0),
)

# Gym's names for a triple carried on a message or an output item (its training convention).
TRIPLE_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")

# vLLM's `return_tokens_as_token_ids` mode spells each generated token `token_id:<n>`.
_TOKEN_ID_PREFIX = "token_id:"

_INT_LIST_CHARS = b"-0123456789,"  # what a serialised list of ints holds inside its brackets
_NUMBER_TYPES = {int, float}


class TokenTriple(NamedTuple):
    """One generated turn's tokens: the prompt ids, the generated ids, and one log prob per generated id."""

    prompt_ids: list[int]
    generation_ids: list[int]
    log_probs: list[float]


def reasoning_of(message: object) -> str | None:
    """The reasoning text of a chat message or stream delta, or None when it has none.

    `reasoning_content` is the field vLLM wrote until about 0.24, `reasoning` the one it writes now;
    the first that holds text wins.
    """
    if not isinstance(message, dict):
        return None
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def is_token_ids(value: object, *, allow_empty: bool = False) -> TypeGuard[list[int]]:
    """True for a list of plain ints (bools are not token ids); non-empty unless `allow_empty`."""
    if not isinstance(value, list):
        return False
    if not value:
        return allow_empty
    # The list serialised in C (~4x faster than collecting the element types, which matters for
    # 100k-token prompts): ints leave only digits, minus signs and commas inside the brackets; a
    # bool, float, string, null or nested list leaves letters, dots, quotes or brackets. Ints
    # beyond 64 bits fail to serialise.
    try:
        return orjson.dumps(value).translate(None, _INT_LIST_CHARS) == b"[]"
    except orjson.JSONEncodeError:
        return False


def is_finite_numbers(value: object) -> TypeGuard[list[float]]:
    """True for a list of finite ints and floats (bools excluded)."""
    if not isinstance(value, list):
        return False
    if not set(map(type, value)) <= _NUMBER_TYPES:
        return False
    return all(map(math.isfinite, value))


def token_id_of(entry: object) -> int | None:
    """The token id a chat logprob entry names: its `token_id`, or a `token_id:<n>` token string."""
    if not isinstance(entry, dict):
        return None
    token_id = entry.get("token_id")
    if type(token_id) is int:
        return token_id
    token = entry.get("token")
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
        try:
            return int(token[len(_TOKEN_ID_PREFIX) :])
        except ValueError:
            return None
    return None


def logprob_entries(choice: object) -> list[Any] | None:
    """A choice's (or stream choice's) `logprobs.content` list, or None when there is none."""
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) else None


def prompt_token_ids(chat: dict[str, Any], choice: dict[str, Any]) -> Any:
    """The prompt ids as the upstream returned them: top level (vLLM), else on the choice (older servers)."""
    ids = chat.get("prompt_token_ids")
    return choice.get("prompt_token_ids") if ids is None else ids


def generation_tokens(choice: dict[str, Any]) -> tuple[Any, list[Any] | None]:
    """The generated ids and their log probs, as the upstream returned them (judged by `triple_problem`).

    The ids are the choice's `token_ids`, else parsed from the logprob entries' `token_id:<n>`
    tokens (None if any entry has none); the log probs are each entry's `logprob`.
    """
    entries = logprob_entries(choice)
    log_probs = None if entries is None else _logprobs_of(entries)
    generation_ids = choice.get("token_ids")
    if generation_ids is None and entries is not None:
        parsed = [token_id_of(entry) for entry in entries]
        generation_ids = None if None in parsed else parsed
    return generation_ids, log_probs


def generation_token_texts(choice: dict[str, Any]) -> list[str] | None:
    """Each generated token's text as the upstream spelled it (vLLM's `logprobs.content[].token`);
    None without logprobs, when an entry has no text, or in `return_tokens_as_token_ids` mode (those
    strings are ids, not text)."""
    content = logprob_entries(choice)
    if not content:
        return None
    # A generation of thousands of tokens is read on every captured call, so the usual case runs in
    # C: a non-dict entry or a missing text raises in the comprehension, a text that is not a string
    # in the join, and only a join holding the prefix somewhere has each text checked for it.
    try:
        texts = [entry["token"] for entry in content]
        if _TOKEN_ID_PREFIX in "".join(texts) and any(map(str.startswith, texts, repeat(_TOKEN_ID_PREFIX))):
            return None
    except (KeyError, TypeError):
        return None
    return texts


def _logprobs_of(entries: list[Any]) -> list[Any]:
    """Each logprob entry's `logprob` (None for an entry without one): one C comprehension in the usual case."""
    try:
        return [entry["logprob"] for entry in entries]
    except (KeyError, TypeError):
        return [entry.get("logprob") if isinstance(entry, dict) else None for entry in entries]


def triple_problem(prompt_ids: object, generation_ids: object, log_probs: object) -> str | None:
    """Why a triple cannot train a model (non-empty int ids, finite log probs, one per id); None when it can."""
    if not is_token_ids(prompt_ids):
        return "prompt_token_ids is not a non-empty list of ints"
    if not is_token_ids(generation_ids):
        return "generation_token_ids is not a non-empty list of ints"
    if not is_finite_numbers(log_probs):
        return "generation_log_probs is not a list of finite numbers"
    n_ids, n_log_probs = len(generation_ids), len(log_probs)
    if n_ids != n_log_probs:
        return f"generation_token_ids ({n_ids}) and generation_log_probs ({n_log_probs}) have different lengths"
    return None


def _well_formed(prompt_ids: object, generation_ids: object, log_probs: object) -> bool:
    # What a client may be handed: the shapes are right, even if empty (e.g. a zero-token answer).
    return (
        is_token_ids(prompt_ids, allow_empty=True)
        and is_token_ids(generation_ids, allow_empty=True)
        and is_finite_numbers(log_probs)
        and len(generation_ids) == len(log_probs)
    )


def token_triple(chat: dict[str, Any]) -> TokenTriple | None:
    """(prompt ids, generated ids, log probs) of a chat answer's first choice, or None.

    Sources, first present wins: a complete bundle already on the message (Gym's names); the
    upstream's own fields (see `prompt_token_ids` and `generation_tokens`). None when a part is
    missing or malformed, a log prob is not finite, or the lengths disagree; empty lists pass.
    """
    choices = chat.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, dict):
        bundle = [message.get(key) for key in TRIPLE_KEYS]
        if all(isinstance(part, list) for part in bundle):
            return TokenTriple(bundle[0], bundle[1], bundle[2]) if _well_formed(*bundle) else None  # type: ignore[arg-type]
    prompt_ids = prompt_token_ids(chat, choice)
    generation_ids, log_probs = generation_tokens(choice)
    if not _well_formed(prompt_ids, generation_ids, log_probs):
        return None
    return TokenTriple(prompt_ids, generation_ids, log_probs)  # type: ignore[arg-type]  # checked by _well_formed


def strip_token_fields(chat: dict[str, Any], added: frozenset[str], *, in_place: bool = False) -> dict[str, Any]:
    """Without the token fields we asked for but the client did not, so it gets the shape it asked for.

    Works on a chat answer and on a stream chunk alike. By default a copy of the levels it changes,
    never an edit: the original may be on its way into a capture record on the writer thread.
    `in_place` edits `chat` itself, for a stream chunk parsed only to be fed to the accumulator and
    sent on: the accumulator keeps the lists and entries, never the chunk's own dicts.
    """
    out = chat if in_place else dict(chat)
    if "return_token_ids" in added:
        out.pop("prompt_token_ids", None)
    choices = out.get("choices")
    if isinstance(choices, list):
        stripped = choices if in_place else []
        for choice in choices:
            if isinstance(choice, dict):
                if not in_place:
                    choice = dict(choice)
                if "return_token_ids" in added:
                    choice.pop("token_ids", None)
                if "logprobs" in added and "logprobs" in choice:
                    choice["logprobs"] = None
            if not in_place:
                stripped.append(choice)
        out["choices"] = stripped
    return out
