"""Sessions for calls that name none, as a model call sees them: inferred from the conversation, and named in the answer's headers.

The conversation map itself is `server.capture.catalog.inferred`; here is what one request does with
it: claim the session its messages continue (or start one), register its answer when it completes,
give its claim back when it does not, and say on its answer which session it used and whether it
was recorded (docs/capture.md#calls-without-a-session-id).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass, replace
from typing import Any

from starlette.types import Message, Send

from middleware.correlation import Correlation
from server.capture.catalog import inferred
from server.state import AppState

# On every model answer: the session the call was recorded under (also when the client named it),
# and whether it was recorded at all (`recorded`, or `not recorded: <why>`).
SESSION_ID_HEADER = b"x-switchyard-session-id"
CAPTURE_HEADER = b"x-switchyard-model-capture"


@dataclass(slots=True)
class Inference:
    """A call without a session id placed in a session by its conversation."""

    owner: str
    prompt: inferred.Prompt
    claim: inferred.Claim | None  # the session it continues; None: it started a new one
    registered: bool = False  # its answer registered: the conversation went on
    detached: bool = False  # handed to a background run, which registers it when it completes
    given_back: bool = False

    def give_back_unless_done(self, conversations: inferred.ConversationMap) -> None:
        """A claiming call that did not complete: the conversation it continued is open again, for its retry."""
        if self.claim is not None and not (self.registered or self.detached or self.given_back):
            conversations.give_back(self.claim)
            self.given_back = True


@dataclass(slots=True)
class Answering:
    """One model request's session as its answer's headers tell it: filled in as the call is prepared."""

    owner: str  # the key's owner tag ("" when nothing is scoped)
    session_id: str | None = None
    capture: bytes | None = None  # the capture header's value, once decided
    inference: Inference | None = None


_answering: ContextVar[Answering | None] = ContextVar("switchyard_model_answering", default=None)


def begin(owner: str, send: Send) -> tuple[Answering, Token[Answering | None], Send]:
    """A model request starts: its answering record, current until `end`, and the `send` that puts
    its session on the answer."""
    answering = Answering(owner)
    return answering, _answering.set(answering), with_session_headers(send, answering)


def end(state: AppState, answering: Answering, token: Token[Answering | None]) -> None:
    """A model request is over: a claim its call did not use up (it failed, or was refused before it
    went upstream) goes back."""
    _answering.reset(token)
    if answering.inference is not None:
        answering.inference.give_back_unless_done(state.conversations)


def infer_session(state: AppState, corr: Correlation, request: dict[str, Any]) -> tuple[Correlation, Inference | None]:
    """A call with no session id joins the session its conversation continues, or starts one. A call
    whose id was refused is left alone: its client named a session, just not one this server accepts."""
    answering = _answering.get()
    if corr.source == "inferred":  # inferred already (a handler's `prepare` does it first)
        return corr, answering.inference if answering is not None else None
    messages = request.get("messages")
    if (
        corr.session_id is not None
        or corr.refused
        or not state.settings.session_inference
        or state.capture_store is None
        or not isinstance(messages, list)
    ):
        return corr, None
    owner = answering.owner if answering is not None else ""
    prompt = inferred.digest_prompt(messages)
    claim = state.conversations.claim(owner, prompt)
    session_id = claim.session_id if claim is not None else inferred.new_session_id()
    inference = Inference(owner, prompt, claim)
    if answering is not None:
        answering.inference = inference
    return replace(corr, session_id=session_id, source="inferred"), inference


def not_recorded_because(state: AppState, corr: Correlation) -> str:
    """Why a call is not recorded, in words for its answer's header (asked only of calls that are not)."""
    if state.capture_store is None:
        return "capture is off"
    if corr.refused:
        return "its session id was refused (x-switchyard-model-refused-id)"
    if not state.settings.session_inference:
        return "no session id, and session_inference is off"
    return "no session id, and no chat messages to infer one from"


def decided(state: AppState, corr: Correlation, captured: bool) -> None:
    """The call is prepared: its answer will name this session and say whether it is recorded."""
    answering = _answering.get()
    if answering is not None:
        answering.session_id = corr.session_id
        why = None if captured else not_recorded_because(state, corr)
        answering.capture = b"recorded" if why is None else f"not recorded: {why}".encode("ascii")


def named(session_id: str | None) -> None:
    """The session the client named (before any call is prepared: an early error still names it)."""
    answering = _answering.get()
    if answering is not None:
        answering.session_id = session_id


def answered(
    state: AppState, inference: Inference | None, session_id: str | None, chat_response: dict[str, Any]
) -> None:
    """An inferred call completed: the conversation it ended (its messages + answer) is open to continue."""
    if inference is None or inference.registered or session_id is None:
        return
    choices = chat_response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    answer = {**message, "role": "assistant"} if isinstance(message, dict) else {"role": "assistant"}
    state.conversations.register(inference.owner, inferred.digest_answer(inference.prompt, answer), session_id)
    inference.registered = True


def with_session_headers(send: Send, answering: Answering) -> Send:
    """Wraps `send` so the answer names its session and says whether it was recorded."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(name, value) for name, value in message.get("headers", ()) if name.lower() != SESSION_ID_HEADER]
            if answering.session_id is not None:
                headers.append((SESSION_ID_HEADER, answering.session_id.encode("ascii")))
            if answering.capture is not None:
                # An error status: no answer, so nothing is recorded (a stream that fails later is, as failed).
                failed = answering.capture == b"recorded" and message.get("status", 200) >= 400
                headers.append((CAPTURE_HEADER, b"not recorded: the call failed" if failed else answering.capture))
            message = {**message, "headers": headers}
        await send(message)

    return sending
