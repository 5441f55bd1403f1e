"""The continuation index: same answers as scanning every later record, with work linear in the records."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.capture.rollout import reconstruct, reconstruct_session
from server.capture.rollout.continuation import ContinuationIndex
from tests.support.rollouts import make_record


def _independent(n: int, seed: int = 0) -> list[tuple[list, list]]:
    """n calls sharing a system prompt, each with its own user turn: none continues any other."""
    rng = random.Random(seed)
    system = [rng.randrange(1000, 100000) for _ in range(64)]
    calls = []
    for _ in range(n):
        prompt = system + [rng.randrange(1000, 100000) for _ in range(rng.randrange(5, 40))]
        calls.append((prompt, [rng.randrange(1000, 100000) for _ in range(8)]))
    return calls


def _chain(n: int, seed: int = 0) -> list[tuple[list, list]]:
    """n calls, each prompt = the previous prompt + generation + a tool result."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 100000) for _ in range(64)]
    calls = []
    for _ in range(n):
        generation = [rng.randrange(1000, 100000) for _ in range(2)]
        calls.append((prompt, generation))
        prompt = prompt + generation + [rng.randrange(1000, 100000)]
    return calls


def _work(calls: list[tuple[list, list]], *, indexed: bool) -> tuple[int, list[bool]]:
    index = ContinuationIndex([prompt for prompt, _ in calls], indexed=indexed)
    answers = [index.continued(i, prompt, generation) for i, (prompt, generation) in enumerate(calls)]
    return index.work, answers


@pytest.mark.parametrize("shape", [_independent, _chain])
def test_work_grows_linearly_with_the_records(shape):
    small, _ = _work(shape(250), indexed=True)
    large, answers = _work(shape(2000), indexed=True)
    assert large / small <= 10  # 8x the records
    if shape is _chain:
        assert answers == [True] * 1999 + [False]
    else:
        assert not any(answers)


def test_negative_control_scanning_every_later_record_is_quadratic():
    small, _ = _work(_independent(250), indexed=False)
    large, _ = _work(_independent(2000), indexed=False)
    assert large / small > 40


def _sessions():
    """Prompts built from a few shared stems so that prefixes, continuations and near misses all occur."""
    token = st.integers(0, 3)
    call = st.tuples(st.lists(token, min_size=1, max_size=6), st.lists(token, min_size=1, max_size=3))
    return st.lists(call, max_size=12)


@settings(max_examples=200, deadline=None)
@given(_sessions(), st.randoms(use_true_random=False))
def test_same_answers_as_scanning_every_later_record(calls, rng):
    # Make some prompts continue earlier ones, so both answers occur often.
    for k in range(1, len(calls)):
        if rng.random() < 0.5:
            j = rng.randrange(k)
            prompt, generation = calls[j]
            calls[k] = (prompt + generation + calls[k][0][: rng.randrange(3)], calls[k][1])
    prompts: list[list | None] = [prompt if rng.random() < 0.9 else None for prompt, _ in calls]
    fast = ContinuationIndex(prompts)
    slow = ContinuationIndex(prompts, indexed=False)
    for i, (prompt, generation) in enumerate(calls):
        assert fast.continued(i, prompt, generation) == slow.continued(i, prompt, generation)


def _records(calls: list[tuple[list, list]]) -> list[dict]:
    return [
        make_record(
            i,
            [{"role": "user", "content": f"task {i}"}, {"role": "assistant", "content": "ok"}],
            {"prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": [-0.5] * len(gen)},
            uuid=f"uuid-{i:05d}",
            captured_at=f"2026-07-14T00:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}+00:00",
        )
        for i, (prompt, gen) in enumerate(calls)
    ]


@pytest.mark.parametrize("indexed", [True, False])
def test_reconstruction_of_independent_calls_uses_the_index(monkeypatch, indexed):
    """Through reconstruct_session: the anchor search over independent calls is linear with the index
    and quadratic without it (the negative control)."""
    made: list[ContinuationIndex] = []

    def tracked(prompts):
        index = ContinuationIndex(prompts, indexed=indexed)
        made.append(index)
        return index

    monkeypatch.setattr(reconstruct, "ContinuationIndex", tracked)
    work = []
    for n in (250, 2000):
        rollout = reconstruct_session("abc123", _records(_independent(n)))
        assert rollout["partial_reason"] is not None  # independent calls do not form one chain
        work.append(made[-1].work)
    if indexed:
        assert work[1] / work[0] <= 10
    else:
        assert work[1] / work[0] > 40
