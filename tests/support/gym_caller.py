"""A Gym agent's side of one model call, with Gym 0.7.0's own telemetry code; run under the Gym launcher venv.

    python tests/support/gym_caller.py env --endpoint http://127.0.0.1:PORT    # prints Gym's server environment
    python tests/support/gym_caller.py call --url URL --rollout-id ID --out FILE

`env` is what Gym's launcher puts into every server's environment for a `telemetry:` block with this
endpoint (Gym's `configure_telemetry_env`, as `gym env start` calls it), as JSON. `call`, run with that
environment, sets up the exporting providers from it with nemo-lens (as Gym's servers do), then makes
the call through Gym's own traced request (`nemo_gym.server_utils._traced_request`: a CLIENT span and
its `traceparent` injected by nemo-lens), and writes the answer's status and body.

Gym 0.7.0's `init_telemetry` imports names (`NV_DL_RANK`) that nemo-lens 0.1.0, the release on the
package index, lacks, so on an installation from the index it leaves every Gym server untraced;
`call` therefore builds the providers with nemo-lens's `setup_telemetry` directly, with the same
config Gym reads (`NemoLensConfig.from_env` with Gym's prefixes) and Gym's per-server name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

TELEMETRY_VARIABLES = ("NEMO_GYM_OTEL_", "NEMO_LENS_", "OTEL_")


def gym_environment(endpoint: str) -> dict[str, str]:
    from nemo_gym.telemetry.config import TelemetryConfig
    from nemo_gym.telemetry.setup import configure_telemetry_env

    configure_telemetry_env(TelemetryConfig(enabled=True, otlp_endpoint=endpoint))
    return {name: value for name, value in os.environ.items() if name.startswith(TELEMETRY_VARIABLES)}


async def call(url: str, rollout_id: str) -> dict[str, object]:
    from nemo.lens import NemoLensConfig, setup_telemetry
    from nemo_gym.server_utils import _traced_request

    config = NemoLensConfig.from_env(prefix="NEMO_GYM_OTEL", fallback_prefix="NEMO_LENS")
    config.service_name = f"{config.service_name}/caller_agent"
    handle = setup_telemetry(config, resource_attributes={"nemo.gym.server.name": "caller_agent"})
    seen: dict[str, object] = {}
    body = {"model": "policy", "input": [{"role": "user", "content": "hi"}]}
    response = await _traced_request("POST", f"{url}/ng-rollout/{rollout_id}/v1/responses", json=body)
    seen["status"] = response.status
    seen["body"] = await response.text()
    handle.shutdown(timeout_ms=10_000)  # the CLIENT span exported before this returns
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env")
    env.add_argument("--endpoint", required=True)
    run = sub.add_parser("call")
    run.add_argument("--url", required=True)
    run.add_argument("--rollout-id", required=True)
    run.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # Gym reads its global config (Hydra) from the command line: give it none
    if args.command == "env":
        json.dump(gym_environment(args.endpoint), sys.stdout)
        return
    args.out.write_text(json.dumps(asyncio.run(call(args.url, args.rollout_id))))


if __name__ == "__main__":
    main()
