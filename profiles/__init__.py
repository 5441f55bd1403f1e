"""Switchyard deployments shipped with the server; installed as the package `server.profiles` (see pyproject.toml)."""
