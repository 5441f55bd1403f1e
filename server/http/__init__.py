"""The HTTP layer under the endpoints: raw-ASGI helpers, the request-body budget, admission, the server-sent-events format, and the HTTP servers that run the app."""

from __future__ import annotations

from server.http import sse
from server.http.admission import Admission, limits
from server.http.asgi import SSE_HEADERS, ClientGone, parse_json_object, read_body, run_until_disconnect, send_json
from server.http.budget import BodyBudget
from server.http.servers import ConnectionLimits, serve
from server.http.sse import responses_error_event

__all__ = [
    "Admission",
    "BodyBudget",
    "ClientGone",
    "ConnectionLimits",
    "limits",
    "parse_json_object",
    "read_body",
    "responses_error_event",
    "run_until_disconnect",
    "send_json",
    "serve",
    "sse",
    "SSE_HEADERS",
]
