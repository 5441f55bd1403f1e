"""Which calls a later call continues from: "does any later prompt start with this prompt+generation?", in linear time.

The reconstruction asks this of records to pick the session's anchor and to tell side calls from
breaks. Asked naively (scan every later record for every record), a session of independent calls
costs quadratic work: 4,000 such calls took 41x the time of 500. Here each answer first looks at
the next few records (in an agent session the continuation is almost always the very next call), and
only if none of them continues does it consult a prefix tree of all prompts, built once, lazily.
Both paths give the same answer; `work` counts the comparisons and tree steps so a test can check
the growth without timing anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# How many following records are tried before the prefix tree: covers a continuation right after
# its call, with a retry or a side call in between.
NEAR_WINDOW = 4


def extends(prompt: list[Any], prior_prompt: list[Any], prior_generation: list[Any]) -> bool:
    """`prompt` starts with prior_prompt + prior_generation (Gym's contiguity rule).

    The short generation part is compared first, so a mismatch is cheap, and nothing is
    concatenated, so the growing history is never copied.
    """
    n, g = len(prior_prompt), len(prior_generation)
    return len(prompt) >= n + g and prompt[n : n + g] == prior_generation and prompt[:n] == prior_prompt


class _Node:
    """A prefix-tree node: the edge label leading here, children by their label's first token, and
    the latest position of any prompt that passes through or ends in this subtree."""

    __slots__ = ("children", "label", "last")

    def __init__(self, label: list[Any], last: int) -> None:
        self.label = label
        self.last = last
        self.children: dict[object, _Node] = {}


class ContinuationIndex:
    """For records at positions 0..n-1 (their prompts; None where a record has none), answers
    `continued(position, prompt, generation)`: some record after `position` has a prompt that starts
    with prompt + generation. `indexed=False` scans every later record instead (quadratic, kept
    as the reference the tests compare against)."""

    def __init__(self, prompts: Sequence[list[Any] | None], *, indexed: bool = True) -> None:
        self._prompts = prompts
        self._indexed = indexed
        self._root: _Node | None = None
        self._answers: dict[int, bool] = {}
        self.work = 0  # comparisons and tree steps made so far

    def continued(self, position: int, prompt: list[Any], generation: list[Any]) -> bool:
        answer = self._answers.get(position)
        if answer is None:
            answer = self._answer(position, prompt, generation)
            self._answers[position] = answer
        return answer

    def _answer(self, position: int, prompt: list[Any], generation: list[Any]) -> bool:
        prompts = self._prompts
        end = len(prompts) if not self._indexed else min(len(prompts), position + 1 + NEAR_WINDOW)
        for later in range(position + 1, end):
            candidate = prompts[later]
            self.work += 1
            if candidate is not None and extends(candidate, prompt, generation):
                return True
        if not self._indexed or end >= len(prompts):
            return False
        return self._tree_has_later(prompt + generation, position)

    # -- the prefix tree (a radix tree over token ids; labels compared as list slices, at C speed) --

    def _tree(self) -> _Node:
        if self._root is None:
            self._root = _Node([], -1)
            for position, prompt in enumerate(self._prompts):
                if prompt:
                    self._insert(prompt, position)
        return self._root

    def _insert(self, seq: list[Any], position: int) -> None:
        node = self._root
        assert node is not None
        node.last = max(node.last, position)
        i, n = 0, len(seq)
        while i < n:
            self.work += 1
            child = node.children.get(seq[i])
            if child is None:
                node.children[seq[i]] = _Node(seq[i:], position)
                return
            label = child.label
            shared = _common_prefix(label, seq, i)
            if shared < len(label):
                # Split the edge where the new prompt leaves it.
                middle = _Node(label[:shared], max(child.last, position))
                child.label = label[shared:]
                middle.children[child.label[0]] = child
                node.children[seq[i]] = middle
                if i + shared < n:
                    middle.children[seq[i + shared]] = _Node(seq[i + shared :], position)
                return
            child.last = max(child.last, position)
            node, i = child, i + len(label)

    def _tree_has_later(self, seq: list[Any], position: int) -> bool:
        """Some prompt after `position` has `seq` as a prefix."""
        node = self._tree()
        i, n = 0, len(seq)
        while i < n:
            self.work += 1
            child = node.children.get(seq[i])
            if child is None:
                return False
            label = child.label
            take = min(len(label), n - i)
            if seq[i : i + take] != label[:take]:
                return False
            node, i = child, i + take
        return node.last > position


def _common_prefix(label: list[Any], seq: list[Any], start: int) -> int:
    """How many leading elements of `label` equal seq[start:], found with slice comparisons."""
    length = min(len(label), len(seq) - start)
    if seq[start : start + length] == label[:length]:
        return length
    low, high = 0, length  # label[:low] matches; label[:high] does not
    while high - low > 1:
        mid = (low + high) // 2
        if seq[start : start + mid] == label[:mid]:
            low = mid
        else:
            high = mid
    return low
