"""Who a request is: the owner tag of its Bearer key (a slow hash, never the key itself) and whether it is an admin key.

The tag is what stored state records as its writer: sessions in the capture directory, responses and
conversations in the state database. It is a salted scrypt digest, so a copy of those files does not
give away the keys, and guessing a short key from its tag costs a scrypt per guess. Every worker of a
server computes the same tag for the same key, with no shared secret to distribute.
"""

from __future__ import annotations

import hashlib
import threading

from starlette.types import Scope

from middleware.auth import presented_key

_SALT = b"switchyard-model owner v1"
# scrypt cost: about 10 ms and 4 MiB per key, paid once per key and process (the tags are cached).
_SCRYPT = {"n": 2**12, "r": 8, "p": 1, "dklen": 16}


def owner_tag(key: bytes) -> str:
    """The stored form of a key: a salted scrypt digest in hex (32 characters)."""
    return hashlib.scrypt(key, salt=_SALT, **_SCRYPT).hex()


class Owners:
    """Maps a request to its owner tag ("" when no `api_keys` are set: then nothing is scoped).

    Admin keys are the `session_api_keys` when they are set: they may read and delete every session, and
    (when they are model keys too) write into the sessions no key owns (`server.api.session_writes`).
    Only keys that passed the Bearer check reach here, so the cache holds at most one tag per key.
    """

    def __init__(self, api_keys: list[str], session_api_keys: list[str]) -> None:
        self.scoped = bool(api_keys)
        self._keys = frozenset(k.encode() for k in (*api_keys, *session_api_keys))
        self._admin = frozenset(k.encode() for k in session_api_keys)
        self._tags: dict[bytes, str] = {}
        self._lock = threading.Lock()

    def tag(self, scope: Scope) -> str:
        """This request's owner tag; "" when nothing is scoped."""
        if not self.scoped:
            return ""
        key = presented_key(scope)
        cached = self._tags.get(key)
        if cached is not None:
            return cached
        tag = owner_tag(key)
        if key in self._keys:  # an unknown key (a 401 elsewhere) is never remembered
            with self._lock:
                self._tags[key] = tag
        return tag

    def is_admin(self, scope: Scope) -> bool:
        """An admin key (one of `session_api_keys`), or no keys at all: it sees every session."""
        if not self.scoped:
            return True
        return presented_key(scope) in self._admin
