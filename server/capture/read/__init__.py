"""Reading capture back: record files, diff and shared-prompt reads, contiguity, timelines, rollout rebuilds.

Its public surface is its modules (`__all__`): catalog, read and rollout import each other's
modules, so re-exporting names here would turn those imports into cycles through the packages.
"""

__all__ = ["contiguity", "diff_read", "rebuilds", "record_files", "timeline"]
