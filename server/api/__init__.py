"""The HTTP endpoints: the model calls (chat, Responses, Messages) and the read APIs (models, sessions, stored responses, conversations).

Its public surface is its modules (`__all__`), not their names: re-exporting here would import every
endpoint, and with the session routes all of capture's readers, wherever one is needed, while
the app imports the session routes only when capture is on.
"""

__all__ = [
    "call",
    "chat",
    "conversations",
    "messages",
    "models",
    "responses",
    "session_access",
    "session_views",
    "sessions",
    "shared",
    "stored_responses",
]
