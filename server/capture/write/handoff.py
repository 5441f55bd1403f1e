"""Hands a finished call to capture before its answer's last byte, and refuses calls while capture cannot keep them."""

from __future__ import annotations

import logging

from server.capture.store import CaptureStore
from server.capture.write.record import RecordInput
from server.config import Settings
from server.errors import OpenAIError

log = logging.getLogger("switchyard_model.capture")


def capture_unavailable(reason: str | None) -> OpenAIError:
    detail = f" ({reason})" if reason else ""
    return OpenAIError(
        503,
        f"capture cannot write records{detail}; this server is set to refuse captured calls until it can "
        "(capture_on_failure: refuse)",
        code="capture_unavailable",
    )


class CaptureHandoff:
    """What the call handlers ask of capture: may this call go ahead, and save this call's record."""

    def __init__(self, settings: Settings, store: CaptureStore) -> None:
        self.store = store
        self.wait = settings.capture_before_answer
        self.refuse = settings.capture_on_failure == "refuse"
        self.timeout_s = settings.capture_write_timeout_s

    def check_open(self) -> None:
        """Before a captured call goes upstream: under `refuse`, a 503 while capture is degraded."""
        if self.refuse and self.store.degraded:
            raise capture_unavailable(self.store.writer.degraded_reason)

    async def save(self, call: RecordInput) -> None:
        """The call has its whole answer but not its last byte: put its record in its file first.

        Never raises under `serve` (capture never fails a call; a failure is counted, logged and
        marks the session). Under `refuse`, raises the 503 when the record could not be saved.
        """
        if not self.wait:
            self.save_later(call)
            return
        try:
            kept = await self.store.write_call(call, timeout=self.timeout_s)
        except Exception:  # capture must never fail a call; the store counts its own failures
            log.exception("capture hand-off failed")
            kept = False
        if not kept and self.refuse:
            raise capture_unavailable(self.store.writer.degraded_reason or "the record was not written in time")

    def save_later(self, call: RecordInput) -> None:
        """Queue the record without waiting: for calls that failed or were cut, whose answer is already over."""
        try:
            self.store.submit_call(call)
        except Exception:
            log.exception("capture hand-off failed")
