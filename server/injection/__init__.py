"""Token-continuity injection: send the engine each session's canonical token history (docs/injection.md)."""

from __future__ import annotations

from server.injection.ids import is_id_list
from server.injection.injector import Injector, Plan
from server.injection.renderers_bridge import RendererTokenizer, renderer_factory
from server.injection.setup import build_injector, tokenize_clients
from server.injection.tokenize import TokenizeError, template_options
from server.injection.transports import make_transport

__all__ = [
    "build_injector",
    "Injector",
    "is_id_list",
    "make_transport",
    "Plan",
    "renderer_factory",
    "RendererTokenizer",
    "template_options",
    "tokenize_clients",
    "TokenizeError",
]
