"""The stateful Responses API: stored responses, conversations, background runs, sealed reasoning."""

from __future__ import annotations

from server.stateful.context import check_items, expand, open_sealed_reasoning, resolve_references
from server.stateful.items import cursor_page, list_object, normalize_input
from server.stateful.replay import follow
from server.stateful.responses import Put, StoredResponse
from server.stateful.runner import start_background
from server.stateful.sealing import ReasoningSeal, SealError, load_key
from server.stateful.service import Stateful
from server.stateful.turns import Turn

__all__ = [
    "check_items",
    "cursor_page",
    "expand",
    "follow",
    "list_object",
    "load_key",
    "normalize_input",
    "open_sealed_reasoning",
    "Put",
    "ReasoningSeal",
    "resolve_references",
    "SealError",
    "start_background",
    "Stateful",
    "StoredResponse",
    "Turn",
]
