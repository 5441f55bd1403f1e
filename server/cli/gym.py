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
from typing import Any

import yaml

_GLOBAL_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Gym's global settings this server acts on: its evaluation capture switch and directory, and its
# training-token capture block. They live at the top of Gym's merged config, not in the server's block.
GYM_GLOBAL_KEYS = ("observability_enabled", "model_call_capture_dir", "token_id_capture")


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
    block["gym"] = {key: doc[key] for key in GYM_GLOBAL_KEYS if doc.get(key) is not None}
    block["gym"]["server_name"] = block.get("name") or instance  # the model_ref of Gym's capture records
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
