"""Token contiguity between consecutive calls: does a prompt extend the previous prompt + generation, and where not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Long token lists are compared a block at a time (slice equality runs in C), then one token at a
# time inside the first block that differs.
_BLOCK = 1024

EXTENDS, RETRY, BREAKS = "extends", "retry", "breaks"


def first_difference(tokens: Sequence[int], expected_head: Sequence[int], expected_tail: Sequence[int]) -> int | None:
    """The first position where `tokens` differs from `expected_head + expected_tail`, without joining them.

    None when `tokens` starts with the whole expected sequence. When `tokens` is a strict prefix of
    the expected sequence, the answer is `len(tokens)`: that is where the prompt stopped agreeing.
    """
    offset = 0
    for part in (expected_head, expected_tail):
        position = _first_mismatch(tokens, offset, part)
        if position is not None:
            return position
        offset += len(part)
    return None


def _first_mismatch(tokens: Sequence[int], offset: int, part: Sequence[int]) -> int | None:
    for start in range(0, len(part), _BLOCK):
        stop = min(start + _BLOCK, len(part))
        if tokens[offset + start : offset + stop] == part[start:stop]:
            continue
        for i in range(start, stop):
            if offset + i >= len(tokens) or tokens[offset + i] != part[i]:
                return offset + i
    return None


def compare_calls(
    previous_prompt: Sequence[int],
    previous_generation: Sequence[int],
    prompt: Sequence[int],
    *,
    window: int = 8,
) -> dict[str, Any]:
    """How `prompt` relates to the previous call's `previous_prompt + previous_generation`.

    Returns `{"kind", "position", "expected_length", "in_previous_generation", "before", "expected",
    "actual"}`:
    - kind `extends`: the prompt starts with the whole previous prompt + generation (position None);
    - kind `retry`: the prompt equals the previous prompt (the same step asked again);
    - kind `breaks`: anything else; `position` is the first differing index into the prompt.
    For a break, `before` holds up to `window` tokens both sides share just before `position`,
    `expected` the tokens the previous call implies from `position` on, `actual` the prompt's own
    tokens from `position` on (either may be shorter than `window`, or empty at an end), and
    `in_previous_generation` says whether the break falls inside the previous call's generated
    tokens (a template that re-renders the assistant turn) rather than its prompt (a rewritten history).
    """
    expected_length = len(previous_prompt) + len(previous_generation)
    result: dict[str, Any] = {
        "kind": EXTENDS,
        "position": None,
        "expected_length": expected_length,
        "in_previous_generation": None,
        "before": [],
        "expected": [],
        "actual": [],
    }
    position = first_difference(prompt, previous_prompt, previous_generation)
    if position is None:
        return result
    if len(prompt) == len(previous_prompt) and position >= len(previous_prompt):
        result["kind"] = RETRY  # equal to the previous prompt: it differs only where the generation would start
        return result
    result["kind"] = BREAKS
    result["position"] = position
    result["in_previous_generation"] = position >= len(previous_prompt)
    start = max(0, position - window)
    result["before"] = list(prompt[start:position])
    result["expected"] = _expected_slice(previous_prompt, previous_generation, position, window)
    result["actual"] = list(prompt[position : position + window])
    return result


def _expected_slice(head: Sequence[int], tail: Sequence[int], position: int, window: int) -> list[int]:
    out = list(head[position : position + window])
    if len(out) < window:
        tail_start = max(0, position - len(head))
        out.extend(tail[tail_start : tail_start + window - len(out)])
    return out
