"""Who may write into a session: the one rule a valid model call passes before it creates anything or goes upstream.

With `api_keys` set, a call writes into every session it names: its own session, its parent, the
session before each `/` of those ids (Claude Code's sub-agent `<session>/<agent>` is a child of
`<session>`), and its Gym rollout id (Gym's token store and exchange log are keyed by it). It may do
so only when its key owns each of them, or nobody does yet and the session holds nothing (then the
call claims it for its key, `server.capture.catalog.session_owners`). A session that holds records but no
owner (written before keys were set, by an older server, or an uncorrelated call, `uncorrelated-*`)
is an admin key's alone: admins write into it without claiming it, every other key gets the 403.

So a key can neither write into another key's session nor become a parent or a child in its tree:
naming a parent that does not exist yet claims it for the naming key, and the key that later starts
a session under that id gets the 403 (it tells it the id is taken), never a tree with another key's
text in it. docs/operations.md has the rule as a table; tests/integration/test_write_rule.py checks
every cell through a real server.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.types import Scope

from middleware.correlation import Correlation
from server.capture.catalog.session_owners import Claim
from server.errors import OpenAIError
from server.ids import UNCORRELATED_PREFIX, is_valid_session_id
from server.request_owner import Owners

if TYPE_CHECKING:
    from server.capture.store import CaptureStore


def sessions_written(corr: Correlation) -> list[str]:
    """Every session id a call writes into, the call's own first; no duplicates, only valid ids."""
    named = [corr.session_id, corr.parent_session_id, corr.rollout_id]
    ids: list[str] = []
    for session_id in named:
        if session_id is None:
            continue
        # The id itself, then the ids before each `/` in it: `a/b/c` writes into `a/b` and `a` too.
        candidates = [session_id]
        cut = session_id.rfind("/")
        while cut > 0:
            candidates.append(session_id[:cut])
            cut = session_id.rfind("/", 0, cut)
        for candidate in candidates:
            if candidate not in ids and is_valid_session_id(candidate):
                ids.append(candidate)
    return ids


async def admit_writes(owners: Owners, store: CaptureStore | None, corr: Correlation, scope: Scope) -> None:
    """Let the call write into the sessions it names, claiming the new ones for its key; else the 403.

    Nothing to do without keys (one tenant) or without capture (no sessions). For sessions this
    process has seen its key own, it touches no file: the model call's hot path.
    """
    if not owners.scoped or store is None:
        return
    tag = owners.tag(scope)
    pending = [session_id for session_id in sessions_written(corr) if store.known_standing(session_id) != tag]
    if not pending:
        return
    admin = owners.is_admin(scope)
    if all(store.known_standing(s) is not None or s.startswith(UNCORRELATED_PREFIX) for s in pending):
        _check_and_claim(store, pending, tag, admin)  # all known in memory: nothing to read or claim
    else:
        await asyncio.to_thread(_check_and_claim, store, pending, tag, admin)


def _check_and_claim(store: CaptureStore, session_ids: list[str], tag: str, admin: bool) -> None:
    """Look at every session first (nothing made if any refuses), then claim the new ones; a claim lost
    to a racing key undoes this call's other claims. Blocks on the disk: a thread."""
    new: list[str] = []
    for session_id in session_ids:
        if session_id.startswith(UNCORRELATED_PREFIX):  # the server's name for calls without a session
            if admin:
                continue
            raise _forbidden(
                session_id, "is where calls without a session id are recorded: only an admin key writes there"
            )
        standing = store.session_standing(session_id)
        if standing is None:
            new.append(session_id)
        elif standing == "":
            if not admin:
                raise _forbidden(
                    session_id,
                    "holds records written by no key (before keys were set, or by an older server): "
                    "only an admin key writes there",
                )
        elif standing != tag:
            raise _forbidden(session_id, "belongs to another API key")
    made: list[str] = []
    for session_id in new:
        claim = store.claim_session(session_id, tag)
        if claim is Claim.MADE:
            made.append(session_id)
        elif claim is Claim.REFUSED:
            for undo in made:
                store.release_session(undo, tag)
            raise _forbidden(session_id, "belongs to another API key")


def _forbidden(session_id: str, why: str) -> OpenAIError:
    return OpenAIError(
        403,
        f"session {session_id[:200]!r} {why}; send this call under a session id of its own",
        code="session_forbidden",
    )
