"""compare_calls: extends / retry / breaks, and the first differing position with tokens either side."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.capture.read.contiguity import compare_calls, first_difference


def test_a_prompt_that_extends_prompt_plus_generation_extends():
    result = compare_calls([1, 2, 3], [4, 5], [1, 2, 3, 4, 5, 6, 7])
    assert result["kind"] == "extends"
    assert result["position"] is None
    assert result["expected_length"] == 5


def test_the_same_prompt_again_is_a_retry_not_a_break():
    assert compare_calls([1, 2, 3], [4, 5], [1, 2, 3])["kind"] == "retry"


def test_a_dropped_reasoning_block_breaks_inside_the_previous_generation():
    # Previous reply: <think>=5 r r </think>=6 answer <|im_end|>=2; the next prompt re-renders it without reasoning.
    prompt, generation = [1, 10, 11, 2, 1], [5, 70, 71, 6, 80, 2]
    next_prompt = [1, 10, 11, 2, 1, 80, 2, 9, 9]
    result = compare_calls(prompt, generation, next_prompt, window=3)
    assert result["kind"] == "breaks"
    assert result["position"] == 5
    assert result["in_previous_generation"] is True
    assert result["before"] == [11, 2, 1]
    assert result["expected"] == [5, 70, 71]
    assert result["actual"] == [80, 2, 9]


def test_a_rewritten_history_breaks_inside_the_previous_prompt():
    result = compare_calls([1, 2, 3, 4, 5], [6], [1, 2, 99, 4, 5, 6, 7], window=2)
    assert result["kind"] == "breaks"
    assert result["position"] == 2
    assert result["in_previous_generation"] is False
    assert result["before"] == [1, 2]
    assert result["expected"] == [3, 4]
    assert result["actual"] == [99, 4]


def test_a_prompt_shorter_than_the_previous_one_breaks_where_it_ends():
    result = compare_calls([1, 2, 3, 4], [5], [1, 2], window=4)
    assert result["kind"] == "breaks"
    assert result["position"] == 2
    assert result["actual"] == []
    assert result["expected"] == [3, 4, 5]


def test_the_expected_window_spans_the_prompt_generation_seam():
    result = compare_calls([1, 2, 3], [4, 5, 6], [1, 2, 0], window=4)
    assert result["expected"] == [3, 4, 5, 6]


@pytest.mark.parametrize("break_at", [0, 1023, 1024, 1025, 2047, 2999])
def test_long_lists_find_the_exact_position_across_block_edges(break_at):
    head = list(range(2000))
    tail = list(range(5000, 6000))
    tokens = head + tail + [1]
    tokens[break_at] = -1
    assert first_difference(tokens, head, tail) == break_at


@given(
    st.lists(st.integers(0, 5), max_size=40),
    st.lists(st.integers(0, 5), max_size=10),
    st.lists(st.integers(0, 5), max_size=60),
)
def test_matches_a_naive_scan(prompt, generation, next_prompt):
    expected = prompt + generation
    naive = next(
        (i for i in range(len(expected)) if i >= len(next_prompt) or next_prompt[i] != expected[i]),
        None,
    )
    assert first_difference(next_prompt, prompt, generation) == naive
    result = compare_calls(prompt, generation, next_prompt)
    if naive is None:
        assert result["kind"] == "extends"
    elif next_prompt == prompt:
        assert result["kind"] == "retry"
    else:
        assert result["kind"] == "breaks" and result["position"] == naive
        # The windows really are the tokens either side of the break.
        assert next_prompt[result["position"] : result["position"] + len(result["actual"])] == result["actual"]
        assert expected[result["position"] : result["position"] + len(result["expected"])] == result["expected"]
