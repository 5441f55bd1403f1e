"""NeMo Gym's training-token capture: each training-path call as a Gym `TokenEntry` in Gym's token store (extra `[gym]`).

Gym 0.7 reads a training rollout's tokens from its own store (`TokenSource.freeze`), not from this
server's records. So calls that come on `/ng-rollout/<id>/training-token-capture/...` are written
there too, by Gym's own `nemo_gym.token_id_capture` code, in Gym's order: the parent resolved from
the request items as received and the intent recorded before dispatch; the entry (lineage and
continuation stamped) written once the answer is whole, before its last byte goes out. A call whose
ids are missing or whose write fails marks the rollout incomplete (Gym's functions do both), and a
call that never finishes leaves a dangling intent, which Gym's store reads as incomplete too.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Mapping
from contextvars import Token
from importlib import import_module
from typing import Any

import orjson

from server.capture.gym.lineage import dispatch_safe_file_lineage_store
from server.capture.tokens import token_triple

log = logging.getLogger("switchyard_model.gym_tokens")

# The NeMo Gym release whose capture code and formats this server is tested with.
TESTED_GYM = "0.7"

# The role Gym gives the request envelope (instructions and tools) in the items lineage reads; not a
# dialect role, so it never collides with a turn.
_ENVELOPE_ROLE = "_ng_request_envelope"

# Gym's file lineage resolver as a config names it; built as `dispatch_safe_file_lineage_store`.
_GYMS_FILE_LINEAGE_STORE = "nemo_gym.token_id_capture.lineage:FileLineageStore"


class GymCaptureUnavailable(RuntimeError):
    """Gym's token capture is configured but cannot run here (its package is missing or too old)."""


def _gym() -> Any:
    try:
        from nemo_gym.token_id_capture import sink
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise GymCaptureUnavailable(
            "token_id_capture is enabled but NeMo Gym's capture code is not importable here: install "
            f"switchyard-model with the [gym] extra, or NeMo Gym itself ({TESTED_GYM})"
        ) from exc
    return sink


def check_gym_version() -> str | None:
    """NeMo Gym's installed version; a warning when it is not the release this server is tested with."""
    try:
        version = importlib.metadata.version("nemo-gym")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version != TESTED_GYM and not version.startswith(TESTED_GYM + "."):
        log.warning(
            "NeMo Gym %s is installed; switchyard-model's Gym capture is tested with %s.x. Token entries are "
            "written by Gym's own code, so they match the installed Gym; report anything that breaks.",
            version,
            TESTED_GYM,
        )
    return version


def request_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conversation a request carries, as Gym's model servers hand it to lineage: chat `messages` or
    Responses `input` (a string input has no items), after a pseudo-turn for `instructions` and `tools`,
    which shape the prompt too. Copied, so later edits of the body do not reach lineage."""
    messages = body.get("messages")
    items = messages if isinstance(messages, list) else body.get("input")
    turns = [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
    envelope: list[dict[str, Any]] = []
    instructions, tools = body.get("instructions"), body.get("tools")
    if instructions or tools:
        text = orjson.dumps({"instructions": instructions, "tools": tools}, option=orjson.OPT_SORT_KEYS).decode()
        # Gym writes this with json.dumps(sort_keys=True); the spacing differs, which only matters for
        # a resolver shared with Gym's own servers, never between two calls of this one.
        envelope = [{"role": _ENVELOPE_ROLE, "content": text}]
    normalised: list[dict[str, Any]] = orjson.loads(orjson.dumps(envelope + turns))
    return normalised


def chat_with_gym_tokens(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion with its token triple where Gym reads it: on `choices[0].message`
    (`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`), as Gym's vllm_model answers;
    the engine's top-level and per-choice token fields removed. Unchanged when it has no triple."""
    triple = token_triple(chat)
    choices = chat.get("choices")
    if triple is None or not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return chat
    prompt, generation, log_probs = triple
    out = {k: v for k, v in chat.items() if k not in ("prompt_token_ids", "prompt_logprobs")}
    first = {k: v for k, v in choices[0].items() if k not in ("token_ids", "logprobs")}
    first["message"] = {
        **(first.get("message") or {}),
        "prompt_token_ids": list(prompt),
        "generation_token_ids": list(generation),
        "generation_log_probs": list(log_probs),
    }
    out["choices"] = [first, *choices[1:]]
    return out


def _build(target: str, kwargs: dict[str, Any], protocol: type, kind: str) -> Any:
    """A configured `module.path:ClassName`, built with its kwargs and checked against Gym's protocol.

    Built here rather than by Gym's config helper, which reads a typing attribute that Python 3.11 lacks.
    """
    module_path, colon, class_name = target.partition(":")
    if not colon:
        raise ValueError(f"token_id_capture.{kind} must be 'module.path:ClassName' (got {target!r})")
    try:
        endpoint = getattr(import_module(module_path), class_name)(**kwargs)
    except (ImportError, AttributeError, TypeError) as exc:
        raise ValueError(f"could not build token_id_capture.{kind} {target!r}: {exc}") from exc
    if not isinstance(endpoint, protocol):
        raise ValueError(f"token_id_capture.{kind} {target!r} does not implement Gym's {protocol.__name__}")
    return endpoint


class GymTokenCapture:
    """Gym's token sink and lineage resolver for this process, and the per-call steps around them."""

    def __init__(self, sink: Any, lineage: Any, delta_records: bool, owned: list[Any]) -> None:
        self.sink = sink
        self.lineage = lineage
        self.delta_records = delta_records
        self._owned = owned

    @classmethod
    def from_gym_settings(cls, gym: Mapping[str, Any] | None, workers: int = 1) -> GymTokenCapture | None:
        """Built from Gym's global settings (`token_id_capture`, `model_call_capture_dir`); None when
        Gym's token capture is off. Raises ValueError for a configuration Gym itself would refuse."""
        if (
            not gym
            or not isinstance(gym.get("token_id_capture"), Mapping)
            or not gym["token_id_capture"].get("enabled")
        ):
            return None
        _gym()
        check_gym_version()
        from nemo_gym.token_id_capture.config import TokenIdCaptureConfig
        from nemo_gym.token_id_capture.protocols import LineageResolver, TokenSink
        from nemo_gym.token_id_capture.store import TokenCaptureStore

        config = TokenIdCaptureConfig.model_validate(dict(gym))
        block = config.token_id_capture
        if block.external_staging:
            raise ValueError("token_id_capture.external_staging is not supported by switchyard_model")
        owned: list[Any] = []
        if block.sink is not None:
            sink = _build(block.sink, block.sink_kwargs, TokenSink, "sink")
            owned.append(sink)
        else:
            directory = config.resolved_dir()
            if directory is None:
                raise ValueError(
                    "token_id_capture requires a directory (token_id_capture.dir or model_call_capture_dir)"
                )
            sink = TokenCaptureStore(directory)
            owned.append(sink)
        lineage = None
        if block.lineage_store == _GYMS_FILE_LINEAGE_STORE:
            # Gym's own file resolver, named explicitly: the same one, with its inode-reuse hole closed.
            try:
                lineage = dispatch_safe_file_lineage_store(**block.lineage_store_kwargs)
            except TypeError as exc:
                raise ValueError(
                    f"could not build token_id_capture.lineage_store {block.lineage_store!r}: {exc}"
                ) from exc
            owned.append(lineage)
        elif block.lineage_store is not None:
            lineage = _build(block.lineage_store, block.lineage_store_kwargs, LineageResolver, "lineage_store")
            owned.append(lineage)
        elif isinstance(sink, TokenCaptureStore):
            lineage = dispatch_safe_file_lineage_store(sink.root)
            owned.append(lineage)
        if workers > 1 and (lineage is None or not lineage.is_process_shared()):
            raise ValueError(
                "token_id_capture with several workers requires a process-shared lineage resolver "
                "over the same backend used by the token sink"
            )
        return cls(sink, lineage, block.delta_records, owned)

    async def begin(self, rollout_id: str, model_call_id: str, items: list[dict[str, Any]]) -> Token[Any]:
        """Before dispatch: the call's capture context set (undo with `end`), its parent resolved from
        the items as received (`request_items`), its intent recorded. A failed intent raises: nothing
        was generated yet."""
        sink = _gym()
        context = sink.CaptureContext(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            token_sink=self.sink,
            lineage_store=self.lineage,
            delta_records=self.delta_records,
        )
        token: Token[Any] = sink.set_token_sink(context)
        try:
            await sink.resolve_parent(items)
            await sink.register_call_intent()
        except BaseException:
            sink.reset_token_sink(token)
            raise
        return token

    @staticmethod
    def end(token: Token[Any]) -> None:
        _gym().reset_token_sink(token)

    @staticmethod
    async def commit(served: dict[str, Any], items: list[dict[str, Any]] | None) -> None:
        """The whole answer as Gym's model server holds it (Responses: the triple on one output item;
        chat: on `choices[0].message`) into the sink. Never raises: Gym marks the rollout instead."""
        try:
            await _gym().capture_tokens(served, request_messages=items)
        except Exception:  # Gym's function guards itself; a surprise must not fail the call either
            log.exception("Gym token capture failed")

    async def close(self) -> None:
        for endpoint in self._owned:
            try:
                await endpoint.close()
            except Exception:
                log.warning("closing Gym's token capture endpoint failed", exc_info=True)
