"""The one check every /v1/sessions route makes: the id is valid and the request's key may see that session.

A session route starts with `reads, store, session_id = await readable_session(request)` (a list, with
`capture_store(request)`): what the routes share lives in the app's `SessionReads`, never in closures.
With `api_keys` set, a key sees the sessions its own calls wrote (`server.capture.catalog.session_owners`); an admin
key (`session_api_keys`) sees them all. Any other session answers exactly as an unknown one does (a
404), so a key learns nothing about sessions that are not its own. With no keys, everything is open.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from starlette.applications import Starlette
from starlette.requests import Request

from server.capture.catalog.summary import SummaryCache
from server.capture.read.rebuilds import RolloutBuilder
from server.capture.store import CaptureStore
from server.errors import OpenAIError
from server.ids import is_valid_session_id
from server.request_owner import Owners


class SessionAccess:
    """Built once per app; `owners` None means no scoping (the offline viewer: no keys at all)."""

    def __init__(self, owners: Owners | None) -> None:
        self.owners = owners

    def _scoped_tag(self, request: Request) -> str | None:
        """The tag to compare owners against, or None when this request sees every session."""
        owners = self.owners
        if owners is None or owners.is_admin(request.scope):
            return None
        return owners.tag(request.scope)

    async def session_id(self, request: Request, store: CaptureStore, name: str = "session_id") -> str:
        """The path's session id, once the request may see it; else the 404 of an unknown session.

        Every route that reads or changes one session calls this first.
        """
        session_id: str = request.path_params[name]
        # Refused before any store call: an invalid id never reaches the filesystem.
        if not is_valid_session_id(session_id):
            raise unknown_session(session_id)
        tag = self._scoped_tag(request)
        if tag is None:
            return session_id
        owner = store.known_claim(session_id)
        if owner is None:
            owner = await asyncio.to_thread(store.session_owner, session_id)
        if owner != tag:
            raise unknown_session(session_id)
        return session_id

    def visible(self, request: Request, store: CaptureStore) -> Callable[[str], bool] | None:
        """For lists: a test of one session id (it reads the disk: call it in a thread), or None for all."""
        tag = self._scoped_tag(request)
        if tag is None:
            return None
        return lambda session_id: store.session_owner(session_id) == tag


def unknown_session(session_id: str, *, skipped: int = 0) -> OpenAIError:
    message = f"unknown session: {session_id[:200]!r}"
    if skipped:
        message += f" ({skipped} unreadable record files skipped)"
    return OpenAIError(404, message, param="session_id", code="session_not_found")


class CaptureSource(Protocol):
    """Where the session routes find the store and the rollout builder: the server's AppState (filled
    in by the lifespan; None while capture is off or not started) or a `FixedCapture`."""

    @property
    def capture_store(self) -> CaptureStore | None: ...

    @property
    def rollouts(self) -> RolloutBuilder | None: ...


@dataclass
class FixedCapture:
    """A store known when the app is built (the offline viewer, tests); no builder: rollouts are
    rebuilt in a thread of this process."""

    capture_store: CaptureStore | None
    rollouts: RolloutBuilder | None = None


@dataclass
class SessionReads:
    """What the session routes of one app share, kept at `app.state.session_reads` (`install`).

    `summaries` holds per-session summaries for the list and the timelines; `access` says which
    sessions a request's key may see (the default: all of them); `timelines` keeps built timelines
    (serialised) so a page reload costs nothing."""

    source: CaptureSource
    access: SessionAccess = field(default_factory=lambda: SessionAccess(None))
    summaries: SummaryCache = field(default_factory=SummaryCache)
    timelines: OrderedDict[tuple[object, ...], bytes] = field(default_factory=OrderedDict)
    timelines_lock: threading.Lock = field(default_factory=threading.Lock)
    _fallback: RolloutBuilder | None = field(default=None, init=False, repr=False)

    def install(self, app: Starlette) -> None:
        """Make these the reads of `app`'s session routes."""
        app.state.session_reads = self

    def rollout_builder(self, store: CaptureStore) -> RolloutBuilder:
        """The source's builder (a worker process, cached); without one, a builder here that
        rebuilds each rollout in a thread of this process."""
        builder = self.source.rollouts
        if builder is not None:
            return builder
        if self._fallback is None:
            self._fallback = RolloutBuilder(store.sessions_dir, workers=0, cache_bytes=0)
        return self._fallback


class ReadableSession(NamedTuple):
    """What `readable_session` hands a route: the app's reads, the store, and a session id it may read."""

    reads: SessionReads
    store: CaptureStore
    session_id: str


def session_reads(request: Request) -> SessionReads:
    """The `SessionReads` of the app serving `request`."""
    reads: SessionReads = request.app.state.session_reads
    return reads


def capture_store(request: Request) -> CaptureStore:
    """The store the request reads; a 503 while capture is off."""
    store = session_reads(request).source.capture_store
    if store is None:
        raise OpenAIError(503, "session capture is not enabled on this server", code="capture_disabled")
    return store


async def readable_session(request: Request, name: str = "session_id") -> ReadableSession:
    """The dependency of every route on one session: the store (503 while capture is off) and the path's
    session id once the request's key may see it (else the 404 of an unknown session)."""
    reads = session_reads(request)
    store = capture_store(request)
    return ReadableSession(reads, store, await reads.access.session_id(request, store, name))
