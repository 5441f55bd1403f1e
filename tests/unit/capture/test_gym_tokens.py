"""Gym's token capture as this server builds it: the items lineage reads, the chat bundle, the configured sink."""

from __future__ import annotations

import asyncio

import pytest

from server.capture.gym.tokens import GymTokenCapture, chat_with_gym_tokens, request_items
from tests.support.captures import chat_response

pytest.importorskip("nemo_gym.token_id_capture", reason="NeMo Gym 0.7.0 is installed by `make venv`")

from nemo_gym.token_id_capture.lineage import FileLineageStore, InMemoryLineageStore  # noqa: E402
from nemo_gym.token_id_capture.store import TokenCaptureStore  # noqa: E402


class NamedSink(TokenCaptureStore):
    """A sink configured by `module:Class` with kwargs, as a framework's would be."""

    def __init__(self, root: str, label: str) -> None:
        super().__init__(root)
        self.label = label


def gym_settings(tmp_path, **block) -> dict:
    return {"token_id_capture": {"enabled": True, "dir": str(tmp_path / "tokens"), **block}}


def test_request_items_are_the_turns_after_the_envelope_and_a_copy():
    body = {"input": [{"role": "user", "content": "hi"}], "instructions": "be brief", "tools": [{"name": "t"}]}
    items = request_items(body)
    assert items[0]["role"] == "_ng_request_envelope" and '"instructions":"be brief"' in items[0]["content"]
    assert items[1:] == body["input"] and items[1] is not body["input"][0]
    assert request_items({"messages": [{"role": "user", "content": "x"}]}) == [{"role": "user", "content": "x"}]
    assert request_items({"input": "a plain string"}) == []  # as Gym: no items to resolve from


def test_chat_bundle_moves_to_the_message():
    chat = chat_response(prompt=(1, 2), generation=(7, 8))
    moved = chat_with_gym_tokens(chat)
    message = moved["choices"][0]["message"]
    assert message["prompt_token_ids"] == [1, 2] and message["generation_token_ids"] == [7, 8]
    assert len(message["generation_log_probs"]) == 2
    assert "prompt_token_ids" not in moved and "token_ids" not in moved["choices"][0]
    assert "logprobs" not in moved["choices"][0]
    assert chat["prompt_token_ids"] == [1, 2]  # the input is not changed
    no_ids = {"choices": [{"message": {"role": "assistant", "content": "x"}}]}
    assert chat_with_gym_tokens(no_ids) is no_ids


def test_a_gym_release_other_than_the_tested_one_is_named_in_a_warning(monkeypatch, caplog):
    from server.capture.gym import tokens as gym_tokens

    assert gym_tokens.check_gym_version() == "0.7.0" and not caplog.records
    monkeypatch.setattr(gym_tokens.importlib.metadata, "version", lambda name: "0.9.1")
    assert gym_tokens.check_gym_version() == "0.9.1"
    assert "NeMo Gym 0.9.1 is installed" in caplog.text and "tested with 0.7.x" in caplog.text


def test_off_unless_gym_enables_it(tmp_path):
    assert GymTokenCapture.from_gym_settings(None) is None
    assert GymTokenCapture.from_gym_settings({"observability_enabled": True}) is None
    assert GymTokenCapture.from_gym_settings({"token_id_capture": {"enabled": False}}) is None


def test_the_file_store_with_its_process_shared_lineage_by_default(tmp_path):
    capture = GymTokenCapture.from_gym_settings(gym_settings(tmp_path), workers=4)
    assert capture is not None
    assert isinstance(capture.sink, TokenCaptureStore) and capture.sink.root == tmp_path / "tokens"
    assert isinstance(capture.lineage, FileLineageStore) and capture.lineage.is_process_shared()
    asyncio.run(capture.close())


def test_model_call_capture_dir_is_the_fallback_directory(tmp_path):
    settings = {"token_id_capture": {"enabled": True}, "model_call_capture_dir": str(tmp_path / "calls")}
    capture = GymTokenCapture.from_gym_settings(settings)
    assert capture is not None and capture.sink.root == tmp_path / "calls"


def test_a_configured_sink_and_lineage_store_are_honoured(tmp_path):
    settings = gym_settings(
        tmp_path,
        sink=f"{__name__}:NamedSink",
        sink_kwargs={"root": str(tmp_path / "framework"), "label": "mine"},
        lineage_store="nemo_gym.token_id_capture.lineage:InMemoryLineageStore",
    )
    capture = GymTokenCapture.from_gym_settings(settings)
    assert capture is not None and isinstance(capture.sink, NamedSink) and capture.sink.label == "mine"
    assert isinstance(capture.lineage, InMemoryLineageStore)
    # Gym's rule: several workers need a lineage resolver every worker shares.
    with pytest.raises(ValueError, match="process-shared lineage"):
        GymTokenCapture.from_gym_settings(settings, workers=2)


@pytest.mark.parametrize(
    "block, message",
    [
        ({"sink": "no-colon", "lineage_store": "x:y"}, "module.path:ClassName"),
        ({"sink": "json:JSONDecoder", "lineage_store": "json:JSONDecoder"}, "does not implement"),
        ({"sink": "nowhere.at.all:Sink", "lineage_store": "x:y"}, "could not build"),
    ],
)
def test_a_bad_configured_sink_is_a_clear_error(tmp_path, block, message):
    with pytest.raises(ValueError, match=message):
        GymTokenCapture.from_gym_settings(gym_settings(tmp_path, **block))


def test_a_custom_sink_without_a_lineage_store_is_refused_as_gym_refuses_it(tmp_path):
    with pytest.raises(ValueError, match="lineage_store"):
        GymTokenCapture.from_gym_settings(gym_settings(tmp_path, sink=f"{__name__}:NamedSink"))
