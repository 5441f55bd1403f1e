"""The mock's deterministic tokenizer: special tokens whole, other pieces hashed to stable ids."""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<tool_call>": 3,
    "</tool_call>": 4,
    "<think>": 5,
    "</think>": 6,
}
IM_END_ID = SPECIAL_TOKENS["<|im_end|>"]
IM_END = "<|im_end|>"

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
# Every character is either \w, \s or neither, so the pieces always concatenate back to the text.
_PIECE_RE = re.compile(r" ?\w+| ?[^\w\s]+|\s+")
_PIECE_ID_BASE = 1000
_PIECE_ID_SPAN = 100_000
# Every id the tokenizer can produce is below this (vLLM rejects prompt ids outside its vocabulary).
VOCAB_SIZE = _PIECE_ID_BASE + _PIECE_ID_SPAN


def piece_id(piece: str) -> int:
    """The id of an ordinary (non-special) piece: stable across processes and runs."""
    return _PIECE_ID_BASE + zlib.crc32(piece.encode("utf-8")) % _PIECE_ID_SPAN


class _PieceIds(dict[str, int]):
    """piece -> id, computing unknown pieces on first use so lookups stay in C (`map(d.__getitem__, ...)`)."""

    def __missing__(self, piece: str) -> int:
        value = self[piece] = piece_id(piece)
        return value


def split_pieces(text: str) -> list[str]:
    """The token pieces of `text`: special tokens whole, the rest split by `_PIECE_RE`.

    The text right after `<|im_start|>` is cut after its first newline, so the role header
    (`assistant\\n`) never merges with the message body. That is what makes a rendered
    conversation tokenise to the concatenation of its per-message tokenisations, and a reply's
    generated ids reappear unchanged in the next turn's prompt.
    """
    parts = _SPECIAL_RE.split(text)
    if len(parts) == 1:
        return _PIECE_RE.findall(text)
    out: list[str] = []
    after_im_start = False
    for index, part in enumerate(parts):
        if index % 2:
            out.append(part)
            after_im_start = part == "<|im_start|>"
            continue
        if not part:
            continue
        if after_im_start:
            newline = part.find("\n")
            if newline >= 0:
                out += _PIECE_RE.findall(part[: newline + 1])
                part = part[newline + 1 :]
        out += _PIECE_RE.findall(part)
    return out


class Tokenizer:
    """Deterministic tokenizer with a per-block cache (prompts repeat their system block on every call)."""

    def __init__(self, *, block_cache_entries: int = 4096, max_pieces: int = 500_000) -> None:
        self._ids = _PieceIds(SPECIAL_TOKENS)
        self._blocks: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._block_cache_entries = block_cache_entries
        self._max_pieces = max_pieces

    def ids_of(self, pieces: list[str]) -> list[int]:
        if len(self._ids) > self._max_pieces:
            # Random text could grow the table forever; dropping it only costs recomputation.
            self._ids = _PieceIds(SPECIAL_TOKENS)
        return list(map(self._ids.__getitem__, pieces))

    def encode(self, text: str) -> list[int]:
        return self.ids_of(split_pieces(text))

    def encode_block(self, block: str) -> tuple[int, ...]:
        """`encode`, cached: meant for whole rendered messages, which recur turn after turn."""
        cached = self._blocks.get(block)
        if cached is not None:
            self._blocks.move_to_end(block)
            return cached
        ids = tuple(self.encode(block))
        self._blocks[block] = ids
        if len(self._blocks) > self._block_cache_entries:
            self._blocks.popitem(last=False)
        return ids
