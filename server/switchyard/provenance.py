"""What condition a run ran under: `switchyard-condition.json` at start, `switchyard-stats.json` at the end, in condition_dir."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from server.files import write_atomic
from server.switchyard.redaction import is_secret_name, redact_assignments, scrub
from server.urls import root_url

log = logging.getLogger("switchyard_model.provenance")

MANIFEST_NAME = "switchyard-condition.json"
STATS_NAME = "switchyard-stats.json"

# Shorter values of secret-named variables are not scrubbed from text by substring: they are not
# realistic credentials, and replacing e.g. every "1" would destroy the record. The exact route for
# interpolated secrets is `RenderedDeployment.redacted_text`, which replaces them whatever their length.
_MIN_SCRUBBED_LEN = 8
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gym_mode(mode: str) -> str:
    """Gym's manifest says `hosted` or `attached`; ours has two ways of hosting."""
    return "attached" if mode in ("attach", "attached") else "hosted"


def redact_deployment(text: str, environ: dict[str, str] | None = None) -> str:
    """A deployment as it may be stored: credential assignments and secret variables' values hidden."""
    text = redact_assignments(text)
    environ = dict(os.environ) if environ is None else environ
    return scrub(text, (v for k, v in environ.items() if is_secret_name(k) and len(v) >= _MIN_SCRUBBED_LEN))


def _write_private_json(path: Path, payload: Any) -> None:
    """Atomically replace `path` with `payload` as JSON, readable by this user only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))


def write_manifest(
    condition_dir: str | Path | None,
    *,
    route: str | None,
    mode: str,
    proxy_root_url: str | None,
    deployment_path: str | Path | None,
    rendered_text: str | None,
    session_id_headers: Sequence[str],
    proxy_provenance: dict[str, Any] | None = None,
) -> Path | None:
    """Write `switchyard-condition.json`; None when there is no condition_dir or the write failed.

    Gym's fields, with Gym's meanings: `deployment_sha256` hashes the deployment file's bytes as
    they are on disk (when hosting), `proxy_provenance` is what the operator of an attached
    Switchyard said it runs (null when hosting or unset). Ours beside them: `rendered_text` is the
    deployment Switchyard loaded (None when attached: this server did not load it); pass
    `RenderedDeployment.redacted_text`, credentials still in it are hidden anyway. It is stored as
    `deployment_toml`, which `deployment_toml_sha256` hashes, so a reader can check the two agree.
    Best-effort: a failure is a logged warning, never an exception (it must not fail startup).
    """
    if not condition_dir:
        return None
    hosted = _gym_mode(mode) == "hosted"
    deployment_toml = None if rendered_text is None else redact_deployment(rendered_text)
    manifest = {
        "route": route,
        "mode": _gym_mode(mode),
        "server_mode": mode,
        "proxy_root_url": root_url(proxy_root_url) if proxy_root_url else None,
        # An attached Switchyard is someone else's build: the local wheel's version would name code
        # that never served a call.
        "nemo_switchyard_version": _version("nemo-switchyard") if hosted else None,
        "switchyard_model_version": _version("switchyard-model"),
        "proxy_provenance": (dict(proxy_provenance) or None) if proxy_provenance and not hosted else None,
        "deployment_path": None if deployment_path is None else str(deployment_path),
        "deployment_sha256": _file_sha256(deployment_path) if hosted else None,
        "deployment_toml": deployment_toml,
        "deployment_toml_sha256": None
        if deployment_toml is None
        else hashlib.sha256(deployment_toml.encode()).hexdigest(),
        "session_id_headers": list(session_id_headers),
        "written_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    path = Path(condition_dir) / MANIFEST_NAME
    try:
        _write_private_json(path, manifest)
    except OSError as exc:
        log.warning("cannot write the condition manifest %s: %s", path, exc.strerror or exc)
        return None
    log.info("condition manifest written to %s", path)
    return path


def _file_sha256(path: str | Path | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        log.warning("cannot hash the deployment %s: %s", path, exc.strerror or exc)
        return None


async def snapshot_stats(
    condition_dir: str | Path | None,
    proxy_url: str | None,
    timeout_s: float = 0.5,
    *,
    mode: str = "attach",
    api_key: str | None = None,
    default_headers: dict[str, str] | None = None,
) -> Path | None:
    """Save Switchyard's `GET {root}/v1/stats` as `switchyard-stats.json`; call it before closing Switchyard.

    In Gym's shape: `{scope, mode, written_at, stats}`, fetched as model calls are (the Bearer key
    and `default_headers`), within half a second by default, since Gym kills its servers about a
    second after asking them to stop. Best-effort: an unreachable proxy, an HTTP error or an
    unwritable directory is a logged warning.
    """
    if not condition_dir or not proxy_url:
        return None
    url = root_url(proxy_url) + "/v1/stats"
    headers = dict(default_headers or {})
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    # An HTTP_PROXY must not intercept a loopback call; a remote Switchyard may need it.
    loopback = urlsplit(url).hostname in _LOOPBACK
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=not loopback) as client:
            response = await asyncio.wait_for(client.get(url, headers=headers), timeout_s)
            response.raise_for_status()
            stats = orjson.loads(response.content)
    except (httpx.HTTPError, orjson.JSONDecodeError, TimeoutError) as exc:
        log.warning("cannot snapshot Switchyard stats from %s: %s", url, str(exc) or type(exc).__name__)
        return None
    hosted = _gym_mode(mode) == "hosted"
    snapshot = {
        # An attached Switchyard counts from its own start, across every run it served.
        "scope": "this run (proxy hosted for exactly this run)" if hosted else "proxy-lifetime aggregate",
        "mode": _gym_mode(mode),
        "written_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "stats": stats,
    }
    path = Path(condition_dir) / STATS_NAME
    try:
        await asyncio.to_thread(_write_private_json, path, snapshot)
    except OSError as exc:
        log.warning("cannot write the stats snapshot %s: %s", path, exc.strerror or exc)
        return None
    log.info("Switchyard stats written to %s", path)
    return path
