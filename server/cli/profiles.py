"""`switchyard-model profiles list | show NAME | check FILE_OR_NAME`: the shipped deployments, validated by Switchyard."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from server.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from server.config import ConfigError, load_settings, resolve_deployment
from server.switchyard import profiles
from server.switchyard.interpolation import Variable, references, yaml_references
from server.switchyard.redaction import is_secret_name, redact_assignments


def add_profiles_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add `profiles` (with list/show/check) to an argparse subparsers object."""
    parser = subparsers.add_parser(
        "profiles",
        help="list, show and check Switchyard deployments",
        description="The Switchyard deployments shipped with switchyard-model (profiles/), the variables "
        "they read, and a check that Switchyard itself accepts a deployment, without serving it.",
    )
    commands = parser.add_subparsers(dest="profiles_command", metavar="COMMAND")
    commands.required = True
    commands.add_parser("list", help="list the shipped profiles")
    show = commands.add_parser("show", help="print a profile and the variables it reads")
    show.add_argument("name", metavar="NAME", help="a shipped profile name (vllm, router, gym, ...) or a file")
    check = commands.add_parser(
        "check",
        help="resolve a deployment's variables and validate it with Switchyard",
        description="Interpolate the variables, load the deployment into Switchyard's own server (on a free "
        "loopback port, closed at once) and print the routes it exposes. A Gym-shaped YAML is checked as "
        "settings, then its deployment. Exit 0 if valid, 2 if invalid, 1 if the check itself failed.",
    )
    check.add_argument("target", metavar="FILE_OR_NAME", help="a deployment TOML, a settings YAML, or a profile name")
    parser.set_defaults(func=run_profiles)


def run_profiles(args: argparse.Namespace) -> int:
    """Run one `profiles` subcommand; 0 ok, 1 the check could not run, 2 usage or invalid deployment."""
    try:
        if args.profiles_command == "list":
            return _list()
        if args.profiles_command == "show":
            return _show(profiles.resolve_profile(args.name))
        if args.profiles_command == "check":
            return _check(profiles.resolve_profile(args.target))
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_USAGE
    _error(f"unknown command {args.profiles_command!r}")
    return EXIT_USAGE


def _error(message: str) -> None:
    print(f"switchyard-model profiles: error: {message}", file=sys.stderr)


def _display(path: Path) -> str:
    """Relative to the working directory when it lies below it, else absolute."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


def _summary(path: Path) -> str:
    """The header's first comment line, without its `name.toml:` prefix."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        if line.startswith("#"):
            text = line.lstrip("#").strip()
            return text.removeprefix(f"{path.name}:").strip()
        if line.strip():
            break
    return ""


def _list() -> int:
    rows = [(p.stem, _display(p), _summary(p)) for p in profiles.shipped_profiles()]
    if not rows:
        print("no shipped profiles")
        return EXIT_OK
    name_w = max(len(r[0]) for r in rows)
    path_w = max(len(r[1]) for r in rows)
    for name, path, summary in rows:
        print(f"{name:<{name_w}}  {path:<{path_w}}  {summary}".rstrip())
    return EXIT_OK


def _current(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        return "unset"
    if is_secret_name(name):
        return "set" if value else "set, empty"
    return f"set: {value}" if value else "set, empty"


def _show(path: Path) -> int:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    is_yaml = path.suffix in (".yaml", ".yml")
    print(f"# {_display(path)}")
    print(redact_assignments(text, yaml=is_yaml), end="" if text.endswith("\n") else "\n")
    variables = yaml_references(text) if is_yaml else references(text, path)
    # One row per name: the first reference's default is what a reader needs (they rarely differ).
    seen: dict[str, Variable] = {}
    for var in variables:
        seen.setdefault(var.name, var)
    print()
    if seen:
        print("Variables:")
        width = max(len(n) for n in seen)
        for name, var in seen.items():
            if var.required:
                need = "required"
            elif is_yaml and var.default == "null":
                need = "default null (unset)"
            else:
                need = f"default {var.default!r}"
            print(f"  {name:<{width}}  {need:<40}  ({_current(name)})")
    else:
        print("Variables: none")
    if not is_yaml:
        read_by_switchyard = profiles.api_key_envs(text)
        if read_by_switchyard:
            print("Read by Switchyard itself (api_key_env; must be set and non-empty):")
            width = max(len(n) for n in read_by_switchyard)
            for name in read_by_switchyard:
                state = "set" if os.environ.get(name) else "unset"
                print(f"  {name:<{width}}  ({state})")
    return EXIT_OK


def _validate(deployment: Path) -> tuple[int, dict[str, Any] | None]:
    """Load a deployment into Switchyard on a free loopback port, read its /v1/models, close it.

    The native server is thread-affine, so it is created and closed here, on the caller's thread.
    """
    rendered = profiles.render(deployment)  # ConfigError (unset variable) → exit 2 in run_profiles
    try:
        from switchyard_rust.server import Server, ServerConfigError
    except ImportError:
        _error("cannot import switchyard_rust: install nemo-switchyard==0.3.0")
        return EXIT_FAILED, None
    private = profiles.write_private(rendered)
    try:
        server = Server(str(private), port=0)
    except ServerConfigError as exc:
        message = profiles.switchyard_error(str(exc), rendered, private, _display(deployment))
        _error("Switchyard rejected the deployment:\n" + message)
        return EXIT_USAGE, None
    except RuntimeError as exc:
        _error(f"Switchyard could not start: {rendered.scrub(str(exc))}")
        return EXIT_FAILED, None
    finally:
        profiles.remove_private(private)  # Switchyard has read it by now; it may hold secrets
    try:
        # trust_env=False: an HTTP_PROXY must not intercept a loopback call.
        response = httpx.get(f"{server.base_url}/v1/models", timeout=10.0, trust_env=False)
        response.raise_for_status()
        models = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        _error(f"Switchyard loaded the deployment but /v1/models failed: {exc}")
        return EXIT_FAILED, None
    finally:
        try:
            server.close(timeout_secs=2.0)
        except RuntimeError:
            pass
    return EXIT_OK, models if isinstance(models, dict) else {}


def _print_routes(models: dict[str, Any]) -> list[str]:
    entries = [e for e in models.get("data") or [] if isinstance(e, dict)]
    default = models.get("default_model")
    ids = [str(e.get("id")) for e in entries]
    if not entries:
        print("routes: none")
        return ids
    print("routes:")
    width = max(len(i) for i in ids)
    for route_id, entry in zip(ids, entries):
        caps = entry.get("capabilities") or {}
        window = caps.get("context_window")
        line = f"  {route_id:<{width}}  context_window={window if window is not None else '-'}"
        if caps.get("tool_calling"):
            line += "  tool_calling"
        if route_id == default:
            line += "  (default)"
        print(line)
    return ids


def _check(path: Path) -> int:
    if path.suffix in (".yaml", ".yml"):
        return _check_settings(path)
    code, models = _validate(path)
    if code != EXIT_OK or models is None:
        return code
    print(f"ok: {_display(path)} is a valid Switchyard deployment")
    _print_routes(models)
    return EXIT_OK


def _check_settings(path: Path) -> int:
    settings = load_settings(path)  # ConfigError → exit 2
    print(
        f"settings {_display(path)}: mode {settings.mode}, route {settings.switchyard_model or '(Switchyard default)'}"
    )
    if not settings.launches_proxy:
        print(
            f"attach mode: routes are whatever the Switchyard at {settings.switchyard_base_url} serves (not contacted)"
        )
        return EXIT_OK
    deployment = resolve_deployment(settings.deployment or "")
    code, models = _validate(deployment)
    if code != EXIT_OK or models is None:
        return code
    print(f"ok: deployment {_display(deployment)} is a valid Switchyard deployment")
    ids = _print_routes(models)
    if settings.switchyard_model and settings.switchyard_model not in ids:
        _error(f"route {settings.switchyard_model!r} is not in the deployment (it has: {', '.join(ids) or 'none'})")
        return EXIT_USAGE
    if not settings.switchyard_model and not ids:
        _error("the deployment exposes no route and switchyard_model is not set")
        return EXIT_USAGE
    return EXIT_OK
