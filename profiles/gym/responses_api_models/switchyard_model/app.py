"""NeMo Gym entrypoint for switchyard-model: Gym runs `python app.py` here with its config in the env."""

import sys

try:
    from server.cli.gym import main
except ImportError:
    sys.exit(
        "switchyard_model: switchyard-model is not installed in this server's venv. Write this directory "
        "with `switchyard-model gym-dir <dir>`, whose pyproject.toml installs it (see docs/quickstart.md)."
    )

if __name__ == "__main__":
    sys.exit(main())
