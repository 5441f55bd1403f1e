"""Prompt token ids sent in the request, as vLLM, SGLang and NeMo-RL's worker take them on the chat path.

- `kv_transfer_params.prompt_token_ids` (vLLM) and a top-level `prompt_token_ids` (the first-class
  field vLLM may add), `input_ids` (SGLang): the ids are the whole prompt; the template is skipped.
- `required_prefix_token_ids` (NeMo-RL): the template renders, then the caller's history is kept up
  to its last end-of-turn and the template's tokens resume after the matching end-of-turn.

Ids are validated as vLLM does: a non-empty list of non-negative ints inside the vocabulary.
"""

from __future__ import annotations

from typing import Any

from server.dev.mock_upstream.tokenizer import IM_END_ID, VOCAB_SIZE
from server.errors import OpenAIError
from server.injection.id_lists import is_id_list

# token_in modes: `honor` uses the fields; `ignore` renders the template as if they were absent.
MODES = ("honor", "ignore")


def _validated(name: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not value:
        raise OpenAIError(400, f"{name} must be a non-empty list of token ids", param=name, code="invalid_value")
    # The common case in two C passes (non-negative ints, by their compact JSON; then the top of the
    # range): 3x cheaper than a type set plus min and max on a 1,500-id prompt. The loop below only
    # names the first bad id.
    if is_id_list(value) and max(value) < VOCAB_SIZE:
        return value
    for token in value:
        if type(token) is not int or token < 0 or token >= VOCAB_SIZE:
            raise OpenAIError(400, f"{name}: token id {token!r} is out of vocabulary (size {VOCAB_SIZE})", param=name)
    return value


def requested_prompt(body: dict[str, Any]) -> tuple[str, list[int], bool] | None:
    """(field name, ids, whether the engine splices) for the token-in field the request carries, if any."""
    kv = body.get("kv_transfer_params")
    if isinstance(kv, dict) and "prompt_token_ids" in kv:
        return (
            "kv_transfer_params.prompt_token_ids",
            _validated("kv_transfer_params.prompt_token_ids", kv["prompt_token_ids"]),
            False,
        )
    for name, splice in (("prompt_token_ids", False), ("input_ids", False), ("required_prefix_token_ids", True)):
        if name in body and body[name] is not None:
            return name, _validated(name, body[name]), splice
    return None


def splice(prefix: list[int], rendered: list[int]) -> list[int]:
    """NeMo-RL's splice: the caller's ids up to their last end-of-turn, then the template after the matching one."""
    if IM_END_ID not in prefix:
        raise OpenAIError(400, "required_prefix_token_ids has no end-of-turn token", param="required_prefix_token_ids")
    cut = len(prefix) - 1 - prefix[::-1].index(IM_END_ID)
    turns = prefix[: cut + 1].count(IM_END_ID)
    seen = 0
    for index, token in enumerate(rendered):
        if token == IM_END_ID:
            seen += 1
            if seen == turns:
                return prefix[: cut + 1] + rendered[index + 1 :]
    raise OpenAIError(
        400, "required_prefix_token_ids has more turns than the messages", param="required_prefix_token_ids"
    )
