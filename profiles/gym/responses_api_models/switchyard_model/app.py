"""NeMo Gym entrypoint for switchyard-model: Gym runs `python app.py` here with its config in the env."""

import sys

from server.cli.gym import main

if __name__ == "__main__":
    sys.exit(main())
