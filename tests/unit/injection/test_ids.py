"""Token id lists compared as their compact JSON: the same answers as comparing the lists, in C."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from server.injection.chains import prefix_hash
from server.injection.ids import begins_with, id_list_json, is_id_list, json_digest

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
