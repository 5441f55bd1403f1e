"""The one check every /v1/sessions route makes: the id is valid and the request's key may see that session.

With `api_keys` set, a key sees the sessions its own calls wrote (`server.capture.catalog.session_owners`); an admin
key (`session_api_keys`) sees them all. Any other session answers exactly as an unknown one does (a
404), so a key learns nothing about sessions that are not its own. With no keys, everything is open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import Request

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
