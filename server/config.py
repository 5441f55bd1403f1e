"""Settings: NeMo Gym's switchyard_model field names plus ours, from defaults < YAML < env < flags."""

from __future__ import annotations

import importlib.resources
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

log = logging.getLogger("switchyard_model.config")


def _profiles_dir() -> Path:
    """The shipped deployments: the package `server.profiles` (the repo's top-level profiles/, mapped in
    setup.py), found through importlib.resources so an installed wheel finds them as a checkout does."""
    try:
        return Path(str(importlib.resources.files("server.profiles")))
    except ModuleNotFoundError:  # a checkout run without installing it: the repo's own folder
        return Path(__file__).resolve().parent.parent / "profiles"


PROFILES_DIR = _profiles_dir()

# Gym's base server fields: a Gym YAML carries them, they mean nothing to a standalone server.
_GYM_BASE_FIELDS = {"entrypoint", "name", "domain"}

# Environment variables, as Gym's switchyard_model YAML reads them (`${oc.env:...}`).
ENV_VARS = {
    "switchyard_base_url": "SWITCHYARD_BASE_URL",
    "deployment": "SWITCHYARD_DEPLOYMENT",
    "switchyard_api_key": "SWITCHYARD_API_KEY",
    "condition_dir": "SWITCHYARD_CONDITION_DIR",
    "capture_dir": "SWITCHYARD_MODEL_CAPTURE_DIR",
}


class ConfigError(ValueError):
    """A configuration the server cannot start with; the message is shown to the user as is."""


# The engines token injection can send ids to (`injection_transport`); server.injection.id_fields
# reads this list as its ENGINES.
Engine = Literal["vllm", "sglang", "nemo_rl"]


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- NeMo Gym's switchyard_model fields (same names, same meanings) ---
    switchyard_model: str | None = None  # the route; None = Switchyard's default route
    switchyard_base_url: str | None = None  # attach mode when set
    switchyard_api_key: str = "dummy"
    deployment: str | None = None  # a Switchyard TOML (path or shipped profile name): launch mode
    proxy_port: int | None = Field(default=None, ge=0, le=65535)
    session_id_headers: list[str] = Field(default_factory=lambda: ["x-switchyard-session-id"])
    forward_session_id: bool = True
    extra_body: dict[str, Any] = Field(default_factory=dict)
    default_headers: dict[str, str] = Field(default_factory=dict)
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    condition_dir: str | None = None
    # An attached Switchyard's identity, as its operator states it; copied into the condition manifest.
    proxy_provenance: dict[str, Any] = Field(default_factory=dict)
    # Gym's base model-server key: exact non-model routes that are safe on the training-capture path.
    token_id_capture_non_generating_requests: list[dict[str, str]] = Field(default_factory=list)
    # Gym's global settings (observability_enabled, model_call_capture_dir, token_id_capture), as the
    # Gym entrypoint reads them from Gym's merged config; None when not started by Gym.
    gym: dict[str, Any] | None = None

    # --- ours ---
    host: str = "127.0.0.1"
    # Host names requests may carry besides the bound address and loopback ("*": any); DNS rebinding guard.
    allowed_hosts: list[str] = Field(default_factory=list)
    port: int = Field(default=8080, ge=0, le=65535)  # vLLM itself defaults to 8000
    # Once ready, the bound port is written here (atomically): how a parent learns what port 0 gave.
    port_file: str | None = None
    # Worker processes on one port, sharing one capture directory and one Switchyard (docs/scale-out.md).
    workers: int = Field(default=1, ge=1)
    # Launch a separately installed Switchyard instead of hosting it in-process, e.g.
    # "switchyard-server --config {deployment} --port {port}".
    switchyard_command: str | None = None
    # Worker threads of the Switchyard this server runs (its Tokio runtime); None: up to 4 when hosted
    # in this process, its own default (one per core) when launched. See `server.switchyard.proxy`.
    switchyard_threads: int | None = Field(default=None, ge=1)
    proxy_startup_timeout_s: float = Field(default=240.0, gt=0)
    # Delays before restarting a launched Switchyard that died (the last one repeats).
    proxy_restart_backoff_s: list[float] = Field(default_factory=lambda: [0.5, 1.0, 2.0, 5.0, 10.0, 30.0], min_length=1)
    # How long the upstream may stay silent: each connect, read and write. A stream that keeps
    # sending is never cut; a whole-call deadline is Switchyard's `timeout_ms` (set in profiles).
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    upstream_connect_timeout_s: float = Field(default=10.0, gt=0)
    # Connections to Switchyard per worker; unset: as many as the calls it admits (max_calls_in_flight).
    upstream_max_connections: int | None = Field(default=None, ge=1)
    upstream_api: Literal["chat", "responses"] = "chat"
    # Ask the upstream for token ids / logprobs on correlated calls (needed for capture).
    request_token_ids: bool = True
    # Gym vllm_model's name: put the token triple on generated Responses output items.
    return_token_id_information: bool = False
    # For upstreams that do not stream token ids: call them non-stream and synthesise the stream.
    buffer_upstream_streams: bool = False
    capture: bool = True
    capture_dir: str = "switchyard-captures"
    capture_uncorrelated: bool = False
    # A call without a session id joins the session whose conversation it continues, or starts one
    # (`inferred-<hex>`; docs/capture.md#calls-without-a-session-id). Off: such calls are not recorded.
    session_inference: bool = True
    capture_queue_size: int = Field(default=10000, ge=1)
    # `delta`: each record as what it adds to an earlier record of its session (`<uuid>.delta`, disk
    # grows with the tokens, not the turns); `full`: each record whole, in the plain `<uuid>.json`
    # layout that outside readers of the directory expect. Served the same either way.
    capture_encoding: Literal["full", "delta"] = "full"  # full: the layout outside readers glob
    # With `capture_encoding: full`: write records gzip-compressed (`<uuid>.json.gz`); served the same.
    capture_compress: bool = False
    # Rollout rebuilds (GET /v1/sessions/{id}/rollout) run in this many worker processes, one
    # session each at a time; 0 builds in a thread of the server process. Results are cached.
    rollout_workers: int = Field(default=1, ge=0)
    rollout_cache_mb: int = Field(default=64, ge=0)
    # Token-continuity injection (docs/injection.md): send the engine each session's token history.
    token_injection: bool = False
    injection_transport: Engine = "vllm"
    injection_vllm_field: str = Field(default="kv_transfer_params.prompt_token_ids", min_length=1)
    # Where the engine's /tokenize is (its root). Launch mode derives it from the deployment's target.
    injection_tokenize_base_url: str | None = None
    injection_tokenize_timeout_s: float = Field(default=10.0, gt=0)
    # `renderers`: render templates locally with the [tito] extra instead of asking /tokenize.
    injection_bridge: Literal["tokenize", "renderers"] = "tokenize"
    injection_renderer_model: str | None = None  # the tokenizer/model name the renderers bridge loads
    injection_cache_sessions: int = Field(default=10000, ge=1)
    injection_cache_ttl_s: float = Field(default=3600.0, gt=0)
    injection_mismatch_limit: int = Field(default=3, ge=1)  # K fallbacks in a row pause a route
    injection_pause_s: float = Field(default=300.0, ge=0)
    # How long a call waits for a record another process is still writing (cache misses only).
    injection_rebuild_wait_s: float = Field(default=0.25, ge=0)
    # A call's record is in its file before the last byte of its answer leaves (false: a
    # fire-and-forget hand-off, where a crash loses the records still queued).
    capture_before_answer: bool = True
    # Power-loss durability (a process crash loses nothing under any of them): `always` makes each
    # answer wait for its record's sync; `batch` syncs each window's records at once, after the
    # answers; `never` leaves write-back to the kernel. See docs/operations.md.
    capture_fsync: Literal["always", "batch", "never"] = "batch"
    capture_fsync_window_ms: float = Field(default=10.0, ge=0, le=10_000)
    # Writers name each changed session directory in a change journal, so a read rescans only those;
    # every this many seconds a read still checks every directory (for writers that do not append:
    # an older server, records copied in). 0: check every directory on every read (one stat each).
    capture_index_rescan_s: float = Field(default=30.0, ge=0, le=3600)
    # How long an answer waits for its record at most; past it the call is answered (and counted).
    capture_write_timeout_s: float = Field(default=30.0, gt=0)
    # When a record cannot be written: `serve` answers anyway (counted, logged, the session marked);
    # `refuse` answers correlated calls 503 while capture cannot write, for runs that must lose nothing.
    capture_on_failure: Literal["serve", "refuse"] = "serve"
    # A model call whose session (or parent) id breaks the id rules: `serve` answers it uncorrelated
    # (a response header, a log line and /health say so); `reject` answers 400 naming the header and the rule.
    refused_session_ids: Literal["serve", "reject"] = "serve"
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Request-body bytes one process holds at once, over every call in flight (a 503 beyond; one
    # request always fits on an idle process). Memory follows it: docs/operations.md.
    max_body_bytes_in_flight: int = Field(default=128 * 1024 * 1024, ge=1024)
    # Slow and surplus clients (docs/operations.md#admission), per worker process. A connection must
    # send a request head within http_header_timeout_s of opening or of its previous answer (so it is
    # also the idle keep-alive limit), and the body within request_body_timeout_s (a 408 after). Calls
    # in flight beyond max_calls_in_flight get a 503 with Retry-After; unset, both counts are sized
    # from the open-file limit (server/http/admission.py).
    http_header_timeout_s: float = Field(default=30.0, gt=0)
    request_body_timeout_s: float = Field(default=60.0, gt=0)
    max_calls_in_flight: int | None = Field(default=None, ge=1)
    max_connections_per_worker: int | None = Field(default=None, ge=1)
    # The stateful Responses API (stored responses, previous_response_id, conversations, background
    # runs), kept in <capture_dir>/state.sqlite3. Off: `store` is reported false and those fields get a 400.
    response_store: bool = True
    response_store_max_count: int = Field(default=10000, ge=1)
    response_store_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)
    # Each API key's share of the response store (unset: all of it); a key's writes evict only its own.
    response_store_max_count_per_key: int | None = Field(default=None, ge=1)
    response_store_max_bytes_per_key: int | None = Field(default=None, ge=1024)
    response_store_max_age_s: float = Field(default=30 * 24 * 3600.0, gt=0)  # also conversations' idle limit
    conversation_store_max_count: int = Field(default=10000, ge=1)
    conversation_store_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)
    # Base64 of 32 bytes; unset: a key generated once into <capture_dir>/reasoning-seal.key (0600).
    reasoning_seal_key: str | None = None
    # Background responses running at once, per worker process: in all, and per API key (a 429 beyond).
    background_max_runs: int = Field(default=64, ge=1)
    background_max_runs_per_key: int = Field(default=16, ge=1)
    log_level: str = "info"
    # The HTTP server under the (pure ASGI) app: see docs/benchmarks.md for how the two compare.
    http_server: Literal["uvicorn", "granian"] = "granian"
    # Request `model` → Switchyard route. Unlisted names go to switchyard_model unless strict_models.
    model_aliases: dict[str, str] = Field(default_factory=dict)
    strict_models: bool = False  # unknown model names get a 404 instead of the default route
    # Bearer tokens a client must present on the model endpoints; empty = no auth (loopback default).
    api_keys: list[str] = Field(default_factory=list)
    # The session endpoints expose every prompt: their own keys; empty = the api_keys rule applies.
    session_api_keys: list[str] = Field(default_factory=list)
    # `/metrics` answers without a key (scrapers on a trusted network); by default it takes an api_keys key.
    metrics_open: bool = False
    # Forward the caller's Authorization to Switchyard instead of `Bearer switchyard_api_key`.
    forward_client_authorization: bool = False
    # OpenTelemetry (exporters are configured by the standard OTEL_* variables; see docs/observability.md).
    otel_console: bool = False  # print spans to stdout, for local debugging
    otel_capture_content: bool = False  # put messages on spans (they may hold secrets or personal data)
    # At most this many new traces a second (parent-based: a caller's traceparent decides for its call);
    # above that call rate the traced share falls to otel_traces_per_s / rate. 0 traces every call.
    otel_traces_per_s: float = Field(default=10.0, ge=0)
    otel_service_name: str | None = None  # overrides OTEL_SERVICE_NAME, which a hosted Switchyard also reads
    # Which span carries a call's token usage, so trace backends count it once: "ours" (our CLIENT
    # span), "switchyard" (its model-call span), or "auto": Switchyard's when it is launched by this
    # server and exports to the same traces, else ours. See docs/observability.md.
    otel_token_usage: Literal["auto", "ours", "switchyard"] = "auto"

    @field_validator("session_id_headers")
    @classmethod
    def _header_names_are_tokens(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"session_id_headers: {name!r} is not a valid header name")
        return [n.lower() for n in names]

    @model_validator(mode="after")
    def _needs_a_switchyard(self) -> Settings:
        if not self.switchyard_base_url and not self.deployment:
            raise ValueError(
                "switchyard_model needs either deployment (this server hosts Switchyard from a TOML "
                "deployment) or switchyard_base_url (attach to a Switchyard you run yourself)"
            )
        if self.token_injection:
            if not self.capture or not self.request_token_ids:
                raise ValueError(
                    "token_injection needs capture and request_token_ids on: the records are the chains' source of truth"
                )
            if (
                self.switchyard_base_url
                and not self.injection_tokenize_base_url
                and self.injection_bridge == "tokenize"
                and self.injection_transport != "nemo_rl"  # its engine renders and splices: no /tokenize
            ):
                raise ValueError(
                    "token_injection in attach mode needs injection_tokenize_base_url (the engine's root URL, "
                    "where its /tokenize is), or injection_bridge: renderers"
                )
            if self.injection_bridge == "renderers" and not self.injection_renderer_model:
                raise ValueError("injection_bridge: renderers needs injection_renderer_model (e.g. Qwen/Qwen3-8B)")
        return self

    @property
    def launches_proxy(self) -> bool:
        return not self.switchyard_base_url

    @property
    def mode(self) -> str:
        if not self.launches_proxy:
            return "attach"
        return "launch-process" if self.switchyard_command else "launch-hosted"


def _interpolate_gym_env(value: Any) -> Any:
    """Resolve Gym-style `${oc.env:VAR,default}` in YAML strings, so Gym configs port unchanged."""
    if isinstance(value, dict):
        return {k: _interpolate_gym_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate_gym_env(v) for v in value]
    if not isinstance(value, str):
        return value
    full = re.fullmatch(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}", value.strip())
    if full:
        default = full.group(2)
        resolved = os.environ.get(full.group(1))
        if resolved is not None:
            return resolved
        if default is None or default.strip() == "null":
            return None
        return default.strip()
    return value


interpolate_gym_env = _interpolate_gym_env  # the Gym entrypoint reads its block's values the same way


def _settings_block(doc: Any, path: Path) -> dict[str, Any]:
    """Accept a flat mapping or Gym's `policy_model: responses_api_models: switchyard_model: {...}`."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for instance in doc.values():
        if isinstance(instance, dict) and isinstance(instance.get("responses_api_models"), dict):
            block = instance["responses_api_models"].get("switchyard_model")
            if isinstance(block, dict):
                return dict(block)
    return dict(doc)


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    block: dict[str, Any] = _interpolate_gym_env(_settings_block(doc, path))
    for key in _GYM_BASE_FIELDS & block.keys():
        block.pop(key)
    # Relative deployment paths in a file are relative to that file, not to the cwd.
    dep = block.get("deployment")
    if isinstance(dep, str) and dep and not Path(dep).is_absolute() and (path.parent / dep).exists():
        block["deployment"] = str((path.parent / dep).resolve())
    return block


def load_settings(
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge the sources, later wins: defaults < YAML < environment < explicit overrides (flags)."""
    if environ is None:
        environ = os.environ
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(load_yaml(config_file))
    for field, var in ENV_VARS.items():
        if environ.get(var):
            merged[field] = environ[var]
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    _apply_num_workers(merged)
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from exc
    if settings.switchyard_base_url and settings.deployment:
        log.warning(
            "switchyard_model: both switchyard_base_url and deployment are set. Attaching to %s; the "
            "deployment %s is served by that proxy, not by this server, and is otherwise ignored.",
            settings.switchyard_base_url,
            settings.deployment,
        )
    return settings


def _apply_num_workers(merged: dict[str, Any]) -> None:
    """Gym's `num_workers`: worker processes on one port when attached; refused when hosting, as in Gym."""
    num_workers = merged.pop("num_workers", None)
    if num_workers is None:
        return
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ConfigError("invalid configuration: num_workers: must be a positive integer")
    if num_workers > 1 and not merged.get("switchyard_base_url"):
        raise ConfigError(
            "switchyard_model cannot host the proxy with num_workers > 1: every worker would start its own "
            "proxy, splitting session affinity and stats. Run one proxy yourself and attach all workers "
            "to it with switchyard_base_url."
        )
    merged.setdefault("workers", num_workers)


def server_url(config_file: str | Path | None = None) -> str:
    """Where a client on this machine reaches the server that `serve` runs with these settings
    (defaults < YAML): `http://127.0.0.1:8080` unless the file moves it. A wildcard bind address is
    reached on loopback. Only `host` and `port` are read, so a file meant for `serve` works as is."""
    block = load_yaml(config_file) if config_file else {}
    host = block.get("host") or Settings.model_fields["host"].default
    port = block.get("port", Settings.model_fields["port"].default)
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ConfigError(f"config {config_file}: host must be a string and port a number from 1 to 65535")
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def resolve_deployment(name_or_path: str) -> Path:
    """A path as given, or a bare profile name (`demo`, `vllm`) resolved to the shipped file."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path.resolve()
    if "/" not in name_or_path and not path.suffix:
        shipped = PROFILES_DIR / f"{name_or_path}.toml"
        if shipped.exists():
            return shipped
    raise ConfigError(f"deployment {name_or_path!r} not found (neither a file nor a shipped profile in {PROFILES_DIR})")


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid configuration: " + "; ".join(parts)
