"""OpenAI-shaped errors: the exception every layer raises, its JSON body, and the one way it becomes a response.

`OpenAIError` is what a client sees; `error_response` (for Starlette routes and exception handlers)
and `send_error` (for the raw-ASGI endpoints and middleware) are the only places it is turned into
an HTTP answer, in the OpenAI shape or, for Anthropic clients, the Messages API's.

Every exception class of the project, by base, with where it lives:

    Exception
    ├── OpenAIError               server/errors.py                      an error a client sees, with its status
    │   └── SealError             server/stateful/sealing.py            a sealed reasoning item would not open (400)
    ├── ClientGone                server/http/asgi.py                   the client disconnected mid-call
    ├── HTTPError                 server/upstream/http1.py              the upstream connection failed
    │   ├── ConnectError          server/upstream/http1.py              ... could not be made
    │   ├── TimeoutError_         server/upstream/http1.py              ... stayed silent past the read timeout
    │   └── ProtocolError         server/upstream/http1.py              ... closed early, or spoke bad HTTP/1.1
    ├── TokenizeError             server/injection/tokenize.py          the engine's /tokenize gave no usable answer
    ├── StreamCut                 server/dev/mock_upstream/app.py       the mock drops a stream on purpose
    ├── NotFound, Failed          server/cli/session_sources.py         the `sessions` command's own exits
    ├── ValueError
    │   ├── ConfigError           server/config.py                      settings the server cannot start with
    │   ├── RolloutError          server/capture/rollout/messages.py    records that make no trustworthy rollout
    │   ├── DiffFileError         server/capture/read/diff_read.py      a record file this server did not write
    │   ├── InvalidSessionId      server/capture/read/record_files.py   a session id outside the allowed shape
    │   ├── TooBig                server/capture/read/bounded.py        a record file over the size limit
    │   └── NoEndOfTurn           server/injection/histories.py         a re-rendered tail without its end-of-turn token
    ├── LookupError
    │   ├── UnknownRun            server/capture/catalog/runs.py        a run the session does not have
    │   │   └── UnknownDispatch   server/capture/catalog/runs.py        a dispatch the run's records do not have
    │   └── UnknownSession        server/capture/read/record_files.py   (a KeyError) no capture of that session
    └── RuntimeError
        ├── ServerStartError      server/spawn.py                       a child server exited or was not ready in time
        ├── GymCaptureUnavailable server/capture/gym/tokens.py          Gym's token capture cannot run here
        └── RebuildUnavailable    server/capture/read/rebuilds.py       the rebuild worker died
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    # Only for annotations: every layer imports this module, and importing Starlette's responses
    # with it made that import about six times slower (python -X importtime: 22 ms, 140 ms).
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import Send

# The OpenAI `type` that goes with each status this server produces.
_TYPE_FOR_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class OpenAIError(Exception):
    """An error a client should see as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_FOR_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.message!r}, type={self.type!r}, code={self.code!r})"


# The Anthropic Messages API's error `type` for each status (what its SDKs and Claude Code expect).
_ANTHROPIC_TYPE_FOR_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_dict(error: OpenAIError) -> dict[str, Any]:
    """The error as the Messages API shapes it: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ANTHROPIC_TYPE_FOR_STATUS.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def anthropic_error_json(error: OpenAIError) -> bytes:
    return orjson.dumps(anthropic_error_dict(error))


# ---- the error as an HTTP answer ----------------------------------------------------------------


def error_body(error: OpenAIError, *, anthropic: bool = False) -> bytes:
    """The JSON body: the OpenAI shape, or the Messages API's for an Anthropic client."""
    return anthropic_error_json(error) if anthropic else error.to_json()


def error_response(
    error: OpenAIError, *, anthropic: bool = False, headers: Mapping[str, str] | None = None
) -> Response:
    """The error as a Starlette response: its status, its body, its own headers and then `headers`."""
    from starlette.responses import Response

    return Response(
        error_body(error, anthropic=anthropic),
        status_code=error.status,
        media_type="application/json",
        headers={**error.headers, **headers} if headers else error.headers or None,
    )


async def send_error(send: Send, error: OpenAIError, *, anthropic: bool = False) -> None:
    """`error_response` for raw ASGI: the same status, body and headers, sent as two messages."""
    body = error_body(error, anthropic=anthropic)
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": head})
    await send({"type": "http.response.body", "body": body})


Endpoint = Callable[["Request"], Awaitable["Response"]]


def with_error_responses(endpoint: Endpoint) -> Endpoint:
    """The route `endpoint` with an `OpenAIError` it raises answered by `error_response`, so the
    route answers in the OpenAI shape on any Starlette app, whatever its exception handlers."""

    async def answering(request: Request) -> Response:
        try:
            return await endpoint(request)
        except OpenAIError as error:
            return error_response(error)

    return answering
