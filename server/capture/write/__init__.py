"""Writing capture records durably: the record, the writer thread, group syncs, diffs, the change journal, loss marks.

Its public surface is its modules (`__all__`): `handoff` imports read's store, which imports this
package's modules, so re-exporting names here would be an import cycle through the packages.
"""

__all__ = ["diff", "handoff", "journal", "marks", "record", "writer"]
