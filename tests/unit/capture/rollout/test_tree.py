"""A session's rollout with its sub-agent sessions: depth-first order, partial descendants masking their ancestors, cycles."""

from __future__ import annotations

import pytest

from server.capture.rollout import RolloutError, reconstruct_tree
from tests.support.rollouts import (
    linear_session,
)


class _Store:
    def __init__(self, sessions: dict[str, list[dict]], children: dict[str, list[str]]) -> None:
        self.sessions, self.children = sessions, children

    def load(self, session_id: str) -> list[dict]:
        return self.sessions.get(session_id, [])

    def children_of(self, session_id: str) -> list[str]:
        return self.children.get(session_id, [])


class TestTree:
    def _store(self) -> _Store:
        return _Store(
            {
                "root": linear_session(3, session_id="root"),
                "child": linear_session(2, session_id="child", parent="root"),
                "grandchild": linear_session(2, session_id="grandchild", parent="child"),
                "sibling": linear_session(1, session_id="sibling", parent="root"),
            },
            {"root": ["child", "sibling"], "child": ["grandchild"]},
        )

    def test_child_and_grandchild_beside_the_root(self):
        store = self._store()
        tree = reconstruct_tree("root", store.load, store.children_of)
        assert tree["session_id"] == "root" and tree["parent_session_id"] is None
        assert len(tree["record_uuids"]) == 3
        assert [(s["session_id"], s["parent_session_id"]) for s in tree["subagents"]] == [
            ("child", "root"),
            ("grandchild", "child"),
            ("sibling", "root"),
        ]
        assert [len(s["record_uuids"]) for s in tree["subagents"]] == [2, 2, 1]
        assert all("subagents" not in s for s in tree["subagents"])
        assert tree["mask_sample"] is False and not any(s["mask_sample"] for s in tree["subagents"])

    def test_partial_grandchild_masks_its_ancestors_only(self):
        store = self._store()
        store.sessions["grandchild"][1]["prompt_token_ids"][0] = 999
        tree = reconstruct_tree("root", store.load, store.children_of)
        by_id = {s["session_id"]: s for s in tree["subagents"]}
        assert by_id["grandchild"]["mask_sample"] is True
        assert by_id["grandchild"]["partial_reason"].startswith("record 1 of 2:")
        assert by_id["child"]["mask_sample"] is True and by_id["child"]["partial_reason"] is None
        assert by_id["child"]["degraded_reason"] == "subagent session 'grandchild' is partial"
        assert by_id["sibling"]["mask_sample"] is False
        assert tree["mask_sample"] is True and tree["partial_reason"] is None

    def test_unreconstructable_child_is_reported_and_masks(self):
        store = self._store()
        store.sessions["sibling"][0]["is_valid"] = False
        tree = reconstruct_tree("root", store.load, store.children_of)
        sibling = tree["subagents"][-1]
        assert sibling["session_id"] == "sibling" and sibling["parent_session_id"] == "root"
        assert sibling["input"] == [] and sibling["output"] == [] and sibling["mask_sample"] is True
        assert "is_valid is not true" in sibling["partial_reason"]
        assert tree["mask_sample"] is True

    def test_strict_tree_raises_on_child_failure(self):
        store = self._store()
        store.sessions["grandchild"][1]["prompt_token_ids"][0] = 999
        with pytest.raises(RolloutError, match="session 'grandchild': record 1 prompt_token_ids"):
            reconstruct_tree("root", store.load, store.children_of, allow_partial=False)

    def test_root_failure_raises(self):
        store = self._store()
        store.sessions["root"] = []
        with pytest.raises(RolloutError, match="no completions"):
            reconstruct_tree("root", store.load, store.children_of)

    def test_cycle_is_not_followed(self):
        store = self._store()
        store.children["grandchild"] = ["root", "child"]
        tree = reconstruct_tree("root", store.load, store.children_of)
        assert [s["session_id"] for s in tree["subagents"]] == ["child", "grandchild", "sibling"]

    def test_parent_falls_back_to_the_tree(self):
        store = self._store()
        for record in store.sessions["sibling"]:
            record["parent_session_id"] = None
        tree = reconstruct_tree("root", store.load, store.children_of)
        assert tree["subagents"][-1]["parent_session_id"] == "root"
