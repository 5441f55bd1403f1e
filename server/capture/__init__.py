"""Token-exact capture, by job: write/, catalog/, read/, rollout/ and gym/; tokens.py the token triple rules they share."""

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
