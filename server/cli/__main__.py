"""`python -m server.cli` is the `switchyard-model` command (tests and benchmarks start it this way)."""

import sys

try:
    from server.cli.main import main
except KeyboardInterrupt:  # Ctrl-C while the modules load: nothing started, nothing to say
    sys.exit(130)

sys.exit(main())
