"""Run `python -m server.cli` with the OTLP exporter on one side only: this server's Python SDK or the hosted Switchyard's.

`python -m bench.otel_side --side python|switchyard -- serve --deployment demo ...`

Both sides read the same process environment (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_*_EXPORTER`,
`OTEL_SDK_DISABLED`), so no setting turns on one exporter without the other. Each side reads it once,
when it starts: this server when the app is built, the hosted Switchyard when
`switchyard_rust.server.Server` is constructed, later, in the app's lifespan. This launcher changes
the environment for the duration of that constructor only:

- `--side python`: Switchyard is constructed with `OTEL_SDK_DISABLED=true`, so only this server exports;
- `--side switchyard`: the process starts with `OTEL_TRACES_EXPORTER=none` and `OTEL_METRICS_EXPORTER=none`
  (this server then collects its /metrics aggregates but exports nothing, exactly as with no endpoint),
  and Switchyard is constructed without them, so only Switchyard exports.

Benchmark use only: the split exists to tell the two exporters' costs apart.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_HIDE = {"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"}


def _patch_switchyard(overrides: dict[str, str | None]) -> None:
    """Construct Switchyard's server under `overrides` (None: unset), then put the environment back."""
    from switchyard_rust import server as switchyard

    original = switchyard.Server

    def server(*args: Any, **kwargs: Any) -> Any:
        saved = {name: os.environ.get(name) for name in overrides}
        try:
            for name, value in overrides.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            return original(*args, **kwargs)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    switchyard.Server = server  # server/proxy.py imports it from the module when it starts


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--side" or argv[1] not in ("python", "switchyard") or "--" not in argv:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    side, rest = argv[1], argv[argv.index("--") + 1 :]
    if side == "python":
        _patch_switchyard({"OTEL_SDK_DISABLED": "true"})
    else:
        for name in _HIDE:
            os.environ[name] = "none"
        _patch_switchyard({name: None for name in _HIDE})
    from server.cli.main import main as cli_main

    return cli_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
