"""Break kinds name what the client did: each framework-shaped session breaks with its own kind, and the
docs list exactly the kinds the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from server.capture.rollout import breaks
from server.capture.rollout.breaks import KINDS
from server.capture.rollout.chains import session_chains
from tests.support.framework_breaks import FIXTURES, records_of

CAPTURE_DOC = Path(__file__).resolve().parents[4] / "docs" / "capture.md"


def kinds_of(kind: str) -> list[str]:
    if kind in ("compacted", "new_conversation"):  # recorded live from pydantic-ai (the `harnesses` extra)
        pytest.importorskip("pydantic_ai")
    records = records_of("s", FIXTURES[kind]())
    body = session_chains("s", records)
    assert body["trainable_fraction"] == 1.0, "every generated token is still in some chain"
    return [account["kind"] for account in body["breaks"]]


@pytest.mark.parametrize("kind", sorted(FIXTURES))
def test_each_framework_session_breaks_with_the_kind_named_for_it(kind):
    found = kinds_of(kind)
    assert found and set(found) == {kind}


def test_the_live_fixtures_are_what_the_framework_sent():
    """The recorded fixtures hold what pydantic-ai really sent: the condensed call keeps the task and
    carries the summary in place of the earlier tool turns."""
    pytest.importorskip("pydantic_ai")
    calls = FIXTURES["compacted"]()
    condensed = calls[3][0]
    assert [m["role"] for m in condensed] == ["system", "user", "user", "assistant", "tool"]
    assert condensed[2]["content"].startswith("So far:") and condensed[1] == calls[0][0][1]
    two_runs = FIXTURES["new_conversation"]()
    assert [len(messages) for messages, _ in two_runs] == [2, 4, 2, 4]


# Without the check that names it, each new kind falls back to what the session used to be called.
CONTROLS = {
    "prompt_rebuilt": ("_answer_rendered_into", {"new_conversation", "compacted", "rewrote_history"}),
    "retried_with_new_system_prompt": ("_same_question_new_system_prompt", {"new_conversation", "rewrote_history"}),
}


@pytest.mark.parametrize("kind", sorted(CONTROLS))
def test_negative_control_without_its_check_a_kind_is_not_found(kind, monkeypatch):
    name, fallback = CONTROLS[kind]
    monkeypatch.setattr(breaks, name, lambda *args: False)
    assert set(kinds_of(kind)) <= fallback


def test_history_sent_twice_is_found_only_past_the_system_prompt(monkeypatch):
    """With the opening looked for from the first message, as before, the strands session reads as an
    inserted message: the system prompt (its `instructions`) is not sent twice, the history is."""
    records = records_of("s", FIXTURES["history_sent_twice"]())
    history, prompt = records[0]["messages"], records[1]["messages"][:-1]
    assert breaks.message_break_kind(history, prompt) == "history_sent_twice"
    monkeypatch.setattr(breaks, "_SYSTEM_ROLES", ())
    assert breaks.message_break_kind(history, prompt) == "inserted_message"


def test_the_docs_list_every_break_kind_and_no_other():
    text = CAPTURE_DOC.read_text()
    section = text[text.index("### Break kinds") :]
    section = section[: section.index("\n## ", 1) if "\n## " in section else len(section)]
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", section, flags=re.M)
    assert [kind for kind, _ in rows] == list(KINDS), "the table lists KINDS, in order"
    for kind, summary in rows:
        assert summary.strip() == KINDS[kind].capitalize() + ".", f"{kind}: the summary the API gives"
