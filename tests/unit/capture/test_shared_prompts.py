"""SharedPrompts: a session's records parse to exactly what orjson gives, while the prompt ids each
repeats from an earlier record are parsed once and shared."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.capture.read.shared_prompts import MAX_CANDIDATES, SharedPrompts


def _chain(calls: int, seed: int = 1) -> list[bytes]:
    """An agent session's records: each prompt is the previous prompt + generation + a tool result."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 150_000) for _ in range(300)]
    records = []
    for k in range(calls):
        generation = [rng.randrange(1000, 150_000) for _ in range(20)]
        records.append(
            orjson.dumps(
                {
                    "uuid": f"u{k}",
                    "messages": [{"role": "user", "content": f"turn {k} [1,2]"}],
                    "prompt_token_ids": prompt,
                    "generation_token_ids": generation,
                    "generation_log_probs": [-0.5] * len(generation),
                }
            )
        )
        prompt = prompt + generation + [rng.randrange(1000, 150_000) for _ in range(30)]
    return records


def test_a_chain_read_in_any_order_parses_as_orjson_and_shares_the_repeated_ids():
    records = _chain(40)
    order = list(range(len(records)))
    random.Random(7).shuffle(order)
    shared = SharedPrompts()
    parsed = {k: shared.loads(records[k]) for k in order}
    for k, record in parsed.items():
        assert record == orjson.loads(records[k])

    # The feature itself: the ids each prompt repeats are the int objects of the prompt it extends
    # (ids above 256 are fresh objects each time orjson parses them), so the session holds few.
    def distinct_objects(records):
        return len({id(i) for record in records for i in record["prompt_token_ids"]})

    total = sum(len(record["prompt_token_ids"]) for record in parsed.values())
    assert distinct_objects(parsed.values()) < total / 5
    kept = [orjson.loads(data) for data in records]  # kept alive, so ids are not reused
    assert distinct_objects(kept) == total
    # And every record has a list of its own: changing one never changes another.
    ids = [id(record["prompt_token_ids"]) for record in parsed.values()]
    assert len(set(ids)) == len(ids)


def test_a_retry_and_a_prompt_that_stops_inside_a_generation_parse_exactly():
    shared = SharedPrompts()
    base = orjson.dumps({"prompt_token_ids": [500, 501, 502], "generation_token_ids": [600, 601]})
    retry = orjson.dumps({"prompt_token_ids": [500, 501, 502], "generation_token_ids": [700]})
    inside = orjson.dumps({"prompt_token_ids": [500, 501, 502, 600], "generation_token_ids": []})
    longer = orjson.dumps({"prompt_token_ids": [500, 501, 502, 600, 601, 9], "generation_token_ids": None})
    shorter = orjson.dumps({"prompt_token_ids": [500, 501], "generation_token_ids": [1]})
    for data in (base, retry, inside, longer, shorter):
        assert shared.loads(data) == orjson.loads(data)
    retried = shared.loads(retry)["prompt_token_ids"]
    assert retried is not shared.loads(base)["prompt_token_ids"]


@pytest.mark.parametrize(
    "text",
    [
        # The key also appears nested (a message that quotes a record) or inside a string.
        b'{"messages":[{"prompt_token_ids":[500,501]}],"prompt_token_ids":[500,501,502],"generation_token_ids":[7]}',
        b'{"messages":["\\"prompt_token_ids\\":[500,501]"],"prompt_token_ids":[500,501,502,7,8]}',
        b'{"note":"\\"prompt_token_ids\\":[500,501,502,7,8]","prompt_token_ids":[1]}',
        # Not flat arrays of numbers, or not arrays at all.
        b'{"prompt_token_ids":[500,501,502,[1]],"generation_token_ids":[]}',
        b'{"prompt_token_ids":[500,501,502,"]"]}',
        b'{"prompt_token_ids":null}',
        b'{"prompt_token_ids":[]}',
        b'[{"prompt_token_ids":[500,501,502]}]',
        # Other spacing and number forms: identical text parses identically, other text is parsed afresh.
        b'{"prompt_token_ids": [500, 501, 502, 7, 8, 9]}',
        b'{"prompt_token_ids":[500,501,502,7.0,8]}',
        b'{"prompt_token_ids":[500,501,502,7,8,1e3]}',
    ],
)
def test_unusual_records_parse_exactly_as_orjson(text):
    shared = SharedPrompts()
    shared.loads(b'{"prompt_token_ids":[500,501,502],"generation_token_ids":[7,8]}')
    assert shared.loads(text) == orjson.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        b'{"prompt_token_ids":[500,501,502,]}',  # a trailing comma after a known prefix
        b'{"prompt_token_ids":[500,501,502,7,8,],"x":1}',
        b'{"prompt_token_ids":[500,501,502,7,8',  # torn
        b'{"prompt_token_ids":[500,501,502,7,8]',
        b'{"prompt_token_ids":[500,501,502,7,8]}}',
    ],
)
def test_what_orjson_refuses_is_refused(text):
    shared = SharedPrompts()
    shared.loads(b'{"prompt_token_ids":[500,501,502],"generation_token_ids":[7,8]}')
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    with pytest.raises(orjson.JSONDecodeError):
        shared.loads(text)


_ids = st.lists(st.integers(min_value=0, max_value=300_000), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_ids, _ids, st.booleans()), min_size=1, max_size=12))
def test_any_sequence_of_prompts_parses_as_orjson(steps):
    """Prompts that extend, repeat, cut into or ignore earlier ones, in any order."""
    shared, prompt = SharedPrompts(), []
    for added, generation, restart in steps:
        prompt = added if restart else prompt + added
        data = orjson.dumps({"prompt_token_ids": prompt, "generation_token_ids": generation})
        assert shared.loads(data) == orjson.loads(data)
        prompt = prompt + generation


def test_unrelated_prompts_are_compared_with_a_bounded_number_of_earlier_ones(monkeypatch):
    """A session of independent calls stays linear: each record is compared with at most
    MAX_CANDIDATES earlier prompts, however many were read."""
    import server.capture.read.shared_prompts as module

    compared = []
    real_extend = module._extend
    monkeypatch.setattr(module, "_extend", lambda text, known: compared.append(1) or real_extend(text, known))
    shared = SharedPrompts()
    rng = random.Random(3)
    for k in range(200):
        prompt = [k + 1000] + [rng.randrange(1000, 150_000) for _ in range(50)]
        shared.loads(orjson.dumps({"prompt_token_ids": prompt, "generation_token_ids": [1]}))
    assert 0 < len(compared) <= 200 * MAX_CANDIDATES
