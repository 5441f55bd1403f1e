"""`python -m server.cli` is the `switchyard-model` command (tests and benchmarks start it this way)."""

import sys

from server.cli.main import main

sys.exit(main())
