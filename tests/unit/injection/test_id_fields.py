"""Transports: where the ids go for vLLM, SGLang and NeMo-RL, and what counts as the engine's proof."""

from __future__ import annotations

import orjson
import pytest

from server.injection.id_fields import ENGINES, id_field_for


def test_vllm_merges_into_the_callers_kv_transfer_params():
    t = id_field_for("vllm")
    body = {"messages": [], "kv_transfer_params": {"do_remote_prefill": True}}
    sent = t.attach(body, [1, 2], [3])
    assert sent == [1, 2, 3]
    assert body["kv_transfer_params"] == {"do_remote_prefill": True, "prompt_token_ids": [1, 2, 3]}


def test_vllm_does_not_touch_the_callers_dict():
    t = id_field_for("vllm")
    theirs = {"x": 1}
    body = {"kv_transfer_params": theirs}
    t.attach(body, [1], [2])
    assert theirs == {"x": 1}


def test_vllm_field_is_configurable():
    t = id_field_for("vllm", "prompt_token_ids")
    body: dict = {}
    t.attach(body, [1], [2])
    assert body == {"prompt_token_ids": [1, 2]}


def test_sglang_uses_input_ids():
    body: dict = {}
    id_field_for("sglang").attach(body, [1], [2])
    assert body == {"input_ids": [1, 2]}


def test_nemo_rl_sends_the_history_only_and_accepts_a_spliced_echo():
    t = id_field_for("nemo_rl")
    body: dict = {}
    sent = t.attach(body, [1, 2, 9], [20, 21])
    assert body == {"required_prefix_token_ids": [1, 2, 9]} and sent == [1, 2, 9]
    sent_json = orjson.dumps(sent)
    assert t.echo_ok(sent_json, [1, 2, 9, 20, 21])
    assert not t.echo_ok(sent_json, [1, 3, 9, 20, 21])
    assert not t.echo_ok(sent_json, [1, 2, 9])  # nothing spliced after the history
    assert not t.echo_ok(sent_json, [1, 2, 90, 21])  # the last history id's digits go on: a different id


def test_full_prompt_transports_need_an_exact_echo():
    t = id_field_for("vllm")
    assert t.echo_ok(b"[1,2,3]", [1, 2, 3])
    assert not t.echo_ok(b"[1,2,3]", [1, 2, 3, 4])
    assert not t.echo_ok(b"[1,2,3]", [1, 2, 30])
    assert not t.echo_ok(b"[1,2,3]", None)
    assert not t.echo_ok(b"[1,2,3]", [1, 2, 3.0])  # the engine's ids are ints, or it did not echo ids
    assert not t.echo_ok(b"[1,1]", [True, 1])


def test_unknown_transport_and_empty_field_are_rejected():
    with pytest.raises(ValueError, match="injection_transport"):
        id_field_for("grpc")
    with pytest.raises(ValueError, match="injection_vllm_field"):
        id_field_for("vllm", "")


@pytest.mark.parametrize(
    "transport",
    [id_field_for("vllm", "prompt_token_ids"), id_field_for("vllm", "a.b.c")]
    + [id_field_for(engine) for engine in ENGINES],
)
@pytest.mark.parametrize("request_body", [{"model": "m", "messages": [{"role": "user", "content": "hé}"}]}, {}])
def test_splicing_the_ids_into_the_payload_is_serialising_the_attached_body(transport, request_body):
    body = dict(request_body)
    sent = transport.attach(body, [1, 2, 3], [4, 5])
    spliced = transport.splice(orjson.dumps(request_body), orjson.dumps(sent))
    assert orjson.loads(spliced) == body
    assert orjson.loads(transport.splice(b'{ "model" : "m" }\n', orjson.dumps(sent))) == {
        "model": "m",
        **{k: body[k] for k in body if k not in request_body},
    }
