"""Capture records of scripted agent sessions whose client rewrites history the ways real frameworks do.

A toy template renders messages to token ids (role marker, then the characters), so a client that
re-sends the conversation exactly gets contiguous prompts and every rewrite changes the tokens where
it changed the text, as a real engine's template would.
"""

from __future__ import annotations

import copy

MODEL = "policy-model"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
_ROLE = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
END = 5

# What a step can do to the conversation before its call (the kinds of break they cause).
OPERATIONS = ("extend", "rewrite", "tool_call_as_text", "history_twice", "compact", "drop", "title", "retry", "fail")


def _body(message: dict) -> list[int]:
    out = [ord(c) + 10 for c in message.get("content") or ""]
    for call in message.get("tool_calls") or []:
        out += [7] + [ord(c) + 10 for c in call["function"]["name"] + call["function"]["arguments"]]
    return out + [END]


def render(messages: list[dict]) -> list[int]:
    """The prompt tokens for `messages`, ending with the assistant marker the generation follows."""
    out: list[int] = []
    for message in messages:
        out += [_ROLE[message["role"]]] + _body(message)
    return out + [_ROLE["assistant"]]


class ScriptedSession:
    """Builds one session's records call by call; `history` is what the client will send next."""

    def __init__(self, session_id: str, *, parent: str | None = None) -> None:
        self.session_id = session_id
        self.parent = parent
        self.history: list[dict] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": f"Task for {session_id}"},
        ]
        self.records: list[dict] = []
        self.turn = 0

    def _record(self, messages: list[dict], reply: dict, **extra) -> dict:
        n = len(self.records)
        generation = _body(reply)
        record = {
            "schema_version": 1,
            "uuid": f"{self.session_id}-{n:03d}",
            "session_id": self.session_id,
            "parent_session_id": self.parent,
            "captured_at": f"2026-07-14T00:{n // 60:02d}:{n % 60:02d}.000000+00:00",
            "request_id": f"req-{n}",
            "model": MODEL,
            "messages": copy.deepcopy(messages) + [reply],
            "tools": TOOLS,
            "tool_choice": "auto",
            "prompt_token_ids": render(messages),
            "generation_token_ids": generation,
            "generation_log_probs": [-0.25 - 0.01 * (i % 7) for i in range(len(generation))],
            "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
            "is_valid": True,
        }
        record.update(extra)
        self.records.append(record)
        return record

    def call(self, *, tool: bool = True) -> dict:
        """One model call on the current history; the client then appends the reply and the tool's result."""
        self.turn += 1
        if tool:
            call_id = f"call_{self.turn}"
            arguments = f'{{"cmd": "ls {self.turn}"}}'
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
                ],
            }
        else:
            reply = {"role": "assistant", "content": f"answer {self.turn}"}
        record = self._record(self.history, reply)
        self.history = self.history + [reply]
        if tool:
            self.history.append({"role": "tool", "tool_call_id": f"call_{self.turn}", "content": f"out {self.turn}"})
        else:
            self.history.append({"role": "user", "content": f"next {self.turn}"})
        return record

    # -- what clients do to the history between calls --------------------------------------------

    def rewrite(self) -> None:
        """The client edits the first message after the system prompt (whatever it is now)."""
        target = self.history[1]
        self.history[1] = {**target, "content": (target.get("content") or "") + " (edited)"}

    def tool_call_as_text(self) -> None:
        """The framework re-sends its last tool call as assistant text and the result as a user message."""
        for k in range(len(self.history) - 1, 0, -1):
            message = self.history[k]
            if message["role"] == "assistant" and message.get("tool_calls"):
                call = message["tool_calls"][0]["function"]
                self.history[k] = {"role": "assistant", "content": f"Calling {call['name']}({call['arguments']})"}
                if k + 1 < len(self.history) and self.history[k + 1]["role"] == "tool":
                    self.history[k + 1] = {"role": "user", "content": "Observation: " + self.history[k + 1]["content"]}
                return

    def history_twice(self) -> None:
        """previous_response_id and the full history together: the stored conversation, then all of it again."""
        self.history = self.history + copy.deepcopy(self.history)

    def compact(self) -> None:
        """A condenser: the system prompt and the task kept, the turns between them and the latest turn
        replaced by one short summary (tests/support/framework_breaks.py has real frameworks' shapes)."""
        summary = {"role": "user", "content": f"Summary of {len(self.history)} messages."}
        self.history = [*self.history[:2], summary, *self.history[-2:]]

    def drop(self) -> None:
        """A window over the conversation: the system prompt and the latest turn, older messages gone."""
        self.history = [self.history[0], *self.history[-2:]]

    def title(self) -> dict:
        """opencode's title call: no tools, a title-generator system prompt, nothing continues it."""
        messages = [{"role": "system", "content": "You are a title generator."}, {"role": "user", "content": "Task"}]
        record = self._record(messages, {"role": "assistant", "content": f"Title {self.turn}"})
        record["tools"] = []
        return record

    def retry(self) -> dict:
        """A losing attempt at the next call (same prompt, other answer), recorded before the kept one."""
        return self._record(self.history, {"role": "assistant", "content": f"abandoned {self.turn}"})

    def fail(self) -> dict:
        """A call that did not complete: recorded invalid, without token ids."""
        record = self._record(self.history, {"role": "assistant", "content": ""})
        record.update(
            is_valid=False,
            invalid_reason="upstream stream ended before finish_reason",
            prompt_token_ids=None,
            generation_token_ids=None,
            generation_log_probs=None,
        )
        return record

    def apply(self, operation: str) -> None:
        """Do `operation` (one of OPERATIONS), then make the next real call."""
        if operation in ("rewrite", "tool_call_as_text", "history_twice", "compact", "drop"):
            getattr(self, operation)()
        elif operation in ("title", "retry", "fail"):
            getattr(self, operation)()
        self.call(tool=len(self.records) % 3 != 2)


def scripted(session_id: str, operations: list[str], *, parent: str | None = None) -> list[dict]:
    """A session that starts with one call and then does each operation before its next call."""
    session = ScriptedSession(session_id, parent=parent)
    session.call()
    for operation in operations:
        session.apply(operation)
    return session.records
