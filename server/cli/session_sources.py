"""Where `sessions` reads captured sessions from: a running server over HTTP, or a capture directory in place.

Both sources answer the same four questions (list, tree, completions, rollout) with the bodies of the
server's GET session API, so the commands and their output do not care which one they read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import quote, urlsplit

import httpx
import orjson

from server.capture.catalog.runs import ALL, LATEST, UnknownDispatch, UnknownRun
from server.capture.catalog.sessions import build_rollout, build_tree, lost_session_envelope, lost_session_node
from server.capture.rollout import RolloutError, lost_session_rollout
from server.capture.store import CaptureStore, UnknownSession
from server.urls import root_url

_PAGE = 1000
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class NotFound(Exception):
    """The session (or its records from the asked server run) is not there."""


class Failed(Exception):
    """The source could not answer: unreachable, an HTTP error, a rollout that cannot be rebuilt."""


class SessionSource(Protocol):
    """What the `sessions` commands read; each method answers what the GET session API would."""

    def close(self) -> None: ...

    def list_sessions(self, *, parent: str | None, roots_only: bool, limit: int | None) -> list[dict[str, Any]]: ...

    def tree(self, session_id: str, *, run: str = ALL) -> dict[str, Any]: ...

    def completions(self, session_id: str) -> dict[str, Any]: ...

    def rollout(
        self, session_id: str, *, allow_partial: bool, run: str = LATEST, view: str = "rollout"
    ) -> dict[str, Any]: ...


class ServerSource:
    """A running switchyard-model server's GET session API."""

    def __init__(self, url: str, timeout: float) -> None:
        base = root_url(url)
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Failed(f"--url must be an http(s) URL, got {url!r}")
        # Proxy variables would otherwise route even loopback calls through a proxy.
        self._client = httpx.Client(base_url=base, timeout=timeout, trust_env=parts.hostname not in _LOOPBACK)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """The JSON object the server answered with; its errors as NotFound or Failed."""
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise Failed(f"cannot reach {self._client.base_url}: {exc}") from None
        if response.status_code == 200:
            try:
                body: dict[str, Any] = orjson.loads(response.content)  # the session API answers objects
            except orjson.JSONDecodeError:
                raise Failed(f"{path}: the server did not return JSON") from None
            return body
        message = _error_message(response)
        if response.status_code == 404:
            raise NotFound(message)
        raise Failed(f"{path}: HTTP {response.status_code}: {message}")

    def list_sessions(self, *, parent: str | None, roots_only: bool, limit: int | None) -> list[dict[str, Any]]:
        sessions: list[dict[str, Any]] = []
        after = None
        while limit is None or len(sessions) < limit:
            params = {"limit": str(_PAGE)}
            if parent:
                params["parent"] = parent
            if roots_only:
                params["roots_only"] = "true"
            if after:
                params["after"] = after
            page = self._get("/v1/sessions", params)
            sessions.extend(page.get("sessions") or [])
            after = page.get("next_after")
            if not page.get("has_more") or not after:
                break
        return sessions if limit is None else sessions[:limit]

    def tree(self, session_id: str, *, run: str = ALL) -> dict[str, Any]:
        return self._get(f"/v1/sessions/{_segment(session_id)}/tree", _run_params(run))

    def completions(self, session_id: str) -> dict[str, Any]:
        return self._get(f"/v1/sessions/{_segment(session_id)}/completions")

    def rollout(
        self, session_id: str, *, allow_partial: bool, run: str = LATEST, view: str = "rollout"
    ) -> dict[str, Any]:
        return self._get(
            f"/v1/sessions/{_segment(session_id)}/{view}",
            {"allow_partial": "true" if allow_partial else "false", **_run_params(run)},
        )


def _run_params(run: str) -> dict[str, str]:
    """The `run` and `dispatch` query parameters for a views' value (`runs.with_dispatch`)."""
    run, _, dispatch = run.partition("#")
    return {"run": run, "dispatch": dispatch} if dispatch else {"run": run}


def _segment(session_id: str) -> str:
    """A session id as one URL path segment: ids may hold `/`, `?`, `#` or `%`."""
    return quote(session_id, safe="")


class DirectorySource:
    """A capture directory, read in place (read-only: no server, nothing written)."""

    def __init__(self, capture_dir: str) -> None:
        if not Path(capture_dir).is_dir():
            raise Failed(f"no capture directory at {capture_dir}")
        self._store = CaptureStore.open_read_only(capture_dir)

    def close(self) -> None:
        pass

    def list_sessions(self, *, parent: str | None, roots_only: bool, limit: int | None) -> list[dict[str, Any]]:
        return self._store.list_sessions(
            parent=parent, roots_only=roots_only, limit=limit if limit is not None else sys.maxsize
        )

    def tree(self, session_id: str, *, run: str = ALL) -> dict[str, Any]:
        try:
            return build_tree(self._store, session_id, run=run)
        except UnknownSession:
            if lost := self._store.lost_records(session_id):  # every record lost: it ran
                return lost_session_node(session_id, lost)
            raise NotFound(f"unknown session: {session_id!r}") from None
        except UnknownDispatch:
            raise NotFound(f"session {session_id!r} has no dispatch {run.partition('#')[2] or 'latest'}") from None
        except UnknownRun:
            raise NotFound(f"session {session_id!r} has no records from server run {run.partition('#')[0]!r}") from None

    def completions(self, session_id: str) -> dict[str, Any]:
        try:
            records, skipped = self._store.read_completions(session_id)
        except UnknownSession:
            records, skipped = [], 0
        if not records:
            if lost := self._store.lost_records(session_id):
                return lost_session_envelope(session_id, lost, skipped=skipped)
            raise NotFound(f"unknown session: {session_id!r}")
        return {
            "schema_version": 1,
            "session_id": session_id,
            "completions": records,
            "skipped": skipped,
            "lost_records": self._store.lost_records(session_id),
        }

    def rollout(
        self, session_id: str, *, allow_partial: bool, run: str = LATEST, view: str = "rollout"
    ) -> dict[str, Any]:
        try:
            # The same JSON body the remote source reads off the server.
            return cast(
                dict[str, Any], build_rollout(self._store, session_id, allow_partial=allow_partial, run=run, view=view)
            )
        except UnknownSession:
            lost = self._store.lost_records(session_id)
            if not lost:
                raise NotFound(f"unknown session: {session_id!r}") from None
            try:
                return cast(dict[str, Any], lost_session_rollout(session_id, lost, allow_partial))
            except RolloutError as exc:
                raise Failed(f"session {session_id}: {exc}") from None
        except UnknownDispatch:
            raise NotFound(f"session {session_id!r} has no dispatch {run.partition('#')[2] or 'latest'}") from None
        except UnknownRun:
            raise NotFound(f"session {session_id!r} has no records from server run {run.partition('#')[0]!r}") from None
        except RolloutError as exc:
            raise Failed(f"session {session_id}: {exc}") from None


def _error_message(response: httpx.Response) -> str:
    try:
        body = orjson.loads(response.content)
        return str(body["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return response.text[:500] or response.reason_phrase
