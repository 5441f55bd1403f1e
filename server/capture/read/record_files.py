"""The record-file format: a session's record files (`.json`, `.json.gz`, `.delta`) read whole, or by their first block.

Each kind is read two ways: by its header, for the index and the session list, and whole. Those
readers share the header layout and the file checks, so they live together. Needs no store
object: rebuild workers in other processes read a session with just the directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson

from server.capture.catalog.index_view import RecordHeader
from server.capture.read.bounded import TooBig, gunzip, open_regular, read_file
from server.capture.read.diff_read import diff_header, read_with_diffs
from server.capture.read.shared_prompts import SharedPrompts
from server.capture.write.diff import DIFF_SUFFIX
from server.capture.write.record import CaptureRecord, RecordHead, validate_record
from server.ids import is_valid_session_id


class UnknownSession(KeyError):
    """No capture directory exists for this session id."""


class InvalidSessionId(ValueError):
    """The id is outside `^[A-Za-z0-9][A-Za-z0-9._-]*$` or longer than 200 chars; it was not used."""


def session_dir_name(session_id: str) -> str:
    """The directory name for a session: fixed-width hex, so no id can reach outside sessions/."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def check_session_id(session_id: object) -> str:
    """The id itself once it is known safe to use; raises InvalidSessionId otherwise."""
    if not is_valid_session_id(session_id):
        raise InvalidSessionId(f"invalid session id: {str(session_id)[:200]!r}")
    return session_id  # type: ignore[return-value]


def record_key(record: Mapping[str, object]) -> tuple[str, str]:
    """A record's (or a record head's) place in its session: (captured_at, uuid)."""
    captured_at, uuid = record.get("captured_at"), record.get("uuid")
    return (captured_at if isinstance(captured_at, str) else "", uuid if isinstance(uuid, str) else "")


def read_session_records(sessions_dir: str | os.PathLike[str], session_id: str) -> tuple[list[CaptureRecord], int]:
    """A session's records ordered by (captured_at, uuid), and how many files were skipped.

    A file in the directory whose record names another session is not served here, so a crafted
    or colliding record cannot leak into this session. Needs no store object: rebuild workers in
    other processes call it with just the directory.
    """
    check_session_id(session_id)
    directory = os.path.join(sessions_dir, session_dir_name(session_id))
    if os.path.islink(directory) or not os.path.isdir(directory):
        raise UnknownSession(session_id)
    files = record_files(directory)
    prompts = SharedPrompts()  # each record's prompt ids mostly repeat an earlier one's: parse them once

    def parse(data: bytes, path: str) -> CaptureRecord | None:
        return parse_record(data, path, prompts.loads)

    if not any(path.endswith(DIFF_SUFFIX) for path in files):
        records: list[CaptureRecord] = []
        skipped = 0
        for path in files:
            data = read_bytes(path)
            record = None if data is None else parse(data, path)
            if record is None or record["session_id"] != session_id:
                skipped += 1
                continue
            records.append(record)
        records.sort(key=record_key)
        return records, skipped
    return read_with_diffs(files, session_id, read_bytes=read_bytes, parse_full=parse)


def record_files(directory: str) -> list[str]:
    """Paths of the finished record files in a session directory (temp files are hidden, not *.json)."""
    try:
        with os.scandir(directory) as entries:
            return [
                entry.path
                for entry in entries
                if entry.name.endswith((".json", ".json.gz", DIFF_SUFFIX)) and not entry.name.startswith(".")
            ]
    except OSError:
        return []


def header_of(record: RecordHead) -> RecordHeader:
    parent = record.get("parent_session_id")
    if parent == record["session_id"] or not is_valid_session_id(parent):
        parent = None
    run = record.get("server_run")
    return RecordHeader(
        record["session_id"],
        parent,
        record["captured_at"],
        record["uuid"],
        run if isinstance(run, str) else None,
        _source_kind(record.get("session_source"), record.get("rollout_id")),
    )


def _source_kind(source: object, rollout_id: object) -> str | None:
    """How a record's session was named, in one word: `header`, `path`, `body`, `stored` or `inferred`
    (records from before `session_source` existed: `path` when they carry a rollout id, else None)."""
    if isinstance(source, str) and source:
        return source.partition(":")[0]
    return "path" if isinstance(rollout_id, str) and rollout_id else None


def read_header(path: str, dir_name: str) -> RecordHeader | None:
    """What the index needs from one record file; None if unreadable or filed under another session.

    A record this server wrote starts with the header fields in a fixed order, so only its first
    block is read (and its last byte, to see that the file is whole); anything else is parsed whole.
    """
    header = _peek_header(path) if path.endswith((".json", DIFF_SUFFIX)) else None
    if header is None and path.endswith(DIFF_SUFFIX):
        data = read_bytes(path)
        head = diff_header(data) if data is not None else None
        if head is None:
            return None
        header = header_of(head)
    elif header is None:
        record = load_record(path)
        if record is None:
            return None
        header = header_of(record)
    if session_dir_name(header.session_id) != dir_name:
        return None
    return header


# The start of a record as this server writes it (orjson, build_record's key order). Ids and times
# never hold quotes or backslashes, so a string field ends at the next quote.
_HEAD = re.compile(
    rb'\{"schema_version":1,"uuid":"([^"\\]+)","session_id":"([^"\\]+)",'
    rb'"parent_session_id":(?:null|"([^"\\]*)"),"captured_at":"([^"\\]+)",'
    rb'(?:"server_run":(?:null|"([^"\\]*)"),)?'  # absent from records written before runs were recorded
)
HEAD_BYTES = 1024
# Further along the leading fields, where the first block holds them (else they count as absent).
_SOURCE = re.compile(rb',"session_source":"([^"\\]+)"')
_ROLLOUT = re.compile(rb',"rollout_id":"([^"\\]+)"')


def _first_block(path: str) -> tuple[bytes, bytes] | None:
    """A record file's first block and its last byte (to see that the file is whole), or None."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, HEAD_BYTES, 0), (os.pread(fd, 1, size - 1) if size > 0 else b"")
        finally:
            os.close(fd)
    except OSError:
        return None


def _first_line(path: str) -> bytes | None:
    """The header line of a delta file, if its first block holds it whole."""
    block = _first_block(path)
    if block is None:
        return None
    end = block[0].find(b"\n")
    return block[0][:end] if end > 0 else None


def _peek_header(path: str) -> RecordHeader | None:
    """The header fields from a record file's first block, or None to fall back to a full parse."""
    block = _first_block(path)
    if block is None:
        return None
    head, last = block
    if path.endswith(DIFF_SUFFIX):
        # The header line may run past the first block (long ids); its leading fields never do.
        # Where it ends inside the block, it must end as a whole object does.
        end = head.find(b"\n")
        last = head[end - 1 : end] if end > 0 else b"}"
    match = _HEAD.match(head)
    if match is None or last != b"}":
        return None
    uuid, session_id, parent, captured_at, run = (g.decode() if g is not None else None for g in match.groups())
    if not (is_valid_session_id(session_id) and captured_at and uuid):
        return None
    assert session_id is not None and captured_at is not None and uuid is not None
    if parent == session_id or not is_valid_session_id(parent):
        parent = None
    source = _SOURCE.search(head)
    rollout = _ROLLOUT.search(head)
    return RecordHeader(
        session_id,
        parent,
        captured_at,
        uuid,
        run,
        _source_kind(
            source.group(1).decode() if source is not None else None,
            rollout.group(1).decode() if rollout is not None else None,
        ),
    )


# Where the small leading fields of a record end: the `usage` object follows `token_count`.
_HEAD_END = b',"usage":'


def peek_head(path: str) -> RecordHead | None:
    """A record's leading fields up to and including `token_count` from its first block, or None."""
    if path.endswith(DIFF_SUFFIX):
        line = _first_line(path)  # a delta file's header line holds exactly these fields
        if line is None or _HEAD.match(line) is None:
            return None
        try:
            fields = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
    else:
        block = _first_block(path)
        if block is None:
            return None
        head, last = block
        end = head.find(_HEAD_END)
        if last != b"}" or end < 0 or _HEAD.match(head) is None:
            return None
        try:
            fields = orjson.loads(head[:end] + b"}")
        except orjson.JSONDecodeError:
            return None
    if not isinstance(fields, dict):
        return None
    counts = fields.get("token_count")
    if not isinstance(counts, dict) or not all(
        type(counts.get(name)) is int and counts[name] > 0 for name in ("prompt_tokens", "completion_tokens")
    ):
        return None  # the counts fall back to the token id lists, which are not in the first block
    return cast(RecordHead, fields)  # the leading fields of a record this server wrote, counts checked


def read_bytes(path: str) -> bytes | None:
    """A record file's bytes (a regular file, never through a symlink, within the size cap), or None."""
    return read_file(path)


def parse_record(data: bytes, path: str, loads: Callable[[bytes], Any] = orjson.loads) -> CaptureRecord | None:
    """A full record file's bytes as a record, or None for anything torn or foreign."""
    try:
        if path.endswith(".gz"):
            data = gunzip(data)
        record = loads(data)
    except (TooBig, EOFError, zlib.error, orjson.JSONDecodeError):
        return None
    if validate_record(record) is not None:
        return None
    return cast(CaptureRecord, record)


def load_record(path: str) -> CaptureRecord | None:
    """The full record in `path`, or None for anything torn, unreadable, foreign or a symlink."""
    data = read_bytes(path)
    return None if data is None else parse_record(data, path)
