"""Token-exact capture, by job: write/, catalog/, read/, rollout/ and gym/; store.py the capture store
(writes and reads, so it sits above both); tokens.py the token triple rules they share.

Its surface: the token triple names, and the `store` module (re-exporting its names here would import
the whole store wherever a token rule is needed)."""

from __future__ import annotations

from server.capture.tokens import (
    TOKEN_REQUEST_FIELDS,
    TokenTriple,
    generation_token_texts,
    generation_tokens,
    is_finite_numbers,
    is_token_ids,
    logprob_entries,
    prompt_token_ids,
    reasoning_of,
    strip_token_fields,
    token_triple,
    triple_problem,
)

__all__ = [
    "store",
    "TOKEN_REQUEST_FIELDS",
    "TokenTriple",
    "generation_token_texts",
    "generation_tokens",
    "is_finite_numbers",
    "is_token_ids",
    "logprob_entries",
    "prompt_token_ids",
    "reasoning_of",
    "strip_token_fields",
    "token_triple",
    "triple_problem",
]
