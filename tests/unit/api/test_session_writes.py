"""The session write rule's parts: which sessions a call writes into, owner files, and a hot path that reads no file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from middleware.correlation import Correlation
from server.api.session_writes import admit_writes, sessions_written
from server.capture.catalog.session_owners import OWNER_FILE, Claim, SessionOwners
from server.capture.read.record_files import session_dir_name
from server.errors import OpenAIError
from server.request_owner import Owners, owner_tag


def test_a_call_writes_its_session_its_parent_the_sessions_before_each_slash_and_its_rollout():
    assert sessions_written(Correlation("s1")) == ["s1"]
    assert sessions_written(Correlation("c", parent_session_id="p")) == ["c", "p"]
    # Claude Code's sub-agent: the parent is the session before the slash, named once.
    assert sessions_written(Correlation("S/agent-1", parent_session_id="S")) == ["S/agent-1", "S"]
    assert sessions_written(Correlation("a/b/c")) == ["a/b/c", "a/b", "a"]
    # Gym's training path with an agent id: the rollout id is the parent too.
    assert sessions_written(Correlation("R/x", parent_session_id="R", rollout_id="R")) == ["R/x", "R"]
    # A part that is no valid id (only dots, empty) names no session.
    assert sessions_written(Correlation("../x")) == ["../x"]
    assert sessions_written(Correlation("/x")) == ["/x"]
    assert sessions_written(Correlation()) == []


def folder(root: Path, session_id: str) -> Path:
    return root / session_dir_name(session_id)


def test_an_unowned_session_with_records_is_never_claimed(tmp_path):
    owners = SessionOwners(tmp_path)
    old = folder(tmp_path, "old")
    old.mkdir()
    (old / "rec.json").write_text("{}")
    assert owners.standing(old.name) == ""
    assert owners.claim(old.name, "tag-a") is Claim.REFUSED
    assert not (old / OWNER_FILE).exists()
    assert owners.owner(old.name) is None  # readers see no owner


def test_a_new_session_goes_to_exactly_one_of_two_keys_and_a_release_removes_it(tmp_path):
    first, second = SessionOwners(tmp_path), SessionOwners(tmp_path)  # two workers
    name = session_dir_name("new")
    assert first.standing(name) is None
    assert first.claim(name, "tag-a") is Claim.MADE
    assert second.claim(name, "tag-b") is Claim.REFUSED
    assert second.claim(name, "tag-a") is Claim.HELD
    assert sorted(os.listdir(tmp_path / name)) == [OWNER_FILE]  # no draft left behind
    first.release(name, "tag-a")
    assert not (tmp_path / name).exists()
    assert SessionOwners(tmp_path).standing(name) is None


class _Store:
    """The store methods the rule uses, over a SessionOwners; counts every look that may touch the disk."""

    def __init__(self, root: Path) -> None:
        self.owners = SessionOwners(root)
        self.disk_looks = 0

    def known_standing(self, session_id: str) -> str | None:
        return self.owners.known_standing(session_dir_name(session_id))

    def session_standing(self, session_id: str) -> str | None:
        if self.known_standing(session_id) is None:
            self.disk_looks += 1
        return self.owners.standing(session_dir_name(session_id))

    def claim_session(self, session_id: str, tag: str) -> Claim:
        self.disk_looks += 1
        return self.owners.claim(session_dir_name(session_id), tag)

    def release_session(self, session_id: str, tag: str) -> None:
        self.owners.release(session_dir_name(session_id), tag)


def _scope(key: str) -> dict:
    return {"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]}


def _admit(store: _Store, corr: Correlation, key: str = "key-a", admin: tuple[str, ...] = ()) -> None:
    owners = Owners(["key-a", "key-b", *admin], list(admin))
    asyncio.run(admit_writes(owners, store, corr, _scope(key)))  # type: ignore[arg-type]


def test_an_already_claimed_session_costs_no_file_access(tmp_path):
    store = _Store(tmp_path)
    corr = Correlation("S/agent-1", parent_session_id="S")
    _admit(store, corr)  # first call: looks and claims both
    assert store.disk_looks > 0
    store.disk_looks = 0
    for _ in range(3):
        _admit(store, corr)
    assert store.disk_looks == 0
    # Negative control: a process that has not seen the claims yet (another worker) reads the files once.
    other_worker = _Store(tmp_path)
    _admit(other_worker, corr)
    assert other_worker.disk_looks > 0
    assert other_worker.known_standing("S") == owner_tag(b"key-a")


def test_a_refused_call_claims_none_of_the_sessions_it_names(tmp_path):
    store = _Store(tmp_path)
    _admit(store, Correlation("a-parent"), key="key-a")
    with pytest.raises(OpenAIError) as refused:
        _admit(store, Correlation("b-child", parent_session_id="a-parent"), key="key-b")
    assert refused.value.status == 403
    assert not folder(tmp_path, "b-child").exists()


def test_a_lost_race_undoes_the_calls_other_claims(tmp_path, monkeypatch):
    store = _Store(tmp_path)
    real_claim = store.claim_session

    def racing(session_id: str, tag: str) -> Claim:
        if session_id == "p":  # another key claims the parent between the look and the claim
            SessionOwners(tmp_path).claim(session_dir_name("p"), owner_tag(b"key-b"))
        return real_claim(session_id, tag)

    monkeypatch.setattr(store, "claim_session", racing)
    with pytest.raises(OpenAIError):
        _admit(store, Correlation("c", parent_session_id="p"))
    assert not folder(tmp_path, "c").exists()


def test_only_an_admin_writes_into_unowned_and_uncorrelated_sessions_and_never_claims_them(tmp_path):
    store = _Store(tmp_path)
    old = folder(tmp_path, "old")
    old.mkdir()
    (old / "rec.json").write_text("{}")
    for session_id in ("old", "uncorrelated-req_1"):
        with pytest.raises(OpenAIError):
            _admit(store, Correlation(session_id))
        _admit(store, Correlation(session_id), key="admin-key", admin=("admin-key",))
    assert not (old / OWNER_FILE).exists() and not folder(tmp_path, "uncorrelated-req_1").exists()
