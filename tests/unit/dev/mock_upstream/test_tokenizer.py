"""The mock tokenizer: pieces cover the text, ids are fixed, a reply's ids survive the next turn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.dev.mock_upstream.generation import filler_text
from server.dev.mock_upstream.template import GENERATION_PROMPT
from server.dev.mock_upstream.tokenizer import IM_END_ID, SPECIAL_TOKENS, piece_id, split_pieces
from tests.support.mock_chat import tokenizer


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_pieces_cover_the_text_exactly(text: str) -> None:
    assert "".join(split_pieces(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_reply_ids_reappear_unchanged_after_the_generation_prompt(body: str) -> None:
    # The header rule: whatever the reply starts with (spaces, newlines), the next turn's
    # tokenisation of "<|im_start|>assistant\n" + reply + "<|im_end|>" keeps the reply's ids.
    whole = tokenizer.encode(GENERATION_PROMPT + body + "<|im_end|>\n")
    assert whole == tokenizer.encode(GENERATION_PROMPT) + tokenizer.encode(body) + [IM_END_ID] + tokenizer.encode("\n")


def test_token_ids_are_fixed() -> None:
    assert tokenizer.encode("<|im_start|>user\nHello, world!<|im_end|>") == [
        1,
        piece_id("user"),
        piece_id("\n"),
        piece_id("Hello"),
        piece_id(","),
        piece_id(" world"),
        piece_id("!"),
        2,
    ]
    assert SPECIAL_TOKENS["<|im_start|>"] == 1 and SPECIAL_TOKENS["<|im_end|>"] == 2
    assert all(1000 <= piece_id(p) < 101000 for p in ("a", " b", "!!", "\n\n"))
    assert split_pieces("x  y\tz_1 (ok)") == ["x", "  ", "y", "\t", "z_1", " (", "ok", ")"]
    assert len(tokenizer.encode(filler_text(37))) == 37
