"""Chains: the environment-suffix cut, longest-prefix matching, staleness, the cache, rebuilding from records."""

from __future__ import annotations

import orjson
import pytest

from server.injection.histories import (
    HistoryCache,
    NoEndOfTurn,
    TokenHistory,
    end_of_turn,
    env_suffix,
    extends_history,
    histories_from_records,
    history_hash,
    longest_history_match,
    longest_match,
    prefix_hash,
)


def rendered(ids: list[int]) -> tuple[bytes, int]:
    """A render's ids as the chains take them: compact JSON, and how many."""
    return orjson.dumps(ids), len(ids)


def chain(prefix: list[int], cid: str = "c", n_messages: int = 2, from_records: bool = False) -> TokenHistory:
    return TokenHistory(
        id=cid,
        accumulated=[1, 2, 3, 4, 5, 9],
        last_generation=[4, 5, 9],
        eot=9,
        n_messages=n_messages,
        prefix_len=len(prefix),
        prefix_hash=prefix_hash(prefix),
        prefix_json=None if from_records else orjson.dumps(list(prefix)),
    )


def test_env_suffix_skips_the_end_of_turn_a_natural_stop_already_holds():
    assert env_suffix([40, 41, 9, 20, 21], [4, 5, 9], 9) == [20, 21]


def test_env_suffix_keeps_the_end_of_turn_when_the_generation_lacks_it():
    assert env_suffix([40, 9, 20, 21], [4, 5], 9) == [9, 20, 21]


def test_env_suffix_cuts_at_the_first_end_of_turn_only():
    assert env_suffix([40, 9, 20, 9, 21], [9], 9) == [20, 9, 21]


def test_env_suffix_without_end_of_turn_raises():
    with pytest.raises(NoEndOfTurn):
        env_suffix([40, 41], [4, 9], 9)


def test_end_of_turn_only_after_a_natural_stop():
    assert end_of_turn([4, 5, 9], "stop") == 9
    assert end_of_turn([4, 5, 9], "tool_calls") == 9
    assert end_of_turn([4, 5], "length") is None
    assert end_of_turn([], "stop") is None


def test_longest_match_prefers_the_longest_prefix_and_needs_a_strict_one():
    short, long_ = chain([1, 2], "short"), chain([1, 2, 3, 4], "long")
    assert longest_match([short, long_], *rendered([1, 2, 3, 4, 5])).id == "long"
    assert longest_match([short, long_], *rendered([1, 2, 3, 7])).id == "short"
    assert longest_match([long_], *rendered([1, 2, 3, 4])) is None  # equal is not an extension
    assert longest_match([short], *rendered([7, 1, 2])) is None


def test_a_chain_rebuilt_from_records_matches_by_hash_and_learns_its_prefix():
    rebuilt = chain([1, 2, 3], from_records=True)
    assert not rebuilt.prefix_of(*rendered([1, 2, 4, 5]))
    assert rebuilt.prefix_json is None
    assert rebuilt.prefix_of(*rendered([1, 2, 3, 5]))
    assert rebuilt.prefix_json == b"[1,2,3]"


def test_continues_only_with_environment_turns_after_the_last_reply():
    c = chain([1], n_messages=3)  # system, user, assistant
    base = [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]
    assert c.continues(base + [{"role": "tool"}, {"role": "user"}])
    assert not c.continues(base)  # nothing new
    assert not c.continues(base + [{"role": "tool"}, {"role": "assistant"}, {"role": "tool"}])  # moved on: stale
    assert not c.continues([{"role": "system"}, {"role": "user"}, {"role": "user"}, {"role": "tool"}])


def test_cache_evicts_least_recently_used_and_expires_idle_sessions():
    now = [0.0]
    cache = HistoryCache(max_sessions=2, ttl_s=10, clock=lambda: now[0])
    cache.put("a", [chain([1], "a")])
    cache.put("b", [chain([1], "b")])
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", [chain([1], "c")])
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    now[0] = 11
    assert cache.get("a") is None


def test_cache_caps_chains_per_session():
    cache = HistoryCache(max_chains_per_session=2)
    for i in range(4):
        cache.add("s", chain([1], f"c{i}"))
    assert [c.id for c in cache.get("s")] == ["c2", "c3"]


def record(chain_id: str, at: str, prompt: list[int], gen: list[int], **over) -> dict:
    base = {
        "uuid": at,
        "captured_at": at,
        "is_valid": True,
        "status": "completed",
        "messages": [{"role": "user"}, {"role": "assistant"}],
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "injection": {"chain": chain_id, "prefix_len": 2, "prefix_hash": prefix_hash([1, 2]), "eot_token_id": 9},
    }
    base.update(over)
    return base


def test_chains_from_records_takes_each_chains_newest_valid_head():
    records = [
        record("main", "2026-01-01T00:00:01", [1, 2], [4, 9]),
        record("main", "2026-01-01T00:00:03", [1, 2, 4, 9, 6], [7, 9]),
        record("main", "2026-01-01T00:00:04", [0], [0], is_valid=False),
        record("side", "2026-01-01T00:00:02", [1, 2], [8, 9]),
        {"uuid": "plain", "captured_at": "2026", "is_valid": True},  # not an injection record
    ]
    chains = {c.id: c for c in histories_from_records(records)}
    assert set(chains) == {"main", "side"}
    assert chains["main"].accumulated == [1, 2, 4, 9, 6, 7, 9]
    assert chains["main"].last_generation == [7, 9] and chains["main"].eot == 9 and chains["main"].n_messages == 2
    assert chains["main"].prefix_json is None and chains["main"].prefix_of(*rendered([1, 2, 3]))


def test_a_bridged_head_is_rebuilt_by_its_history_digest_and_never_matched_by_a_render():
    user = {"role": "user", "content": "go"}
    bridged = {"chain": "b", "prefix_len": None, "prefix_hash": None, "eot_token_id": 9}
    bridged["history_hash"] = history_hash([user], None, {})
    records = [
        record("b", "2026-01-01T00:00:01", [1, 2], [4, 9], injection=bridged),
        record("x", "2026-01-01T00:00:02", [1], [9], injection={**bridged, "chain": "x", "history_hash": None}),
    ]
    (rebuilt,) = histories_from_records(records)  # a head with neither a prefix nor a history digest is skipped
    assert rebuilt.id == "b" and rebuilt.prefix_len == 0 and not rebuilt.prefix_of(*rendered([1, 2, 3]))
    assert longest_match([rebuilt], *rendered([1, 2, 3])) is None
    goes_on = [user, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "out"}]
    assert extends_history(rebuilt, goes_on, None, {})
    assert longest_history_match([rebuilt], goes_on, None, {}) is rebuilt


@pytest.mark.parametrize(
    "messages, tools, template",
    [
        ([{"role": "user", "content": "went"}, {"role": "assistant"}, {"role": "tool"}], None, {}),  # edited
        ([{"role": "user", "content": "go"}, {"role": "assistant"}, {"role": "tool"}], [{"type": "function"}], {}),
        ([{"role": "user", "content": "go"}, {"role": "assistant"}, {"role": "tool"}], None, {"documents": []}),
        ([{"role": "user", "content": "go"}, {"role": "assistant"}], None, {}),  # nothing new
        ([{"role": "user", "content": "go"}, {"role": "tool"}, {"role": "assistant"}], None, {}),  # moved on
    ],
)
def test_a_history_match_needs_the_same_request_then_environment_turns(messages, tools, template):
    head = chain([1, 2])
    head.history_hash = history_hash([{"role": "user", "content": "go"}], None, {})
    control = [{"role": "user", "content": "go"}, {"role": "assistant"}, {"role": "tool"}]
    assert extends_history(head, control, None, {})
    assert not extends_history(head, messages, tools, template)
