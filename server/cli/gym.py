"""Run this server as a NeMo Gym model server: read Gym's launch environment, then `serve`.

Gym starts each server as `NEMO_GYM_CONFIG_DICT=<merged YAML> NEMO_GYM_CONFIG_PATH=<instance> python
app.py` in the server's directory. The drop-in `profiles/gym/responses_api_models/switchyard_model/`
is such a directory; its app.py calls `main()` here.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

import yaml

from server.cli.main import main as cli_main

_GLOBAL_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def instance_block(config_yaml: str, instance: str) -> dict:
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
    return {instance: {"responses_api_models": {"switchyard_model": block}}}


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
    # The settings file holds the Gym block only (not the whole merged config, which has secrets of
    # other servers), privately.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="switchyard-model-gym-", delete=False) as fh:
        os.chmod(fh.name, 0o600)
        yaml.safe_dump(block, fh)
    try:
        return cli_main(["serve", "--config", fh.name])
    finally:
        os.unlink(fh.name)


if __name__ == "__main__":
    sys.exit(main())
