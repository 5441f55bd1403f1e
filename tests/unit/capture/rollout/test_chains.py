"""Chains: a broken session split into whole token-contiguous chains, each break named in plain words."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.capture.read.timeline import build_timeline
from server.capture.rollout import reconstruct_session
from server.capture.rollout.chains import chains_tree, session_chains
from tests.support.scripted_sessions import OPERATIONS, scripted

BREAKING = {
    "rewrite": "rewrote_history",
    "tool_call_as_text": "tool_call_as_text",
    "history_twice": "history_sent_twice",
    "compact": "compacted",
    "drop": "dropped_history",
}


def check_chains(records: list[dict], body: dict) -> None:
    """What every chains answer must hold, whatever the session."""
    completed = {r["uuid"] for r in records if r.get("is_valid") is True}
    in_chains = [uuid for chain in body["chains"] for uuid in chain["record_uuids"]]
    assert sorted(in_chains) == sorted(completed), "every completed call in exactly one chain"
    by_uuid = {r["uuid"]: r for r in records}
    for chain in body["chains"]:
        steps = [by_uuid[uuid] for uuid in chain["record_uuids"]]
        for before, after in zip(steps, steps[1:]):
            carried = before["prompt_token_ids"] + before["generation_token_ids"]
            assert after["prompt_token_ids"][: len(carried)] == carried, "each chain token-contiguous"
        last = steps[-1]
        assert chain["token_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
        generated = [t for t, m in zip(chain["token_ids"], chain["generation_mask"]) if m]
        assert generated == [t for s in steps for t in s["generation_token_ids"]]
        masked_log_probs = [lp for lp, m in zip(chain["log_probs"], chain["generation_mask"]) if m]
        assert masked_log_probs == [lp for s in steps for lp in s["generation_log_probs"]]
        triples = [item for item in chain["output"] if "generation_token_ids" in item]
        assert [t["generation_token_ids"] for t in triples] == [s["generation_token_ids"] for s in steps]
    if completed:
        assert body["trainable_fraction"] == 1.0


@pytest.mark.parametrize("operation", sorted(BREAKING))
def test_each_rewrite_splits_the_session_and_names_its_kind(operation):
    records = scripted("s", ["extend", operation, "extend"])
    body = session_chains("s", records)
    check_chains(records, body)
    assert [chain["record_uuids"] for chain in body["chains"]] == [
        [r["uuid"] for r in records[:2]],
        [r["uuid"] for r in records[2:]],
    ]
    (account,) = body["breaks"]
    assert account["kind"] == BREAKING[operation]
    assert account["index"] == 2 and account["previous_index"] == 1
    assert account["uuid"] == records[2]["uuid"] and account["previous_uuid"] == records[1]["uuid"]
    carried = records[1]["prompt_token_ids"] + records[1]["generation_token_ids"]
    if operation == "history_twice":
        # The tokens carry on (the history is appended again): the messages show the break.
        assert account["position"] is None and records[2]["prompt_token_ids"][: len(carried)] == carried
        return _check_rollout_agrees(records, body, account)
    assert isinstance(account["position"], int)  # the first differing token
    assert records[2]["prompt_token_ids"][: account["position"]] == carried[: account["position"]]
    assert (
        records[2]["prompt_token_ids"][account["position"] : account["position"] + 1]
        != carried[account["position"] : account["position"] + 1]
    )
    _check_rollout_agrees(records, body, account)


def _check_rollout_agrees(records: list[dict], body: dict, account: dict) -> None:
    assert body["chains"][1]["starts_after"] == account
    # The rollout keeps its meaning: the first chain, masked, and its reason names the kind in words.
    rollout = reconstruct_session("s", records)
    assert rollout["record_uuids"] == body["chains"][0]["record_uuids"] == body["rollout"]["record_uuids"]
    assert rollout["mask_sample"] is True
    assert rollout["partial_reason"] == body["rollout"]["partial_reason"]
    assert account["summary"] in rollout["partial_reason"]
    assert rollout["partial_break"]["kind"] == account["kind"]
    assert body["rollout_fraction"] == 0.0


def test_a_whole_session_is_one_chain_equal_to_the_rollout():
    records = scripted("s", ["extend", "extend", "title", "retry"])
    body = session_chains("s", records)
    check_chains(records, body)
    rollout = reconstruct_session("s", records, allow_partial=False)
    main = body["chains"][0]
    assert main["kind"] == "main" and main["starts_after"] is None
    for key in ("model", "tools", "input", "output", "record_uuids"):
        assert main[key] == rollout[key]
    assert {chain["kind"] for chain in body["chains"][1:]} == {"side", "retry"}
    assert body["breaks"] == [] and body["rollout"]["status"] == "whole"
    assert 0 < body["rollout_fraction"] < 1.0  # the side call and the losing attempt are not in the rollout


def test_an_incomplete_record_says_why_it_is_incomplete():
    records = scripted("s", ["extend"])
    records[1].update(is_valid=False, invalid_reason="finish_reason length with no token ids")
    body = session_chains("s", records)
    (account,) = body["breaks"]
    assert account["kind"] == "incomplete_record"
    assert account["invalid_reason"] == "finish_reason length with no token ids"
    assert "finish_reason length" in account["summary"]
    assert body["calls"][1]["relation"] == "incomplete"
    rollout = reconstruct_session("s", records)
    assert "finish_reason length with no token ids" in rollout["partial_reason"]


def test_a_failed_first_record_still_leaves_the_later_calls_trainable():
    records = scripted("s", ["extend", "compact"])
    records[0].update(is_valid=False, invalid_reason="cut off")
    body = session_chains("s", records)
    check_chains(records, body)
    assert body["rollout"]["status"] == "failed" and body["rollout"]["record_uuids"] == []
    assert body["rollout_fraction"] == 0.0


def test_sub_agents_are_chained_too():
    records = {"root": scripted("root", ["compact"]), "kid": scripted("kid", ["extend"], parent="root")}
    tree = chains_tree("root", lambda sid: records[sid], lambda sid: ["kid"] if sid == "root" else [])
    assert len(tree["chains"]) == 2
    (kid,) = tree["subagents"]
    assert kid["session_id"] == "kid" and kid["parent_session_id"] == "root" and len(kid["chains"]) == 1


operations = st.lists(st.sampled_from(OPERATIONS), max_size=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, data=st.data())
def test_any_script_is_covered_by_contiguous_chains_that_agree_with_the_rollout_and_the_strip(ops, data):
    records = scripted("p", ops)
    order = data.draw(st.permutations(records), label="order")
    body = session_chains("p", order)
    check_chains(records, body)

    # The rollout is the first chain, decided by the same steps.
    try:
        rollout = reconstruct_session("p", order)
    except Exception as exc:  # noqa: BLE001 - the failure itself is what the chains must report
        assert body["rollout"]["status"] == "failed" and body["rollout"]["partial_reason"] == str(exc)
    else:
        assert body["rollout"]["partial_reason"] == rollout["partial_reason"]
        assert body["rollout"]["record_uuids"] == rollout["record_uuids"]
        assert body["chains"][0]["record_uuids"] == rollout["record_uuids"]
        assert body["chains"][0]["output"] == rollout["output"]
        if rollout["partial_reason"] is None:
            assert not any(chain["kind"] == "continuation" for chain in body["chains"])

    # The viewer's strip says what the chains decided, call by call.
    timeline = build_timeline("p", records)
    strip = {call["uuid"]: call["contiguity"] for call in timeline["calls"]}
    for decision in body["calls"]:
        cell = strip[decision["uuid"]]
        if decision["relation"] in ("breaks", "incomplete", "unusable"):
            assert cell["kind"] == "breaks" and cell["break_kind"] == decision["break"]["kind"]
        else:
            assert cell["kind"] != "breaks"
    if any(call["contiguity"]["kind"] == "breaks" for call in timeline["calls"][1:]):
        assert timeline["rollout"]["status"] != "whole"
    assert timeline["trainable_fraction"] == body["trainable_fraction"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts=st.lists(st.lists(st.sampled_from(OPERATIONS), max_size=5), min_size=1, max_size=4),
    parents=st.data(),
)
def test_a_tree_of_sessions_keeps_every_sessions_calls_in_its_own_chains(scripts, parents):
    ids = [f"t{n}" for n in range(len(scripts))]
    parent_of = {ids[n]: ids[parents.draw(st.integers(0, n - 1), label="parent")] for n in range(1, len(ids))}
    records = {sid: scripted(sid, ops, parent=parent_of.get(sid)) for sid, ops in zip(ids, scripts)}
    tree = chains_tree(
        "t0", lambda sid: records[sid], lambda sid: [child for child, parent in parent_of.items() if parent == sid]
    )
    bodies = [tree, *tree["subagents"]]
    assert sorted(body["session_id"] for body in bodies) == sorted(ids)
    for body in bodies:
        check_chains(records[body["session_id"]], body)
        assert body["parent_session_id"] == parent_of.get(body["session_id"])
