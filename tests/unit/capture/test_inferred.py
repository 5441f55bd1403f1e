"""The conversation map behind inferred sessions: who continues what, per key, bounded, ties broken in order."""

from __future__ import annotations

import pytest

from server.capture.catalog.inferred import ConversationMap, digest_answer, digest_prompt, new_session_id
from server.capture.store import CaptureStore
from server.ids import valid_rollout_id
from tests.support.captures import captured_call, submit_all

SYSTEM = {"role": "system", "content": "Be brief."}
TASK = {"role": "user", "content": "Count files."}
ANSWER = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "thinking it over",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls", "n": 1}'}}
    ],
}
# As a client sends the answer back: reasoning dropped, arguments re-serialised, the id renumbered.
ANSWER_SENT_BACK = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "toolu_9", "type": "function", "function": {"name": "bash", "arguments": '{"n":1,"cmd":"ls"}'}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "toolu_9", "content": "3 files"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def answered(conversations: ConversationMap, owner: str, messages: list, answer: dict, session_id: str) -> None:
    conversations.register(owner, digest_answer(digest_prompt(messages), answer), session_id)


def test_a_call_that_sends_an_answer_back_continues_its_session():
    conversations = ConversationMap()
    answered(conversations, "", [SYSTEM, TASK], ANSWER, "s1")
    claim = conversations.claim("", digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT]))
    assert claim is not None and claim.session_id == "s1"
    # Claimed: the same continuation again finds nothing (each answer is continued by one call).
    assert conversations.claim("", digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT])) is None
    assert len(conversations) == 0


def test_a_different_answer_or_history_continues_nothing():
    conversations = ConversationMap()
    answered(conversations, "", [SYSTEM, TASK], ANSWER, "s1")
    other = {"role": "assistant", "content": "I will not."}
    assert conversations.claim("", digest_prompt([SYSTEM, TASK, other, RESULT])) is None
    assert conversations.claim("", digest_prompt([TASK, ANSWER_SENT_BACK, RESULT])) is None  # no system prompt
    assert conversations.claim("", digest_prompt([SYSTEM, TASK])) is None  # a first call continues nothing


def test_identical_conversations_go_to_the_earliest_open_session_each_once():
    """A GRPO group: the same first call answered alike in every session; each continuation takes its own."""
    conversations = ConversationMap()
    group = [f"g{k}" for k in range(16)]
    for session_id in group:
        answered(conversations, "", [SYSTEM, TASK], ANSWER, session_id)
    joined = [conversations.claim("", digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT])) for _ in group]
    assert [claim.session_id for claim in joined if claim is not None] == group
    assert conversations.claim("", digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT])) is None


def test_a_key_never_joins_another_keys_conversation():
    conversations = ConversationMap()
    answered(conversations, "tag-a", [SYSTEM, TASK], ANSWER, "s1")
    assert conversations.claim("tag-b", digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT])) is None
    assert conversations.claim("tag-a", digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT])) is not None


def test_the_longest_registered_prefix_wins():
    conversations = ConversationMap()
    answered(conversations, "", [SYSTEM, TASK], ANSWER, "short")
    later = [SYSTEM, TASK, ANSWER_SENT_BACK, RESULT]
    second = {"role": "assistant", "content": "Three."}
    answered(conversations, "", later, second, "long")
    claim = conversations.claim("", digest_prompt([*later, second, {"role": "user", "content": "thanks"}]))
    assert claim is not None and claim.session_id == "long"


def test_a_call_that_did_not_complete_gives_its_session_back_first_in_line():
    conversations = ConversationMap()
    answered(conversations, "", [SYSTEM, TASK], ANSWER, "first")
    answered(conversations, "", [SYSTEM, TASK], ANSWER, "second")
    prompt = digest_prompt([SYSTEM, TASK, ANSWER_SENT_BACK, RESULT])
    claim = conversations.claim("", prompt)
    assert claim is not None and claim.session_id == "first"
    conversations.give_back(claim)
    again = conversations.claim("", prompt)
    assert again is not None and again.session_id == "first"


def test_bounded_by_count_and_by_age():
    clock = Clock()
    conversations = ConversationMap(max_sessions=3, ttl_s=60.0, clock=clock)
    for k in range(5):
        answered(conversations, "", [SYSTEM, {"role": "user", "content": f"task {k}"}], ANSWER, f"s{k}")
    assert len(conversations) == 3
    oldest = digest_prompt([SYSTEM, {"role": "user", "content": "task 0"}, ANSWER_SENT_BACK, RESULT])
    assert conversations.claim("", oldest) is None, "the least recently registered went first"
    clock.now = 61.0
    newest = digest_prompt([SYSTEM, {"role": "user", "content": "task 4"}, ANSWER_SENT_BACK, RESULT])
    assert conversations.claim("", newest) is None, "past its time a conversation is not joined"
    assert len(conversations) == 0


def test_a_new_session_id_is_valid_everywhere_an_id_goes():
    ids = {new_session_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(session_id.startswith("inferred-") and valid_rollout_id(session_id) for session_id in ids)


@pytest.mark.parametrize("layout", [{}, {"compress": True}, {"encoding": "delta"}])
def test_the_index_says_how_each_session_was_named(tmp_path, layout):
    """From the record's first block (or, compressed, the whole record): the first record's source word."""
    capture_dir = tmp_path / "captures"
    store = CaptureStore(capture_dir, **layout)
    store.start()
    try:
        submit_all(
            store,
            captured_call("by-header", session_source="header:x-session-id"),
            captured_call("inferred-0a1b", session_source="inferred"),
            captured_call("gym-task", rollout_id="gym-task"),  # a record from before session_source
            captured_call("unsaid"),
        )
    finally:
        store.close()
    reader = CaptureStore.open_read_only(capture_dir)
    named = {s["session_id"]: s["identified_by"] for s in reader.list_sessions(limit=10)}
    assert named == {"by-header": "header", "inferred-0a1b": "inferred", "gym-task": "path", "unsaid": None}


def test_odd_messages_are_digested_without_error():
    """Whatever a client sends (huge numbers, non-text parts, non-dict messages), a digest comes back."""
    odd = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:,x"}}, {"type": "text", "text": "see"}],
        },
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "f", "arguments": '{"n": 1180591620717411303424}'}}],
        },
        "not a message",
        {"role": "tool", "content": {"json": True}},
    ]
    prompt = digest_prompt(odd)
    assert len(prompt.continues) == 1 and len(digest_answer(prompt, {"role": "assistant"})) == 32
