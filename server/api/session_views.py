"""Read endpoints for looking at one session (`routes`): its call timeline with sub-agent tree, and one call's record."""

from __future__ import annotations

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.api.session_access import readable_session, unknown_session
from server.api.sessions import READ_SETTLE_TIMEOUT_S, json_bytes, worker_failed
from server.capture.catalog.index_view import IndexView
from server.capture.read.rebuilds import RebuildUnavailable
from server.capture.read.timeline import build_tree, link_children, lost_session_timeline, timeline_parts
from server.capture.store import UnknownSession, read_session_records
from server.capture.write.record import SCHEMA_VERSION
from server.errors import OpenAIError, with_error_responses
from server.ids import is_valid_session_id

# Built timelines kept (serialised) per session and record count: a page reload or a second tab
# costs nothing, and a 200-call session is read and compared once.
TIMELINE_CACHE_SIZE = 16


@with_error_responses
async def timeline(request: Request) -> Response:
    """A session's call timeline with its sub-agent tree. Its records are read and compared where
    rollouts are rebuilt (the source's worker process), so looking at a long session never holds the
    interpreter that serves calls; without a builder, in a thread."""
    reads, store, session_id = await readable_session(request)
    timelines, lock = reads.timelines, reads.timelines_lock

    def cached() -> tuple[IndexView, tuple[object, ...], bytes | None]:
        store.flush(READ_SETTLE_TIMEOUT_S)
        view = store.index_view()  # one snapshot for every lookup below
        info = view.session_info(session_id)
        if info is None or not info["record_count"]:  # no records: known only from a capture-failure mark
            lost = store.lost_records(session_id)
            if not lost:
                raise unknown_session(session_id)
            body = {**lost_session_timeline(session_id, lost), "schema_version": SCHEMA_VERSION}
            return view, (), orjson.dumps(body)
        key = (session_id, info["record_count"], info["last_captured_at"], tuple(view.children(session_id)))
        with lock:
            if key in timelines:
                timelines.move_to_end(key)
                return view, key, timelines[key]
        return view, key, None

    view, key, data = await run_in_threadpool(cached)
    if data is not None:
        return json_bytes(data)
    builder = reads.source.rollouts
    try:
        if builder is not None:
            body, facts, skipped = await builder.run(timeline_parts, str(store.sessions_dir), session_id)
        else:
            body, facts, skipped = await run_in_threadpool(timeline_parts, str(store.sessions_dir), session_id)
    except UnknownSession:
        raise unknown_session(session_id) from None
    except RebuildUnavailable as exc:
        raise worker_failed(exc) from None
    if body is None or facts is None:
        raise unknown_session(session_id, skipped=skipped)
    cache = reads.summaries

    def finish() -> bytes:
        cache.remember_facts(view, session_id, facts)
        tree = build_tree(store, view, cache, session_id)
        if tree is not None:
            link_children(body, tree)
        body["tree"] = tree
        body["summary"] = cache.summary(store, view, session_id)
        body["schema_version"] = SCHEMA_VERSION
        body["skipped"] = skipped
        data = orjson.dumps(body)
        with lock:
            timelines[key] = data
            while len(timelines) > TIMELINE_CACHE_SIZE:
                timelines.popitem(last=False)
        return data

    return json_bytes(await run_in_threadpool(finish))


@with_error_responses
async def one_call(request: Request) -> Response:
    reads, store, session_id = await readable_session(request)
    record_uuid = request.path_params["uuid"]
    if not is_valid_session_id(record_uuid):  # uuids share the id charset; never used in a path unchecked
        raise _unknown_call(record_uuid)
    await run_in_threadpool(store.flush, READ_SETTLE_TIMEOUT_S)
    builder = reads.source.rollouts
    try:
        # Where rollouts are rebuilt: a long session is tens of MB to parse, never in this interpreter.
        if builder is not None:
            found = await builder.run(one_record, str(store.sessions_dir), session_id, record_uuid)
        else:
            found = await run_in_threadpool(one_record, str(store.sessions_dir), session_id, record_uuid)
    except UnknownSession:
        raise unknown_session(session_id) from None
    except RebuildUnavailable as exc:
        raise worker_failed(exc) from None
    if found is None:
        raise _unknown_call(record_uuid)
    return json_bytes(found)


# What they share is the app's `SessionReads` (`server.api.session_access`).
routes = [
    # `:path`: ids may hold `/`, as on the other session routes.
    Route("/v1/sessions/{session_id:path}/timeline", timeline, methods=["GET"]),
    Route("/v1/sessions/{session_id:path}/completions/{uuid}", one_call, methods=["GET"]),
]


def _unknown_call(record_uuid: str) -> OpenAIError:
    return OpenAIError(404, f"unknown call: {record_uuid[:200]!r}", param="uuid", code="call_not_found")


def one_record(sessions_dir: str, session_id: str, record_uuid: str) -> bytes | None:
    """One call's record of a session, serialised, or None (run in the rollout worker)."""
    records, _ = read_session_records(sessions_dir, session_id)
    for record in records:
        if record.get("uuid") == record_uuid:
            return orjson.dumps(record)
    return None
