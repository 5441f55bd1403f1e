"""The model calls' POST paths as the app dispatches them: read from the app, the one list (each handler's `path`)."""

from __future__ import annotations

from functools import cache


@cache
def model_paths() -> tuple[str, ...]:
    """Every path a model call is POSTed to (three APIs, four paths), in the app's order."""
    from server.app import create_app
    from server.config import Settings

    # Nothing starts in create_app (the lifespan does that), so the address is never dialled.
    return tuple(create_app(Settings(switchyard_base_url="http://127.0.0.1:9")).model_handlers)
