"""Reading diff record files (`.delta`; `diff` describes the format): each rebuilt once against its base's record.

A session reads in time linear in its files, however long its chain. A record whose base is
missing, damaged or replaced is served marked `is_valid: false` with the reason, never as if whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable
from typing import Any, cast

import orjson
import zstandard

from server.capture.read.bounded import TooBig, unzstd
from server.capture.write.diff import DIFF_SUFFIX
from server.capture.write.record import CaptureRecord, RecordHead, validate_record
from server.ids import is_valid_session_id

_local = threading.local()  # a decompressor per reading thread (they are not shareable between threads)


def _decompress(data: bytes) -> bytes:
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return unzstd(decompressor, data)


class DiffFileError(ValueError):
    """The bytes are not a delta record file this server wrote (torn, foreign, damaged)."""


@dataclasses.dataclass(slots=True)
class DiffFile:
    """A parsed `.delta` file: its header fields, how it refers to its base, and its own fields."""

    header: dict[str, Any]
    meta: dict[str, Any]
    body: dict[str, Any]
    sha256: str

    @property
    def uuid(self) -> str:
        uuid: str = self.header["uuid"]  # checked by parse_diff_file
        return uuid


def parse_header_line(line: bytes) -> dict[str, Any]:
    """Line 1 of a delta file as a dict (raises DiffFileError)."""
    try:
        header = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DiffFileError(f"bad header line: {exc}") from None
    if not isinstance(header, dict):
        raise DiffFileError("header line is not an object")
    return header


def parse_diff_file(data: bytes) -> DiffFile:
    """All of a delta file, its body decompressed (raises DiffFileError for anything torn or foreign)."""
    parts = data.split(b"\n", 2)
    if len(parts) != 3:
        raise DiffFileError("not a delta record file")
    header = parse_header_line(parts[0])
    try:
        meta = orjson.loads(parts[1])
        body = orjson.loads(_decompress(parts[2]))
    except (orjson.JSONDecodeError, zstandard.ZstdError, TooBig) as exc:
        raise DiffFileError(f"damaged delta record: {exc}") from None
    if not (isinstance(meta, dict) and isinstance(body, dict) and isinstance(header.get("uuid"), str)):
        raise DiffFileError("not a delta record file")
    base = meta.get("base")
    if base is not None and not (isinstance(base, str) and isinstance(meta.get("base_sha256"), str)):
        raise DiffFileError("delta record names no usable base")
    return DiffFile(header, meta, body, hashlib.sha256(data).hexdigest())


class Resolver:
    """Rebuilds a session's full records from its files: each diff once, against its base's record.

    `add_full` and `add_diff` take every readable file of the session; `record` then gives each
    file's full record. Bases are looked up by uuid and checked by the sha256 of their file bytes.
    """

    def __init__(self) -> None:
        self._by_uuid: dict[str, list[tuple[str, Any]]] = {}  # uuid -> [(sha256, full record | DiffFile)]
        self._done: dict[int, tuple[dict[str, Any], bool]] = {}  # id(file entry) -> (record, whole)

    def add_full(self, record: CaptureRecord, sha256: str) -> None:
        self._by_uuid.setdefault(record["uuid"], []).append((sha256, record))

    def add_diff(self, diff: DiffFile) -> None:
        self._by_uuid.setdefault(diff.uuid, []).append((diff.sha256, diff))

    def _base_of(self, diff: DiffFile) -> Any | None:
        for sha256, entry in self._by_uuid.get(diff.meta["base"], ()):
            if sha256 == diff.meta["base_sha256"]:
                return entry
        return None

    def record(self, entry: dict[str, Any] | DiffFile) -> dict[str, Any]:
        # A record being rebuilt is a plain dict until `read_with_diffs` has checked it.
        """The full record of one file (a broken diff comes back `is_valid: false`, with why)."""
        if isinstance(entry, dict):
            return entry
        # Walk down to the first resolved (or full) base, then rebuild back up: iterative, as chains
        # are as long as sessions.
        chain: list[DiffFile] = []
        current: Any = entry
        seen: set[int] = set()
        base_record: tuple[dict[str, Any], bool] | None = None
        failure: str | None = None
        while True:
            if isinstance(current, dict):
                base_record = (current, True)
                break
            done = self._done.get(id(current))
            if done is not None:
                base_record = done
                break
            if id(current) in seen:
                failure = "its chain of base records loops"
                break
            seen.add(id(current))
            chain.append(current)
            if current.meta.get("base") is None:
                break
            base = self._base_of(current)
            if base is None:
                failure = f"base record {current.meta['base']} is missing or was changed"
                break
            current = base
        for diff in reversed(chain):
            if failure is not None:
                result = (_broken(diff, failure), False)
                failure = f"base record {diff.uuid} could not be rebuilt"
            elif base_record is not None and not base_record[1]:
                result = (_broken(diff, f"base record {base_record[0]['uuid']} could not be rebuilt"), False)
            else:
                result = _rebuild(diff, base_record[0] if base_record is not None else None)
            self._done[id(diff)] = result
            base_record = result
        return self._done[id(entry)][0]

    def records(self) -> list[dict[str, Any]]:
        return [self.record(entry) for entries in self._by_uuid.values() for _, entry in entries]


def _seq_prefix(base: dict[str, Any], m: int) -> list[Any] | None:
    prompt, generation = base.get("prompt_token_ids"), base.get("generation_token_ids")
    if not isinstance(prompt, list):
        return None
    if m <= len(prompt):
        return prompt[:m]
    if not isinstance(generation, list) or m > len(prompt) + len(generation):
        return None
    return prompt + generation[: m - len(prompt)]


def _rebuild(diff: DiffFile, base: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    meta = diff.meta
    k, m = meta.get("messages", 0), meta.get("prompt_token_ids", 0)
    if base is not None and not (type(k) is int and type(m) is int and k >= 0 and m >= 0):
        return _broken(diff, "its base reference is malformed"), False
    record = dict(diff.header)
    for key, value in diff.body.items():
        if base is not None:
            if key == "messages" and k:
                prior = base.get("messages")
                if not (isinstance(prior, list) and k <= len(prior) and isinstance(value, list)):
                    return _broken(diff, "its base record has fewer messages than it extends"), False
                value = prior[:k] + value
            elif key == "prompt_token_ids" and m:
                prefix = _seq_prefix(base, m)
                if prefix is None or not isinstance(value, list):
                    return _broken(diff, "its base record has fewer token ids than it extends"), False
                value = prefix + value
            elif key == "tools" and meta.get("tools"):
                value = base.get("tools")
        record[key] = value
    return record, True


def _broken(diff: DiffFile, why: str) -> dict[str, Any]:
    """A diff whose base cannot be had: its own fields, no history, and marked unusable for training."""
    record = dict(diff.header)
    for key, value in diff.body.items():
        record[key] = value
    record["messages"] = []
    record["prompt_token_ids"] = None
    if diff.meta.get("tools"):
        record["tools"] = []
    record["is_valid"] = False
    record["invalid_reason"] = f"delta record: {why}"
    return record


def read_with_diffs(
    files: list[str],
    session_id: str,
    *,
    read_bytes: Callable[[str], bytes | None],
    parse_full: Callable[[bytes, str], CaptureRecord | None],
) -> tuple[list[CaptureRecord], int]:
    """A session's records from its files, some of them diffs, and how many files were skipped.

    Each diff is rebuilt once against its base's record; full files (`parse_full`) serve as bases too.
    """
    resolver, skipped = Resolver(), 0
    for path in files:
        data = read_bytes(path)
        if data is None:
            skipped += 1
            continue
        if path.endswith(DIFF_SUFFIX):
            try:
                diff = parse_diff_file(data)
            except DiffFileError:
                skipped += 1
                continue
            if diff.header.get("session_id") != session_id:
                skipped += 1
                continue
            resolver.add_diff(diff)
        else:
            record = parse_full(data, path)
            if record is None or record["session_id"] != session_id:
                skipped += 1
                continue
            resolver.add_full(record, hashlib.sha256(data).hexdigest())
    records: list[CaptureRecord] = []
    for rebuilt in resolver.records():
        if validate_record(rebuilt) is None:
            records.append(cast(CaptureRecord, rebuilt))
        else:
            skipped += 1
    records.sort(key=lambda r: (r.get("captured_at") or "", r.get("uuid") or ""))
    return records, skipped


def diff_header(data: bytes) -> RecordHead | None:
    """A delta file's header fields (its identity: all the index needs), or None if unreadable."""
    try:
        header = parse_diff_file(data).header
    except DiffFileError:
        return None
    if not (
        isinstance(header.get("uuid"), str)
        and is_valid_session_id(header.get("session_id"))
        and isinstance(header.get("captured_at"), str)
    ):
        return None
    return cast(RecordHead, header)  # the line holds a record's leading fields, as a head does
