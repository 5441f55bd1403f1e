"""A rollout id dispatched again, its token file recreated on the freed inode: Gym's builder still sees the new dispatch.

Gym's collector deletes a rollout's token files before each dispatch; the next dispatch's first call
creates the file again, and ext4 hands it the freed inode. The test forces that inode reuse on any
file system (it keeps the old inode alive through a second name and moves the new file's bytes into
it), then drives both dispatches through this server's Gym capture steps and reads the store with
Gym's own builder. Gym's plain `FileLineageStore` in the same place is the negative control.
"""

from __future__ import annotations

import asyncio
import json
import os
import types
import uuid
from pathlib import Path

import pytest

from server.capture.gym.tokens import GymTokenCapture

pytest.importorskip("nemo_gym.token_id_capture", reason="NeMo Gym 0.7.0 is installed by `make venv`")

from nemo_gym.token_id_capture import sink as gym_sink  # noqa: E402
from nemo_gym.token_id_capture.consumer import trajectories_for_rollout  # noqa: E402
from nemo_gym.token_id_capture.lineage import FileLineageStore  # noqa: E402
from nemo_gym.token_id_capture.store import TokenCaptureStore  # noqa: E402

ROLLOUT = "7-0"


def served(text: str, prompt: list[int], generation: list[int]) -> dict:
    """A Responses answer as this server serves it on Gym's training path: the triple on its item."""
    return {
        "id": "resp_" + "0" * 24,
        "object": "response",
        "model": "m",
        "output": [
            {
                "type": "message",
                "id": "msg_" + "0" * 24,
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": [-0.5] * len(generation),
            }
        ],
    }


async def call(capture: GymTokenCapture, items: list[dict], answer: dict) -> None:
    """One model call as the server makes it: begin (parent resolved, intent recorded), answer, commit."""
    token = await capture.begin(ROLLOUT, uuid.uuid4().hex, items)
    try:
        await capture.commit(answer, items)
    finally:
        capture.end(token)


async def dispatch(capture: GymTokenCapture, prompt: str, tokens: int, after_first_call=None) -> list[int]:
    """Two calls of one rollout: the user's prompt, then the answer and a follow-up. Returns the last
    call's whole sequence (prompt and generation)."""
    user = [{"role": "user", "content": prompt}]
    first = served("answer to " + prompt, list(range(10, 10 + tokens)), [1, 2, 3])
    await call(capture, user, first)
    if after_first_call is not None:
        after_first_call()
    assistant = [{k: v for k, v in first["output"][0].items() if "token" not in k}]
    follow_up = user + assistant + [{"role": "user", "content": "and then?"}]
    second_prompt = list(range(10, 10 + tokens)) + [1, 2, 3] + [90, 91]
    await call(capture, follow_up, served("then this", second_prompt, [4, 5]))
    return second_prompt + [4, 5]


def gym_sees(tokens_dir: Path) -> dict:
    built = trajectories_for_rollout(ROLLOUT, [tokens_dir])
    assert built is not None
    return built


def last_sequence(built: dict) -> list[int]:
    """The whole sequence of the last generated item of Gym's rebuilt rollout."""
    last = built["rebuilt_response"]["output"][-1]
    return list(last["prompt_token_ids"]) + list(last["generation_token_ids"])


@pytest.fixture
def fixed_clock(monkeypatch):
    """Gym stamps each entry with `time.time()`; a fixed clock makes same-shaped entries the same size,
    so the old read offset lands where the negative control needs it, every run."""
    monkeypatch.setattr(gym_sink, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.25))


def run_two_dispatches(tmp_path: Path, *, second_prompt: str, second_tokens: int, lineage=None) -> dict:
    tokens_dir = tmp_path / "tokens"
    capture = GymTokenCapture.from_gym_settings({"token_id_capture": {"enabled": True, "dir": str(tokens_dir)}})
    assert capture is not None
    if lineage is not None:
        capture.lineage = lineage(tokens_dir)
    path = capture.sink.path_for(ROLLOUT)
    keep = tmp_path / "old-inode"

    async def both() -> dict:
        await dispatch(capture, "what is the weather in Paris?", 6)
        first = gym_sees(tokens_dir)
        assert not first.get("mask_sample"), first
        old_inode = path.stat().st_ino
        os.link(path, keep)  # holds the inode, so that it can be handed to the new file below
        # Gym's collector, before the next dispatch of the same rollout ids (consumer.py's
        # clear_token_captures_for_rollouts, whose module needs Gym's server dependencies).
        TokenCaptureStore(tokens_dir).delete(ROLLOUT)
        assert not path.exists()

        def reuse_the_inode() -> None:
            # What ext4 does by itself: the new file's bytes on the old inode.
            keep.write_bytes(path.read_bytes())
            os.replace(keep, path)
            assert path.stat().st_ino == old_inode

        expected = await dispatch(capture, second_prompt, second_tokens, after_first_call=reuse_the_inode)
        built = gym_sees(tokens_dir)
        built["expected"] = expected
        return built

    try:
        return asyncio.run(both())
    finally:
        asyncio.run(capture.close())


CASES = {
    "prompts-differ": ("what is the weather in Lisbon, today?", 9),
    "prompts-repeat": ("what is the weather in Paris?", 6),
}


def parent_links(tokens_dir: Path) -> list[tuple[str, str | None]]:
    """Each stored entry's call id and the parent call id lineage stamped on it, in file order."""
    path = TokenCaptureStore(tokens_dir).path_for(ROLLOUT)
    entries = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [(entry["model_call_id"], entry["parent_call_id"]) for entry in entries]


@pytest.mark.parametrize("case", CASES)
def test_a_new_dispatch_on_a_reused_inode_is_read_as_the_new_dispatch(tmp_path, fixed_clock, case):
    prompt, tokens = CASES[case]
    built = run_two_dispatches(tmp_path, second_prompt=prompt, second_tokens=tokens)
    assert not built.get("mask_sample"), built
    metrics = built["metrics"]
    assert metrics["chains"] == 1 and metrics["unresolved_parent_calls"] == 0 and metrics["parent_link_failures"] == {}
    assert last_sequence(built) == built["expected"]
    (first, no_parent), (_, parent) = parent_links(tmp_path / "tokens")
    assert no_parent is None and parent == first  # the second call continues this dispatch's first


@pytest.mark.parametrize("case", CASES)
def test_gyms_own_file_lineage_store_misreads_it_the_negative_control(tmp_path, fixed_clock, case):
    prompt, tokens = CASES[case]
    built = run_two_dispatches(tmp_path, second_prompt=prompt, second_tokens=tokens, lineage=FileLineageStore)
    (first, _), (_, parent) = parent_links(tmp_path / "tokens")
    if case == "prompts-differ":
        assert built.get("mask_sample"), built  # the new dispatch's continuation is left unresolved
    else:
        # Resolved against the cleared dispatch's call: a parent link Gym's builder finds missing
        # (and recovers here only because the tokens repeat exactly).
        assert parent is not None and parent != first
        assert built["metrics"]["parent_link_failures"], built["metrics"]


def test_a_rollout_that_only_grows_keeps_its_read_offset(tmp_path):
    """The check costs no rereading: within one dispatch each resolve reads only what was appended."""
    tokens_dir = tmp_path / "tokens"
    capture = GymTokenCapture.from_gym_settings({"token_id_capture": {"enabled": True, "dir": str(tokens_dir)}})
    assert capture is not None
    reads: list[object] = []
    fetch = type(capture.lineage)._fetch_new_entries

    def counting(self, rollout_id, cursor):
        items, new_cursor = fetch(self, rollout_id, cursor)
        reads.append((cursor is None, len(items)))
        return items, new_cursor

    type(capture.lineage)._fetch_new_entries = counting
    try:
        asyncio.run(dispatch(capture, "hello", 4))
        asyncio.run(dispatch(capture, "hello", 4))  # the same rollout continued, not cleared
    finally:
        type(capture.lineage)._fetch_new_entries = fetch
        asyncio.run(capture.close())
    # Only second calls resolve. The first reads the file from its start (one entry); the next goes on
    # from where that stopped, reading just the two entries appended since, not the file again.
    assert reads == [(True, 1), (False, 2)], reads


def test_gyms_file_lineage_store_named_in_the_config_is_the_safe_one(tmp_path):
    settings = {
        "token_id_capture": {
            "enabled": True,
            "dir": str(tmp_path / "tokens"),
            "lineage_store": "nemo_gym.token_id_capture.lineage:FileLineageStore",
            "lineage_store_kwargs": {"root": str(tmp_path / "tokens")},
        }
    }
    capture = GymTokenCapture.from_gym_settings(settings, workers=2)
    assert capture is not None and isinstance(capture.lineage, FileLineageStore)
    assert type(capture.lineage) is not FileLineageStore and capture.lineage.is_process_shared()
    asyncio.run(capture.close())
