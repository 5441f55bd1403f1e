"""Token id lists compared as their compact JSON: the same answers as comparing the lists, in C."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.injection.histories import prefix_hash
from server.injection.id_lists import (
    begins_with,
    count_ids,
    id_list_json,
    ids_after,
    is_id_list,
    json_digest,
    looks_like_id_list,
)

ids = st.lists(st.integers(min_value=0, max_value=200_000), max_size=40)


def test_only_lists_of_non_negative_ints_have_an_id_list_json():
    assert id_list_json([3, 0, 151_643]) == b"[3,0,151643]"
    assert id_list_json([]) == b"[]"
    for bad in ([1, True], [1, 2.0], [1, -2], [1, "2"], [1, None], [[1]], [2**70], (1, 2), None, "1,2"):
        assert id_list_json(bad) is None and not is_id_list(bad), bad


@given(ids, ids)
def test_begins_with_is_the_list_prefix_relation(longer, prefix):
    assert begins_with(orjson.dumps(longer), orjson.dumps(prefix)) == (longer[: len(prefix)] == prefix)


@given(ids, ids)
def test_begins_with_holds_for_every_prefix_of_a_list(head, tail):
    assert begins_with(orjson.dumps(head + tail), orjson.dumps(head))


def test_a_longer_number_is_not_a_prefix_match():
    # The negative control for comparing bytes: `[1,2,3` starts `[1,2,34]` too, but 3 is not 34.
    assert orjson.dumps([1, 2, 34]).startswith(b"[1,2,3")
    assert not begins_with(orjson.dumps([1, 2, 34]), orjson.dumps([1, 2, 3]))
    assert begins_with(orjson.dumps([1, 2, 3, 4]), orjson.dumps([1, 2, 3]))


def test_the_digest_is_the_one_records_already_hold():
    # Records' prefix_hash values (16-byte BLAKE2b of the ids' compact JSON) must stay matchable.
    assert json_digest(b"[1,2,3]") == prefix_hash([1, 2, 3]) == "53c65deb7d4e0bfc9931d06cfe60790d"


@given(ids, ids)
def test_ids_after_a_head_are_the_rest_of_the_list(head, tail):
    encoded = orjson.dumps(head + tail)
    assert ids_after(encoded, orjson.dumps(head)) == tail
    assert count_ids(encoded) == len(head + tail)


@pytest.mark.parametrize("bad", [b"[1,01]", b"[1,99999999999999999999999]"])
def test_ids_after_refuses_digits_that_are_not_plain_json_integers(bad):
    # Bytes cut out of an engine's answer are only digits and commas; these are still no token ids.
    with pytest.raises(ValueError):
        ids_after(bad, b"[1]")


def test_looks_like_an_id_list_is_one_pass_over_brackets_digits_and_commas():
    assert looks_like_id_list(b"[1,20,300]") and looks_like_id_list(b"[]")
    for bad in (b"1,2", b"[1,-2]", b"[1,2.0]", b"[1, 2]", b'["1"]', b"[[1]]", b"[1,2"):
        assert not looks_like_id_list(bad), bad
