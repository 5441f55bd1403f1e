"""The /v1/sessions HTTP API (`routes`): list captured sessions, their records, trees and reconstructed rollouts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from server.api.cursor import limit_param
from server.api.session_access import (
    ReadableSession,
    capture_store,
    readable_session,
    session_reads,
    unknown_session,
)
from server.capture.catalog.index_view import IndexView
from server.capture.catalog.runs import (
    ALL,
    LATEST,
    UnknownDispatch,
    UnknownRun,
    format_time,
    parse_dispatch,
    parse_run,
    parse_time,
    with_dispatch,
)
from server.capture.catalog.sessions import build_tree, lost_session_envelope, lost_session_node
from server.capture.catalog.summary import KINDS, STATUSES, ListQuery, list_page
from server.capture.read.rebuilds import CHAINS, RebuildUnavailable, SessionBody, SpooledBody
from server.capture.rollout import RolloutError, lost_session_rollout
from server.capture.rollout.chains import lost_session_chains
from server.capture.store import UnknownSession
from server.capture.write.record import SCHEMA_VERSION
from server.errors import OpenAIError, with_error_responses
from server.ids import is_valid_session_id

DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10000
# Reads first wait (this long at most) for records already queued, so a trainer that asks right
# after its rollout's last call returned still sees that call.
READ_SETTLE_TIMEOUT_S = 5.0

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


@with_error_responses
async def list_sessions(request: Request) -> Response:
    store = capture_store(request)
    reads = session_reads(request)
    query = request.query_params
    after = _optional_id(query.get("after"), "after")
    limit = limit_param(query.get("limit"), default=DEFAULT_LIST_LIMIT, maximum=MAX_LIST_LIMIT, code="invalid_request")
    filters = _list_query(query)
    filters = replace(filters, visible=reads.access.visible(request, store))

    def page() -> bytes:
        store.flush(READ_SETTLE_TIMEOUT_S)
        sessions, next_after = list_page(store, reads.summaries, filters, limit=limit, after=after)
        return orjson.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "sessions": sessions,
                "has_more": next_after is not None,
                "next_after": next_after,
            }
        )

    return json_bytes(await run_in_threadpool(page))


@with_error_responses
async def completions(request: Request) -> Response:
    reads, store, session_id = await readable_session(request)

    def settle() -> int:
        store.flush(READ_SETTLE_TIMEOUT_S)
        return store.lost_records(session_id)

    lost = await run_in_threadpool(settle)
    try:
        # Parsed and serialised where rollouts are rebuilt: a long session's records are tens of MB.
        body = await reads.rollout_builder(store).completions(session_id, lost)
    except UnknownSession:
        body = 0
    except RebuildUnavailable as exc:
        raise worker_failed(exc) from None
    if isinstance(body, int):
        if lost:  # every record lost to capture failures: the session ran, and says so
            return json_bytes(orjson.dumps(lost_session_envelope(session_id, lost, skipped=body)))
        raise _unknown(session_id, skipped=body)
    return _body_response(body)


@with_error_responses
async def tree(request: Request) -> Response:
    _, store, session_id = await readable_session(request)
    run = run_param(request, default=ALL)

    def build() -> bytes:
        store.flush(READ_SETTLE_TIMEOUT_S)
        try:
            tree: dict[str, Any] | None = build_tree(store, session_id, run=run)
        except UnknownSession:
            tree = None
        except UnknownDispatch:
            raise _unknown_dispatch(session_id, request) from None
        except UnknownRun:
            raise _unknown_run(session_id, run) from None
        if tree is None or not tree["record_count"]:  # no records: known only from a capture-failure mark
            lost = store.lost_records(session_id)
            if not lost:
                raise _unknown(session_id)
            tree = lost_session_node(session_id, lost)
        return orjson.dumps(tree)

    return json_bytes(await run_in_threadpool(build))


async def _rebuilt(request: Request, session: ReadableSession, run: str, **options: Any) -> SessionBody:
    """The session's rollout (or `view=CHAINS`, its chains) as rebuilt off the serving process;
    `UnknownSession` is left to the caller, which knows what a session without records means."""
    reads, store, session_id = session

    def snapshot() -> IndexView:
        store.flush(READ_SETTLE_TIMEOUT_S)
        return store.index_view()

    index = await run_in_threadpool(snapshot)
    try:
        return await reads.rollout_builder(store).rollout(
            index, session_id, lost_records=store.lost_records, run=run, **options
        )
    except UnknownDispatch:
        raise _unknown_dispatch(session_id, request) from None
    except UnknownRun:
        raise _unknown_run(session_id, run) from None
    except RolloutError as exc:
        raise OpenAIError(422, str(exc), code="rollout_reconstruction_failed") from None
    except RebuildUnavailable as exc:
        raise worker_failed(exc) from None


@with_error_responses
async def rollout(request: Request) -> Response:
    session = await readable_session(request)
    store, session_id = session.store, session.session_id
    allow_partial = _bool_param(request.query_params.get("allow_partial"), "allow_partial", default=True)
    run = run_param(request, default=LATEST)
    try:
        body = await _rebuilt(request, session, run, allow_partial=allow_partial)
    except UnknownSession:
        lost = await run_in_threadpool(store.lost_records, session_id)
        if not lost:
            raise _unknown(session_id) from None
        try:  # every record lost to capture failures: an empty rollout, masked, capture_failed
            body = orjson.dumps(lost_session_rollout(session_id, lost, allow_partial))
        except RolloutError as exc:
            raise OpenAIError(422, str(exc), code="rollout_reconstruction_failed") from None
    return _body_response(body)


@with_error_responses
async def chains(request: Request) -> Response:
    """Every captured call in a token-contiguous chain: the session split at each break."""
    session = await readable_session(request)
    store, session_id = session.store, session.session_id
    try:
        body = await _rebuilt(request, session, run_param(request, default=LATEST), view=CHAINS)
    except UnknownSession:
        lost = await run_in_threadpool(store.lost_records, session_id)
        if not lost:
            raise _unknown(session_id) from None
        body = orjson.dumps(lost_session_chains(session_id, lost))  # every record lost: no chains, masked
    return _body_response(body)


@with_error_responses
async def delete_session(request: Request) -> Response:
    _, store, session_id = await readable_session(request)

    def remove() -> int:
        store.flush(READ_SETTLE_TIMEOUT_S)  # so records queued for the session go too
        try:
            return store.delete_session(session_id)
        except UnknownSession:
            raise _unknown(session_id) from None

    count = await run_in_threadpool(remove)
    return json_bytes(orjson.dumps({"deleted": True, "session_id": session_id, "records": count}))


# What they share is the app's `SessionReads` (`server.api.session_access`).
# `:path`: a session id may hold `/` (sent percent-encoded; the server decodes it before routing).
# The suffix routes come first, so `/v1/sessions/a/b/tree` is the tree of `a/b`.
routes = [
    Route("/v1/sessions", list_sessions, methods=["GET"]),
    Route("/v1/sessions/{session_id:path}/completions", completions, methods=["GET"]),
    Route("/v1/sessions/{session_id:path}/tree", tree, methods=["GET"]),
    Route("/v1/sessions/{session_id:path}/rollout", rollout, methods=["GET"]),
    Route("/v1/sessions/{session_id:path}/chains", chains, methods=["GET"]),
    Route("/v1/sessions/{session_id:path}", delete_session, methods=["DELETE"]),
]


def json_bytes(body: bytes, status: int = 200) -> Response:
    """A JSON body already serialised, as a response."""
    return Response(body, status_code=status, media_type="application/json")


class _SpooledResponse(FileResponse):
    """A spooled body sent as the file it is: by the HTTP server itself where it offers ASGI's
    pathsend (granian: no byte of it passes through the GIL), else read in pieces in a thread."""

    def __init__(self, body: SpooledBody) -> None:
        super().__init__(body.path, media_type="application/json", stat_result=body.stat)
        self.spooled = body  # the file stays while the response may still open it


def _body_response(body: SessionBody) -> Response:
    return _SpooledResponse(body) if isinstance(body, SpooledBody) else json_bytes(body)


def worker_failed(exc: RebuildUnavailable) -> OpenAIError:
    """The 503 for a read whose worker process died (the next request starts a fresh one)."""
    return OpenAIError(503, str(exc), type="server_error", code="rollout_worker_failed")


_unknown = unknown_session


def run_param(request: Request, *, default: str) -> str:
    """The `run` query parameter (`latest`, `all`, `legacy` or a run id) with the `dispatch` one
    (`latest` or a number from 1), as one value for the views (`runs.with_dispatch`); a 400 naming
    the parameter otherwise. `run=all` is every record unsplit, unless a dispatch is named."""
    value = request.query_params.get("run")
    try:
        run = parse_run(value) if value else default
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="run", code="invalid_request") from None
    try:
        dispatch = parse_dispatch(request.query_params.get("dispatch"))
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="dispatch", code="invalid_request") from None
    return with_dispatch(run, dispatch)


def _unknown_dispatch(session_id: str, request: Request) -> OpenAIError:
    return OpenAIError(
        404,
        f"session {session_id[:200]!r} has no dispatch {request.query_params.get('dispatch', '')[:20]!r}"
        " (its summary lists its `dispatches`)",
        param="dispatch",
        code="dispatch_not_found",
    )


def _unknown_run(session_id: str, run: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"session {session_id[:200]!r} has no records from server run {run.partition('#')[0]!r}",
        param="run",
        code="run_not_found",
    )


def _optional_id(value: str | None, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not is_valid_session_id(value):
        raise OpenAIError(400, f"{name} is not a valid session id", param=name, code="invalid_request")
    return value


def _list_query(query: Mapping[str, str]) -> ListQuery:
    """The list's filters, each checked: a bad value is a 400 naming it, never silently ignored."""
    roots_only = _bool_param(query.get("roots_only"), "roots_only", default=False)
    kind = _choice_param(query.get("kind"), "kind", KINDS)
    if roots_only:
        if kind == "child":
            raise OpenAIError(400, "roots_only=true contradicts kind=child", param="kind", code="invalid_request")
        kind = "root"
    return ListQuery(
        parent=_optional_id(query.get("parent"), "parent"),
        kind=kind,
        q=_text_param(query.get("q"), "q"),
        since=_time_param(query.get("since"), "since"),
        until=_time_param(query.get("until"), "until"),
        model=_text_param(query.get("model"), "model"),
        route=_text_param(query.get("route"), "route"),
        status=_choice_param(query.get("status"), "status", STATUSES),
        summary=_bool_param(query.get("summary"), "summary", default=False),
    )


def _text_param(value: str | None, name: str) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > 200:
        raise OpenAIError(400, f"{name} is longer than 200 characters", param=name, code="invalid_request")
    return value


def _choice_param(value: str | None, name: str, choices: tuple[str, ...]) -> str | None:
    if value is None or value == "":
        return None
    if value not in choices:
        raise OpenAIError(400, f"{name} must be one of {', '.join(choices)}", param=name, code="invalid_request")
    return value


def _time_param(value: str | None, name: str) -> str | None:
    if value is None or value == "":
        return None
    moment = parse_time(value)
    if moment is None:
        raise OpenAIError(400, f"{name} must be an ISO 8601 time", param=name, code="invalid_request")
    return format_time(moment)


def _bool_param(value: str | None, name: str, *, default: bool) -> bool:
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise OpenAIError(400, f"{name} must be true or false", param=name, code="invalid_request")
