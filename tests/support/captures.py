"""Reading a capture directory from a test the way every reader should: through the store's loader
(records may be delta files that only make sense with their bases), counting what could not be read."""

from __future__ import annotations

from pathlib import Path

from server.capture.store import CaptureStore


def records_in(capture_dir: Path) -> tuple[list[dict], int]:
    """Every record in the directory, rebuilt as the API serves it, and how many files were skipped."""
    store = CaptureStore.open_read_only(capture_dir)
    records, skipped = [], 0
    for session in store.list_sessions(limit=1_000_000):
        found, lost = store.read_completions(session["session_id"])
        records += found
        skipped += lost
    return records, skipped
