"""switchyard-model: an OpenAI-compatible model server in front of a Switchyard routing proxy.

Its public surface is its modules (`__all__`): re-exporting their names here would import the whole
server wherever one small module (`server.ids`, `server.errors`) is needed.
"""

__version__ = "0.1.0"

__all__ = [
    "app",
    "batching",
    "config",
    "errors",
    "files",
    "ids",
    "lifespan",
    "logs",
    "process",
    "request_owner",
    "spawn",
    "state",
    "urls",
]
