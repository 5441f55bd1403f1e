"""Exit codes shared by every `switchyard-model` command."""

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and something failed (an unexpected error, a partial export)
EXIT_USAGE = 2  # bad flags, settings or deployment: nothing was started
EXIT_INTERRUPTED = 130  # Ctrl-C before the command finished its work (128 + SIGINT, as shells report it;
# CPython may instead end the process by SIGINT itself, which shells also report as 130)
