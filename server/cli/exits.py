"""Exit codes shared by every `switchyard-model` command."""

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and something failed (an unexpected error, a partial export)
EXIT_USAGE = 2  # bad flags, settings or deployment: nothing was started
