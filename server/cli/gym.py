"""Run this server as a NeMo Gym model server: read Gym's launch environment and global settings, then `serve`.

Gym starts each server as `NEMO_GYM_CONFIG_DICT=<merged YAML> NEMO_GYM_CONFIG_PATH=<instance> python
app.py` in the server's directory. The drop-in `profiles/gym/responses_api_models/switchyard_model/`
is such a directory (`switchyard-model gym-dir` writes one Gym can install); its app.py calls
`main()` here.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from server.config import interpolate_gym_env

_GLOBAL_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Gym's global settings this server acts on: its evaluation capture switch and directory, its
# training-token capture block, and where its servers write run artifacts (`results_dir`, set by Gym's
# launcher, absolute). They live at the top of Gym's merged config, not in the server's block.
GYM_GLOBAL_KEYS = ("observability_enabled", "model_call_capture_dir", "token_id_capture", "results_dir")

# This server's capture folder under Gym: in Gym's model-call capture directory, else in its results.
CAPTURE_SUBDIR = "switchyard-captures"


def _resolve_references(value: Any, doc: dict[str, Any]) -> Any:
    """`${key}` inside a string, where `key` is a top-level scalar of Gym's merged config (Gym hands its
    config over with interpolations unresolved, e.g. `${results_dir}/model-calls`)."""
    if isinstance(value, dict):
        return {k: _resolve_references(v, doc) for k, v in value.items()}
    if not isinstance(value, str):
        return value

    def scalar(match: re.Match[str]) -> str:
        found = doc.get(match.group(1))
        return str(found) if found is not None and not isinstance(found, (dict, list)) else match.group(0)

    return _GLOBAL_REFERENCE.sub(scalar, value)


def capture_dir_under_gym(capture_dir: Any, gym: dict[str, Any]) -> str | None:
    """Where this server captures when Gym starts it: an absolute `capture_dir` as given; a relative one
    under Gym's `results_dir`; unset, `<model_call_capture_dir>/switchyard-captures` or else
    `<results_dir>/switchyard-captures`, so captures sit with the run's other outputs rather than in
    the server's directory. None when Gym gave neither directory (the server's default applies)."""
    results = gym.get("results_dir")
    if capture_dir:
        if Path(str(capture_dir)).is_absolute() or not results:
            return str(capture_dir)
        return str(Path(results) / str(capture_dir))
    calls = gym.get("model_call_capture_dir")
    if calls:
        return str(Path(calls) / CAPTURE_SUBDIR)
    if results:
        return str(Path(results) / CAPTURE_SUBDIR)
    return None


def instance_block(config_yaml: str, instance: str) -> dict[str, Any]:
    """The `<instance>: responses_api_models: switchyard_model: {...}` block of Gym's merged config.

    A value that is exactly `${key}` naming a top-level key of the merged config (Gym's
    `switchyard_model: ${policy_model_name}`) is resolved here, in case Gym passed it unresolved.
    """
    doc = yaml.safe_load(config_yaml) or {}
    try:
        block = dict(doc[instance]["responses_api_models"]["switchyard_model"])
    except (KeyError, TypeError) as exc:
        raise SystemExit(
            f"switchyard_model: no {instance}.responses_api_models.switchyard_model in NEMO_GYM_CONFIG_DICT"
        ) from exc
    for key, value in block.items():
        match = _GLOBAL_REFERENCE.fullmatch(value) if isinstance(value, str) else None
        if match and match.group(1) in doc and not isinstance(doc[match.group(1)], dict):
            block[key] = doc[match.group(1)]
    block["gym"] = {key: _resolve_references(doc[key], doc) for key in GYM_GLOBAL_KEYS if doc.get(key) is not None}
    block["gym"]["server_name"] = block.get("name") or instance  # the model_ref of Gym's capture records
    capture_dir = capture_dir_under_gym(interpolate_gym_env(block.get("capture_dir")), block["gym"])
    if capture_dir is not None:
        block["capture_dir"] = capture_dir
    return {instance: {"responses_api_models": {"switchyard_model": block}}}


def correlation_problem(block: dict[str, Any]) -> tuple[str, bool] | None:
    """Gym's startup check: with `forward_session_id` on but neither evaluation nor training capture
    enabled, Gym's agents send no `/ng-rollout/<id>` prefix, so no session id reaches Switchyard.
    Returns the message and whether it is fatal (the setting was explicit), or None when all is well."""
    if not block.get("forward_session_id", True):
        return None
    gym = block.get("gym") or {}
    token_capture = gym.get("token_id_capture")
    if gym.get("observability_enabled") or (isinstance(token_capture, dict) and token_capture.get("enabled")):
        return None
    message = (
        "switchyard_model: forward_session_id is on, yet Gym has neither observability_enabled nor "
        "token_id_capture.enabled set, so its agents call without the /ng-rollout/<id> prefix and "
        "Switchyard gets no session id. Turn one of them on (e.g. ++observability_enabled=true) to tie "
        "calls to rollouts, or set forward_session_id: false to route without sessions."
    )
    return message, "forward_session_id" in block


def main() -> int:
    config_yaml = os.environ.get("NEMO_GYM_CONFIG_DICT")
    instance = os.environ.get("NEMO_GYM_CONFIG_PATH")
    if not config_yaml or not instance:
        print(
            "switchyard_model: NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH must be set (Gym sets them)",
            file=sys.stderr,
        )
        return 2
    block = instance_block(config_yaml, instance)
    from server.cli.gym_console import gym_console

    with gym_console(block[instance]["responses_api_models"]["switchyard_model"]["gym"]["server_name"]):
        return _serve(block, instance)


def _serve(block: dict[str, Any], instance: str) -> int:
    problem = correlation_problem(block[instance]["responses_api_models"]["switchyard_model"])
    if problem is not None:
        message, fatal = problem
        print(message, file=sys.stderr)
        if fatal:
            return 2
    # The settings file holds the Gym block only (not the whole merged config, which has secrets of
    # other servers), privately.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="switchyard-model-gym-", delete=False) as fh:
        os.chmod(fh.name, 0o600)
        yaml.safe_dump(block, fh)
    from server.cli.main import main as cli_main

    try:
        return cli_main(["serve", "--config", fh.name])
    finally:
        os.unlink(fh.name)


if __name__ == "__main__":
    sys.exit(main())
