"""The durable response store: responses by id with their input, bounded by count, bytes and age.

Each stored response is the Responses object as the client got it, the full input it ran on (after
`previous_response_id` or conversation expansion), its session id and the key (owner) that made it.
A background run is stored when it starts and updated as it goes; its stream events are kept too,
so any worker can replay or resume it. Blocking (SQLite): call from a worker thread.

Bounds are enforced in the same transaction as each write (a batch of responses is one write):
expired responses go first, then the oldest until the count and byte limits hold. Runs still going
are never evicted.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from server.stateful.db import StateDB
from server.stateful.items import stored_output

RUNNING = ("queued", "in_progress")
_NOT_RUNNING = "status NOT IN ('queued', 'in_progress')"


@dataclass(frozen=True, slots=True)
class Bounds:
    max_count: int
    max_bytes: int
    max_age_s: float
    # Each key's share (None: the whole store). Whatever the shares, a write makes room only by
    # dropping its own key's oldest: one key never evicts another's.
    max_count_per_key: int | None = None
    max_bytes_per_key: int | None = None


@dataclass(slots=True)
class StoredResponse:
    id: str
    owner: str
    session_id: str | None
    status: str
    background: bool
    cancel_requested: bool
    stored_at: float
    heartbeat: float
    response: dict[str, Any]
    input: list[dict[str, Any]]

    @property
    def running(self) -> bool:
        return self.status in RUNNING


# Stored is the Responses object as the client got it and the input it ran on.
_UPSERT = (
    "INSERT INTO responses (id, owner, session_id, status, background, stored_at, heartbeat, size, body)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, session_id = excluded.session_id,"
    " status = excluded.status, background = excluded.background, heartbeat = excluded.heartbeat,"
    " size = excluded.size"
    " + (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM response_events WHERE response_id = excluded.id),"
    " body = excluded.body"
)


# A body of this many bytes or more is written through blob I/O instead of bound to the upsert.
# SQLite copies a bound blob into the statement and keeps the copy until the statement is bound
# again, and Python keeps its statements cached: the last large input stayed resident in every
# process that stored one (one to two bodies' bytes), and the row's record was built whole in memory
# on the way in (one more). A `zeroblob` of the body's length is written in place and then filled,
# page by page. Below the threshold the one bound upsert stays: two more statements per response
# would cost CPU on every ordinary call, and a small bound value held is no matter.
LARGE_BODY_BYTES = 1 << 20
_UPSERT_ZEROBLOB = _UPSERT.replace("?)", "zeroblob(?))", 1)


@dataclass(frozen=True, slots=True)
class Put:
    """One response to store, already encoded (by its caller: an object that cannot be encoded fails that call alone)."""

    id: str
    owner: str
    session_id: str | None
    status: str
    background: bool
    body: bytes  # the response object and the input it ran on
    item_ids: tuple[str, ...] = ()  # its input and output items' ids, for `item_reference`

    @classmethod
    def of(
        cls,
        response: dict[str, Any],
        *,
        owner: str,
        session_id: str | None,
        input_items: list[dict[str, Any]],
        background: bool = False,
        encoded: bytes | None = None,
    ) -> Put:
        """`encoded`: the response already serialised (for its answer), so it is not serialised twice."""
        status = response.get("status") or "completed"
        body = _body(response, input_items, encoded)
        return cls(response["id"], owner, session_id, status, background, body, item_ids(response, input_items))


def item_ids(response: dict[str, Any], input_items: list[dict[str, Any]]) -> tuple[str, ...]:
    """The ids of a response's items that the item index holds (what an `item_reference` may name):
    its input items' and its output items', but for those named after the response itself, which
    `find_items` finds by their name (each row costs a commit a page to write, and its eviction one)."""
    own = response["id"]
    output = response.get("output")
    items = [*input_items, *(output if isinstance(output, list) else ())]
    ids = {
        item["id"]: None
        for item in items
        if isinstance(item, dict) and isinstance(item.get("id"), str) and named_after(item["id"]) != own
    }
    return tuple(ids)


def named_after(item_id: str) -> str | None:
    """The response an item's id names, when it has the shape of an output item's id
    (`translate.response.item_id`: `<prefix>_<the response id's hex>_<output index>`) or of an input
    item's named by `normalize_input` (`..._in<index>`); else None."""
    prefix, _, rest = item_id.partition("_")
    base, _, index = rest.rpartition("_")
    index = index.removeprefix("in")
    if not (prefix and base and index.isdigit()):
        return None
    return "resp_" + base


# An item id points at the newest response that carries it: a response evicted (oldest first) leaves
# its items findable in the later turns that carried them on.
_INDEX_ITEMS = "INSERT OR REPLACE INTO response_items (owner, id, response_id) VALUES (?, ?, ?)"
# How many stored responses one request's item references may make the server read. An item is
# found in the newest response that carried it, so a client sending its conversation back by
# reference (the AI SDK does) names one or two.
MAX_RESPONSES_READ = 64
# Bound to one statement's host parameters (SQLite allows at least 999).
_IDS_PER_QUERY = 500


def _body(response: dict[str, Any], input_items: list[dict[str, Any]], encoded: bytes | None = None) -> bytes:
    # One serialisation into one buffer (the response already encoded goes in as is): the input of a
    # maximum-size request is not encoded on its own and then copied again into the row.
    if encoded is None:
        return orjson.dumps({"response": response, "input": input_items})
    return orjson.dumps({"response": orjson.Fragment(encoded), "input": input_items})


def _write_large_bodies(conn: sqlite3.Connection, table_rows: list[tuple[str, bytes]]) -> None:
    """Fill in the bodies of rows written with `zeroblob` (see `LARGE_BODY_BYTES`), through SQLite's blob I/O."""
    for response_id, body in table_rows:
        (rowid,) = conn.execute("SELECT rowid FROM responses WHERE id = ?", (response_id,)).fetchone()
        with conn.blobopen("responses", "body", rowid) as blob:
            blob.write(body)


class ResponseStore:
    """Responses by id, scoped by owner; every method is one short SQLite transaction."""

    def __init__(self, db: StateDB, bounds: Bounds, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.bounds = bounds
        # Wall-clock seconds: the stamps are stored and compared by every process sharing the file.
        self.clock = clock

    # ---- writes ------------------------------------------------------------------------------

    def put(
        self,
        response: dict[str, Any],
        *,
        owner: str,
        session_id: str | None,
        input_items: list[dict[str, Any]],
        background: bool = False,
    ) -> bool:
        """Store (or replace) a response; True if it is stored once the bounds have been applied.

        A response too big for `max_bytes` on its own is not stored (and a former version of it is dropped).
        """
        put = Put.of(response, owner=owner, session_id=session_id, input_items=input_items, background=background)
        return self.put_many([put])[0]

    def put_many(self, puts: list[Put]) -> list[bool]:
        """Store a batch of responses in one transaction, the bounds applied once; for each, whether it is stored.

        One commit (and, under `capture_fsync: always`, one sync) for the whole batch: the store's
        writer thread (`stateful.writer`) hands every response that queued up meanwhile here at once.
        """
        now = self.clock()
        rows = []
        oversized = []
        large: dict[str, bytes] = {}  # by id: the body its row ends the batch with, when that is large
        by_owner_items: dict[str, list[tuple[str, str, str]]] = {}
        for put in puts:
            if len(put.body) > self.bounds.max_bytes:
                oversized.append((put.id,))
                continue
            by_owner_items.setdefault(put.owner, []).extend((put.owner, item_id, put.id) for item_id in put.item_ids)
            if len(put.body) >= LARGE_BODY_BYTES:
                large[put.id] = put.body
                body: bytes | int = len(put.body)  # the zeroblob's length; the bytes follow by blob I/O
            else:
                large.pop(put.id, None)  # a later put of the same id replaces it
                body = put.body
            rows.append(
                (put.id, put.owner, put.session_id, put.status, int(put.background), now, now, len(put.body), body)
            )
        # Each key's responses go in, then that key makes room for them (so one key never evicts another's).
        by_owner: dict[str, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_owner.setdefault(row[1], []).append(row)
        with self.db.transaction() as conn:
            if oversized:
                conn.executemany("DELETE FROM responses WHERE id = ?", oversized)
            dropped = self._expire(conn, now)
            for owner, owned in by_owner.items():
                # New ids (nearly all) are one INSERT; replacing keeps the row's age and its events,
                # whose bytes stay counted in its size (a delete would drop them with it).
                if large:  # one by one, in order: a batch may put one id twice
                    for row in owned:
                        conn.execute(_UPSERT_ZEROBLOB if isinstance(row[8], int) else _UPSERT, row)
                else:
                    conn.executemany(_UPSERT, owned)
                conn.executemany(_INDEX_ITEMS, by_owner_items.get(owner, ()))
                dropped |= self._make_room(conn, owner)
            if large:
                _write_large_bodies(conn, [(rid, body) for rid, body in large.items() if rid not in dropped])
        dropped.update(row[0] for row in oversized)
        return [put.id not in dropped for put in puts]

    def update_running(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> bool:
        """Replace a running (background) response's object; False if it is gone (deleted or evicted)."""
        body = _body(response, input_items)
        now = self.clock()
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT size - LENGTH(body), owner FROM responses WHERE id = ?", (response["id"],)
            ).fetchone()
            if row is None:
                return False
            large = len(body) >= LARGE_BODY_BYTES
            conn.execute(
                "UPDATE responses SET status = ?, heartbeat = ?, size = ?, body = "
                + ("zeroblob(?)" if large else "?")
                + " WHERE id = ?",
                (
                    response.get("status") or "completed",
                    now,
                    row[0] + len(body),
                    len(body) if large else body,
                    response["id"],
                ),
            )
            if large:
                _write_large_bodies(conn, [(response["id"], body)])
            conn.executemany(
                _INDEX_ITEMS, [(row[1], item_id, response["id"]) for item_id in item_ids(response, input_items)]
            )
            if response.get("status") not in RUNNING:
                self._expire(conn, now)
                self._make_room(conn, row[1])
            return True

    def append_events(self, response_id: str, events: list[tuple[int, bytes]]) -> None:
        """Keep a background run's stream events (sequence number, SSE frame) for replay."""
        if not events:
            return
        added = sum(len(data) for _, data in events)
        with self.db.transaction() as conn:
            if conn.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone() is None:
                return
            conn.executemany(
                "INSERT OR REPLACE INTO response_events (response_id, seq, data) VALUES (?, ?, ?)",
                [(response_id, seq, data) for seq, data in events],
            )
            conn.execute(
                "UPDATE responses SET size = size + ?, heartbeat = ? WHERE id = ?", (added, self.clock(), response_id)
            )

    def delete(self, response_id: str, owner: str) -> bool:
        with self.db.transaction() as conn:
            gone = conn.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
            return gone.rowcount > 0

    def request_cancel(self, response_id: str, owner: str) -> StoredResponse | None:
        """Flag a running response for cancellation (its runner, in whichever worker, stops it)."""
        with self.db.transaction() as conn:
            conn.execute(
                f"UPDATE responses SET cancel_requested = 1 WHERE id = ? AND owner = ? AND NOT ({_NOT_RUNNING})",
                (response_id, owner),
            )
        return self.get(response_id, owner)

    def _expire(self, conn: sqlite3.Connection, now: float) -> set[str]:
        """Drop the finished responses older than `max_age_s`; their ids."""
        return {
            row[0]
            for row in conn.execute(
                f"DELETE FROM responses WHERE stored_at < ? AND {_NOT_RUNNING} RETURNING id",
                (now - self.bounds.max_age_s,),
            )
        }

    def _make_room(self, conn: sqlite3.Connection, owner: str) -> set[str]:
        """Once `owner` has written: while it is over its key's share or the store over its bounds,
        drop its own oldest finished responses (never another key's). Returns the ids dropped (a
        response just written is among them when its key has nothing older to give up)."""
        bounds = self.bounds
        gone: set[str] = set()
        if bounds.max_count_per_key is not None or bounds.max_bytes_per_key is not None:
            row = conn.execute("SELECT count, bytes FROM totals WHERE name = ?", ("owner " + owner,)).fetchone()
            count, size = row or (0, 0)
            max_count = bounds.max_count_per_key or bounds.max_count
            max_bytes = bounds.max_bytes_per_key or bounds.max_bytes
            gone |= _drop_oldest(conn, owner, count, size, max_count, max_bytes)
        count, size = conn.execute("SELECT count, bytes FROM totals WHERE name = 'responses'").fetchone()
        return gone | _drop_oldest(conn, owner, count, size, bounds.max_count, bounds.max_bytes)

    # ---- reads -------------------------------------------------------------------------------

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        row = (
            self.db.connection()
            .execute(
                "SELECT id, owner, session_id, status, background, cancel_requested, stored_at, heartbeat, body"
                " FROM responses WHERE id = ? AND owner = ?",
                (response_id, owner),
            )
            .fetchone()
        )
        if row is None:
            return None
        body = orjson.loads(row[8])
        return StoredResponse(
            id=row[0],
            owner=row[1],
            session_id=row[2],
            status=row[3],
            background=bool(row[4]),
            cancel_requested=bool(row[5]),
            stored_at=row[6],
            heartbeat=row[7],
            response=body["response"],
            input=body["input"],
        )

    def find_items(
        self, item_ids: list[str], owner: str, max_responses: int = MAX_RESPONSES_READ
    ) -> dict[str, dict[str, Any]] | None:
        """The stored items of `owner`'s responses with these ids (output first, then input), by id;
        missing ids left out. None if they lie in more than `max_responses` stored responses (each
        one read is a whole body parsed: a request may not make the server read a key's whole store)."""
        wanted = set(item_ids)
        carriers: set[str] = set()
        indexed: set[str] = set()
        conn = self.db.connection()
        ordered = list(wanted)
        for start in range(0, len(ordered), _IDS_PER_QUERY):
            chunk = ordered[start : start + _IDS_PER_QUERY]
            for item_id, response_id in conn.execute(
                f"SELECT id, response_id FROM response_items WHERE owner = ? AND id IN ({','.join('?' * len(chunk))})",
                (owner, *chunk),
            ):
                indexed.add(item_id)
                carriers.add(response_id)
        # The rest may be output items named after their response (not indexed): that one, where it is stored.
        named = list({origin for item_id in wanted - indexed if (origin := named_after(item_id)) is not None})
        for start in range(0, len(named), _IDS_PER_QUERY):
            chunk = named[start : start + _IDS_PER_QUERY]
            carriers.update(
                row[0]
                for row in conn.execute(
                    f"SELECT id FROM responses WHERE owner = ? AND id IN ({','.join('?' * len(chunk))})",
                    (owner, *chunk),
                )
            )
        if len(carriers) > max_responses:
            return None
        found: dict[str, dict[str, Any]] = {}
        for response_id in carriers:  # each body parsed once, however many of its items are named
            row = conn.execute("SELECT body FROM responses WHERE id = ? AND owner = ?", (response_id, owner)).fetchone()
            if row is None:  # deleted since
                continue
            body = orjson.loads(row[0])
            output = body["response"].get("output")
            for item in stored_output(output if isinstance(output, list) else []) + body["input"]:
                if isinstance(item, dict) and item.get("id") in wanted and item["id"] not in found:
                    found[item["id"]] = item
        return found

    def cancel_requested(self, response_id: str) -> bool:
        """Whether a running response should stop: flagged, or deleted (on any worker)."""
        row = (
            self.db.connection()
            .execute("SELECT cancel_requested FROM responses WHERE id = ?", (response_id,))
            .fetchone()
        )
        return row is None or bool(row[0])

    def events_after(self, response_id: str, after: int, limit: int = 500) -> list[tuple[int, bytes]]:
        return list(
            self.db.connection().execute(
                "SELECT seq, data FROM response_events WHERE response_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (response_id, after, limit),
            )
        )

    def totals(self) -> tuple[int, int]:
        """(count, bytes) of the stored responses, as the bounds see them."""
        count, size = (
            self.db.connection().execute("SELECT count, bytes FROM totals WHERE name = 'responses'").fetchone()
        )
        return count, size


def _drop_oldest(
    conn: sqlite3.Connection, owner: str, count: int, size: int, max_count: int, max_bytes: int
) -> set[str]:
    """Delete `owner`'s oldest finished responses until `count` and `size` are within bounds."""
    if count <= max_count and size <= max_bytes:
        return set()
    victims: list[tuple[str]] = []
    cursor = conn.execute(
        # Ties (one batch's responses share a time) go in the order written: `rowid`, the last
        # column of every index, so the key's index gives this order without sorting.
        f"SELECT id, size FROM responses WHERE owner = ? AND {_NOT_RUNNING} ORDER BY stored_at, rowid",
        (owner,),
    )
    while count > max_count or size > max_bytes:
        row = cursor.fetchone()
        if row is None:
            break
        victims.append((row[0],))
        count -= 1
        size -= row[1]
    cursor.close()
    conn.executemany("DELETE FROM responses WHERE id = ?", victims)
    return {victim for (victim,) in victims}
