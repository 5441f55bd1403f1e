"""The catalog of captured sessions: the session index, session owners, server runs, summaries and session trees.

Its public surface is its modules (`__all__`): catalog, read and rollout import each other's
modules, so re-exporting names here would turn those imports into cycles through the packages.
"""

__all__ = ["index", "index_view", "inferred", "runs", "session_owners", "sessions", "summary"]
