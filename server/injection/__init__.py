"""Token-continuity injection: send the engine each session's canonical token history (docs/injection.md)."""

from __future__ import annotations

from server.injection.id_fields import id_field_for
from server.injection.id_lists import is_id_list
from server.injection.injector import Injector, Plan
from server.injection.renderers_bridge import RendererTokenizer, renderer_factory
from server.injection.setup import build_injector, tokenize_clients
from server.injection.tokenize import TokenizeError, template_options

__all__ = [
    "build_injector",
    "Injector",
    "is_id_list",
    "id_field_for",
    "Plan",
    "renderer_factory",
    "RendererTokenizer",
    "template_options",
    "tokenize_clients",
    "TokenizeError",
]
