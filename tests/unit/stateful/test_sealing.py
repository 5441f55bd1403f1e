"""Sealed reasoning opens only when this server's key sealed it, unaltered."""

from __future__ import annotations

import base64
import os
import stat

import pytest

from server.stateful.sealing import KEY_FILE, ReasoningSeal, SealError, load_key


def test_round_trip_and_fresh_nonce(tmp_path):
    seal = ReasoningSeal(load_key(None, tmp_path))
    one, two = seal.seal("I think, therefore"), seal.seal("I think, therefore")
    assert one != two  # a fresh nonce each time: equal texts are not recognisable
    assert seal.open(one, "input[0].encrypted_content") == "I think, therefore"
    assert "therefore" not in one


def test_key_file_is_private_and_shared(tmp_path):
    key = load_key(None, tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / KEY_FILE).st_mode) == 0o600
    assert load_key(None, tmp_path) == key  # a second worker reads the same key


def test_key_from_setting_wins(tmp_path):
    key = os.urandom(32)
    assert load_key(base64.urlsafe_b64encode(key).decode(), tmp_path) == key
    assert not (tmp_path / KEY_FILE).exists()
    with pytest.raises(ValueError):
        load_key(base64.urlsafe_b64encode(b"short").decode(), tmp_path)


def test_tampered_and_foreign_tokens_are_refused(tmp_path):
    seal = ReasoningSeal(load_key(None, tmp_path / "a"))
    other = ReasoningSeal(load_key(None, tmp_path / "b"))
    token = seal.seal("secret plan")
    raw = bytearray(base64.urlsafe_b64decode(token[5:]))
    raw[-1] ^= 1
    tampered = token[:5] + base64.urlsafe_b64encode(bytes(raw)).decode()
    for bad in (tampered, other.seal("secret plan"), "gAAAAA-not-ours", token[:12], 42):
        with pytest.raises(SealError) as caught:
            seal.open(bad, "input[3].encrypted_content")
        assert caught.value.status == 400 and caught.value.param == "input[3].encrypted_content"
