"""The conversation store: conversations, their ordered items and metadata, scoped by owner.

A response run with `conversation` reads all items first and appends its turn (new input, then
output) in one transaction when it completes. Bounded like the response store: conversations
untouched for `max_age_s` expire, then the least recently used go until the count and item-byte
limits hold. Blocking (SQLite): call from a worker thread.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import orjson

from server.stateful.db import StateDB
from server.stateful.items import new_id
from server.stateful.responses import Bounds


def conversation_object(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"id": row[0], "object": "conversation", "created_at": row[1], "metadata": orjson.loads(row[2])}


class ConversationStore:
    def __init__(self, db: StateDB, bounds: Bounds) -> None:
        self.db = db
        self.bounds = bounds

    # ---- conversations -------------------------------------------------------------------------

    def create(self, owner: str, metadata: dict[str, str], items: list[dict[str, Any]]) -> dict[str, Any]:
        conversation_id = new_id("conv")
        now = time.time()
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO conversations (id, owner, created_at, updated_at, metadata) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, owner, int(now), now, orjson.dumps(metadata)),
            )
            self._append(conn, conversation_id, items)
            self._evict(conn, now, keep=conversation_id, owner=owner)
        return {"id": conversation_id, "object": "conversation", "created_at": int(now), "metadata": metadata}

    def get(self, conversation_id: str, owner: str) -> dict[str, Any] | None:
        row = (
            self.db.connection()
            .execute(
                "SELECT id, created_at, metadata FROM conversations WHERE id = ? AND owner = ?",
                (conversation_id, owner),
            )
            .fetchone()
        )
        return conversation_object(row) if row else None

    def update_metadata(self, conversation_id: str, owner: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        with self.db.transaction() as conn:
            changed = conn.execute(
                "UPDATE conversations SET metadata = ?, updated_at = ? WHERE id = ? AND owner = ?",
                (orjson.dumps(metadata), time.time(), conversation_id, owner),
            )
            if changed.rowcount == 0:
                return None
        return self.get(conversation_id, owner)

    def delete(self, conversation_id: str, owner: str) -> bool:
        with self.db.transaction() as conn:
            return (
                conn.execute("DELETE FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)).rowcount
                > 0
            )

    # ---- items ---------------------------------------------------------------------------------

    def items(self, conversation_id: str, owner: str) -> list[dict[str, Any]] | None:
        """All items in order, or None if there is no such conversation (for this owner)."""
        conn = self.db.connection()
        # One read transaction: the conversation and its items as of one moment.
        conn.execute("BEGIN")
        try:
            if not self._owned(conn, conversation_id, owner):
                return None
            rows = conn.execute(
                "SELECT data FROM conversation_items WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        return [orjson.loads(row[0]) for row in rows]

    def add_items(self, conversation_id: str, owner: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Append items (ids made unique within the conversation); None if there is no such conversation."""
        now = time.time()
        with self.db.transaction() as conn:
            if not self._owned(conn, conversation_id, owner):
                return None
            added = self._append(conn, conversation_id, items)
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            self._evict(conn, now, keep=conversation_id, owner=owner)
        return added

    def get_item(self, conversation_id: str, owner: str, item_id: str) -> tuple[bool, dict[str, Any] | None]:
        """(conversation exists, the item or None)."""
        conn = self.db.connection()
        if not self._owned(conn, conversation_id, owner):
            return False, None
        row = conn.execute(
            "SELECT data FROM conversation_items WHERE conversation_id = ? AND id = ?", (conversation_id, item_id)
        ).fetchone()
        return True, orjson.loads(row[0]) if row else None

    def find_items(self, item_ids: list[str], owner: str) -> dict[str, dict[str, Any]]:
        """Items of `owner`'s conversations with these ids, by id (the most recently added where several
        conversations hold one id); missing ids left out."""
        conn = self.db.connection()
        found: dict[str, dict[str, Any]] = {}
        for item_id in dict.fromkeys(item_ids):
            row = conn.execute(
                "SELECT ci.data FROM conversation_items ci JOIN conversations c ON c.id = ci.conversation_id"
                " WHERE ci.id = ? AND c.owner = ? ORDER BY c.updated_at DESC LIMIT 1",
                (item_id, owner),
            ).fetchone()
            if row is not None:
                found[item_id] = orjson.loads(row[0])
        return found

    def delete_item(self, conversation_id: str, owner: str, item_id: str) -> tuple[bool, bool]:
        """(conversation exists, the item was there and is gone)."""
        with self.db.transaction() as conn:
            if not self._owned(conn, conversation_id, owner):
                return False, False
            gone = conn.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ?", (conversation_id, item_id)
            ).rowcount
            if gone:
                conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))
        return True, gone > 0

    def totals(self) -> tuple[int, int]:
        """(conversation count, item bytes)."""
        count, size = (
            self.db.connection().execute("SELECT count, bytes FROM totals WHERE name = 'conversations'").fetchone()
        )
        return count, size

    # ---- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _owned(conn: sqlite3.Connection, conversation_id: str, owner: str) -> bool:
        return (
            conn.execute("SELECT 1 FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)).fetchone()
            is not None
        )

    @staticmethod
    def _append(conn: sqlite3.Connection, conversation_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seq = conn.execute(
            "SELECT COALESCE(MAX(seq), -1) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()[0]
        taken = {
            row[0]
            for row in conn.execute("SELECT id FROM conversation_items WHERE conversation_id = ?", (conversation_id,))
        }
        added = []
        rows = []
        for item in items:
            if item.get("id") in taken:  # e.g. an output item a client sent back: keep both, apart
                item = {**item, "id": new_id(str(item["id"]).split("_", 1)[0] or "item")}
            taken.add(item["id"])
            seq += 1
            data = orjson.dumps(item)
            rows.append((conversation_id, seq, item["id"], len(data), data))
            added.append(item)
        conn.executemany(
            "INSERT INTO conversation_items (conversation_id, seq, id, size, data) VALUES (?, ?, ?, ?, ?)", rows
        )
        return added

    def _evict(self, conn: sqlite3.Connection, now: float, keep: str, owner: str) -> None:
        """Expire, then drop the writing key's least recently used conversations (never another key's,
        never the one just written)."""
        bounds = self.bounds
        conn.execute("DELETE FROM conversations WHERE updated_at < ? AND id != ?", (now - bounds.max_age_s, keep))
        count, size = conn.execute("SELECT count, bytes FROM totals WHERE name = 'conversations'").fetchone()
        if count <= bounds.max_count and size <= bounds.max_bytes:
            return
        victims = []
        cursor = conn.execute(
            "SELECT id FROM conversations WHERE id != ? AND owner = ? ORDER BY updated_at, id", (keep, owner)
        )
        while count > bounds.max_count or size > bounds.max_bytes:
            row = cursor.fetchone()
            if row is None:
                break
            freed = conn.execute(
                "SELECT COALESCE(SUM(size), 0) FROM conversation_items WHERE conversation_id = ?", (row[0],)
            ).fetchone()[0]
            victims.append((row[0],))
            count -= 1
            size -= freed
        cursor.close()
        conn.executemany("DELETE FROM conversations WHERE id = ?", victims)
