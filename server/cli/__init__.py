"""The `switchyard-model` command line: serve, sessions, profiles, gym.

Its public surface is its modules (`__all__`): the HTTP server's workers import `workers` alone, and
re-exporting `main` here would make each of them load every command.
"""

__all__ = ["exits", "main"]
