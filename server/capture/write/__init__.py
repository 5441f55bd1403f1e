"""Writing capture records durably: the record, the writer thread, group syncs, deltas, the change journal, loss marks."""
