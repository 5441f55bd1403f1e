"""Writing capture records durably: the record, the writer thread, group syncs, deltas, the change journal, loss marks.

Its public surface is its modules (`__all__`): catalog, read and rollout take single modules of it
(`record`, `delta`, `marks`); re-exporting names here would load the writer thread's module with each.
"""

__all__ = ["delta", "handoff", "journal", "marks", "record", "writer"]
