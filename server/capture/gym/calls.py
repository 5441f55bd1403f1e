"""NeMo Gym's evaluation capture: each `/ng-rollout/<id>/...` call as one exchange in `<model_call_capture_dir>/<id>.capture.jsonl`.

With Gym's `observability_enabled`, Gym's model servers append one JSON line per model call to the
rollout's file, and Gym's rollout records join their model calls through it. This writes the same
lines (Gym's field names and meanings) for the calls this server serves, beside its own records.
Best-effort, as in Gym: a failed write is logged and marks the rollout's capture incomplete
(`<id>.capture.incomplete`); it never fails the call.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from server.ids import valid_rollout_id

log = logging.getLogger("switchyard_model.gym_calls")


def _error_category(status: int | None) -> str | None:
    """Gym's normalised category of an HTTP status (None below 400)."""
    if status is None or status < 400:
        return None
    named = {408: "timeout", 504: "timeout", 429: "rate_limit", 401: "auth", 403: "auth", 404: "not_found"}
    if status in named:
        return named[status]
    return "client_error" if status < 500 else "upstream_error"


class GymCallLog:
    """The evaluation capture directory of one Gym run, and the exchanges appended to it."""

    def __init__(self, root: str | Path, server_name: str | None) -> None:
        self.root = Path(root)
        self.server_name = server_name

    @classmethod
    def from_gym_settings(cls, gym: Mapping[str, Any] | None) -> GymCallLog | None:
        """Built when Gym's `observability_enabled` is on (with its `model_call_capture_dir`); else None."""
        if not gym or not gym.get("observability_enabled"):
            return None
        root = gym.get("model_call_capture_dir")
        if not root:
            raise ValueError("observability_enabled needs model_call_capture_dir, as in Gym")
        Path(root).mkdir(parents=True, exist_ok=True)
        return cls(root, gym.get("server_name"))

    def exchange(
        self,
        *,
        model_call_id: str,
        dialect: str,
        started_at: float,
        completed_at: float,
        latency_ms: float,
        status_code: int | None,
        request: Any,
        response: Any,
        error_category: str | None = None,
    ) -> dict[str, Any]:
        return {
            "model_call_id": model_call_id,
            "dialect": dialect,
            "model_ref": {"type": "responses_api_models", "name": self.server_name} if self.server_name else None,
            "started_at": started_at,
            "completed_at": completed_at,
            "latency_ms": round(latency_ms, 2),
            "latency_ttft_ms": None,
            "status_code": status_code,
            "error_category": error_category or _error_category(status_code),
            "request": request,
            "response": response,
        }

    async def record(self, rollout_id: str, exchange: dict[str, Any]) -> None:
        """Append the exchange, durably, off the event loop. Never raises."""
        try:
            await asyncio.to_thread(self._append, rollout_id, exchange)
        except Exception:
            log.warning("Gym model-call capture failed for rollout %s", rollout_id, exc_info=True)
            try:
                await asyncio.to_thread(self._mark_incomplete, rollout_id)
            except Exception:
                log.warning("cannot mark rollout %s's Gym capture incomplete", rollout_id, exc_info=True)

    def _path(self, rollout_id: str, suffix: str) -> Path:
        if valid_rollout_id(rollout_id) is None:
            raise ValueError(f"not a Gym rollout id: {rollout_id!r}")
        return self.root / f"{rollout_id}{suffix}"

    def _append(self, rollout_id: str, exchange: dict[str, Any]) -> None:
        line = orjson.dumps(exchange, default=str, option=orjson.OPT_APPEND_NEWLINE)
        # One line per write, under an exclusive lock: the workers of a server (and Gym's own servers)
        # append to the same rollout's file.
        with self._path(rollout_id, ".capture.jsonl").open("ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _mark_incomplete(self, rollout_id: str) -> None:
        self._path(rollout_id, ".capture.incomplete").touch(exist_ok=True)
