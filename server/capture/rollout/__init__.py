"""Rebuild token-exact Gym rollouts (Responses items + token triples) from a session's capture records.

`reconstruct` rebuilds one session, `tree` adds its sub-agent sessions, `items` maps
messages and tools to Gym's shapes, `messages` normalises chat messages for the history comparison.

`__all__` names the re-exported functions and, for what callers take straight from them (the
chains view, the continuation index, the failed-rollout shape, what single records say), the modules
`reconstruct`, `chains`, `continuation`, `items` and `records`: `chains` is read by catalog and read, which this package's modules
import in turn, so re-exporting its names here would be an import cycle through the packages.
"""

from __future__ import annotations

from server.capture.rollout.items import map_tools
from server.capture.rollout.messages import RolloutError
from server.capture.rollout.reconstruct import lost_session_rollout, reconstruct_envelope, reconstruct_session
from server.capture.rollout.tree import reconstruct_tree

__all__ = [
    "RolloutError",
    "reconstruct",
    "chains",
    "continuation",
    "items",
    "records",
    "lost_session_rollout",
    "map_tools",
    "reconstruct_envelope",
    "reconstruct_session",
    "reconstruct_tree",
]
