"""`switchyard-model gym-dir DIR`: writes the NeMo Gym server directory, with a pyproject.toml Gym's setup installs.

Gym's setup (nemo_gym/cli/setup_command.py) installs a server directory from its `pyproject.toml` or
its `requirements.txt`, and refuses a directory holding both. Gym 0.7.0 ships
`responses_api_models/switchyard_model/` with a `pyproject.toml` of its own, so the directory is
written with a `pyproject.toml` (replacing Gym's, and any `requirements.txt` an earlier gym-dir left):
Gym installs it as `uv pip install -e .` (from a Gym checkout, with its `[tool.uv.sources]`) or, from
an installed Gym, `nemo-gym==<its version>` then `uv pip install --no-sources -e .`. Either way the
dependency on this server has to name its source itself: this installation's checkout or wheel by
absolute path (a relative one would be read from wherever Gym's venv builds), or its version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from server.cli.exits import EXIT_OK, EXIT_USAGE
from server.config import PROFILES_DIR

DROP_IN = PROFILES_DIR / "gym" / "responses_api_models" / "switchyard_model"
WRITTEN_BY = "# Written by `switchyard-model gym-dir`."
# The project this directory is, as Gym installs it (`-e .`); not `switchyard-model`, its dependency.
DIRECTORY_PROJECT = "switchyard-model-gym-server"


def own_requirement() -> str:
    """How this installation of switchyard-model can be installed again: its checkout (editable or
    not) or the wheel it came from, by absolute path (PEP 610's direct_url.json), else its version."""
    # Every copy of the metadata on the path: run from a checkout, its build's egg-info (no origin)
    # can come before the installed dist-info that records where it was installed from.
    found = list(importlib.metadata.distributions(name="switchyard-model"))
    if not found:
        raise ValueError("switchyard-model is not installed here: give --requirement")
    for distribution in found:
        raw = distribution.read_text("direct_url.json")
        if not raw:
            continue
        origin = json.loads(raw)
        url = origin.get("url", "")
        if url.startswith("file://"):
            path = unquote(urlsplit(url).path)
            if (origin.get("dir_info") or {}).get("editable"):
                return f"-e {path}"
            return f"switchyard-model @ {Path(path).as_uri()}"
    return f"switchyard-model=={found[0].version}"


def dependency(requirement: str) -> str:
    """A requirement as a pyproject dependency that carries its own source: `-e PATH` and a bare
    absolute path become `switchyard-model @ file://PATH` (Gym's `--no-sources` install keeps no
    editable source); a `name @ url` or a version specifier is kept."""
    requirement = requirement.strip()
    if "../.." in requirement or requirement.startswith(("-e .", "./", "../")):
        raise ValueError(f"Gym builds this server's venv elsewhere: give an absolute path ({requirement})")
    path = requirement[len("-e") :].strip() if requirement.startswith("-e ") else requirement
    if path.startswith(("/", "~")):
        return f"switchyard-model @ {Path(path).expanduser().resolve().as_uri()}"
    if requirement.startswith("-"):
        raise ValueError(f"not a requirement a pyproject.toml can hold: {requirement}")
    return requirement


def _gym_checkout_above(target: Path) -> bool:
    """Whether the directory sits in a Gym checkout (`<Gym>/responses_api_models/<dir>`): Gym's setup
    then installs it with `[tool.uv.sources]`, and nemo-gym from that checkout, as its own servers."""
    pyproject = target.parent.parent / "pyproject.toml"
    try:
        name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return bool(name == "nemo-gym")


def pyproject_text(requirement: str, in_gym_checkout: bool) -> str:
    """The directory's pyproject.toml: this server and Gym as its dependencies, no code of its own."""
    sources = (
        "\n# In Gym's checkout Gym installs this editable, with nemo-gym from the checkout, as for its own servers.\n"
        '[tool.uv.sources]\nnemo-gym = { path = "../..", editable = true }\n'
        if in_gym_checkout
        else ""
    )
    return (
        f"{WRITTEN_BY} Gym's setup installs this directory (`uv pip install -e .`)\n"
        "# and so its dependencies into this server's venv. `app.py` runs switchyard-model from there.\n"
        "[project]\n"
        f'name = "{DIRECTORY_PROJECT}"\n'
        'version = "0.1.0"\n'
        'requires-python = ">=3.11"\n'
        "dependencies = [\n"
        '    "nemo-gym[dev]",\n'
        f"    {json.dumps(dependency(requirement))},\n"
        "]\n\n"
        "[build-system]\n"
        'build-backend = "setuptools.build_meta"\n'
        'requires = ["setuptools>=64"]\n\n'
        "[tool.setuptools]\n"
        "packages = []\n" + sources
    )


def write_server_dir(target: Path, requirement: str) -> list[str]:
    """The Gym server directory: app.py, configs/switchyard_model.yaml and pyproject.toml, over what
    is there (Gym's own shipped directory included). Returns the names of files it replaced or removed."""
    text = pyproject_text(requirement, _gym_checkout_above(target))
    (target / "configs").mkdir(parents=True, exist_ok=True)
    changed = [
        name
        for name in ("app.py", "configs/switchyard_model.yaml", "pyproject.toml", "requirements.txt")
        if (target / name).exists()
    ]
    shutil.copyfile(DROP_IN / "app.py", target / "app.py")
    shutil.copyfile(DROP_IN / "configs" / "switchyard_model.yaml", target / "configs" / "switchyard_model.yaml")
    (target / "pyproject.toml").write_text(text)
    # Gym's setup refuses a directory with both files (an earlier gym-dir wrote requirements.txt).
    (target / "requirements.txt").unlink(missing_ok=True)
    return changed


def add_gym_dir_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "gym-dir",
        help="write the NeMo Gym server directory for --model-type switchyard_model",
        description="Write a NeMo Gym server directory (app.py, configs/switchyard_model.yaml, pyproject.toml) "
        "that Gym's own setup installs: <Gym>/responses_api_models/switchyard_model (replacing Gym's own "
        "switchyard_model server there), or <root>/responses_api_models/switchyard_model for "
        "NEMO_GYM_EXTRA_ROOTS / --search-dir <root>.",
    )
    p.add_argument("directory", help="the server directory to write (created if missing)")
    p.add_argument(
        "--requirement",
        help="what Gym installs for this server (default: this installation's checkout or wheel, by absolute path)",
    )


def run_gym_dir(args: argparse.Namespace) -> int:
    target = Path(args.directory).expanduser().resolve()
    try:
        requirement = args.requirement or own_requirement()
        replaced = write_server_dir(target, requirement)
    except (OSError, ValueError) as exc:
        print(f"switchyard-model gym-dir: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {target} (installs: {dependency(requirement)})")
    if replaced:
        print(f"replaced or removed: {', '.join(replaced)}")
    return EXIT_OK
