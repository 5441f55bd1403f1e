"""`switchyard-model gym-dir DIR`: writes the NeMo Gym server directory, with a requirement Gym's setup keeps.

Gym's setup installs a server directory's `requirements.txt` into the server's own venv, and drops
every line holding `../..` unless Gym's own tree is an editable checkout. So the directory is
written with this installation's own source by absolute path (its checkout or wheel), or its version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from server.cli.exits import EXIT_OK, EXIT_USAGE
from server.config import PROFILES_DIR

DROP_IN = PROFILES_DIR / "gym" / "responses_api_models" / "switchyard_model"
# Gym's own servers name Gym's checkout this way; Gym keeps the line only when that checkout is
# editable (the directory sits in it), and then installs nemo-gym from it, as for its own servers.
_GYM_FROM_ITS_CHECKOUT = "-e nemo-gym[dev] @ ../../"


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


def write_server_dir(target: Path, requirement: str) -> None:
    """The Gym server directory: app.py, configs/switchyard_model.yaml, and a requirements.txt Gym keeps."""
    if "../.." in requirement:
        raise ValueError(f"Gym's setup drops requirement lines holding '../..': give an absolute path ({requirement})")
    (target / "configs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DROP_IN / "app.py", target / "app.py")
    shutil.copyfile(DROP_IN / "configs" / "switchyard_model.yaml", target / "configs" / "switchyard_model.yaml")
    (target / "requirements.txt").write_text(
        "# Written by `switchyard-model gym-dir`. Gym's setup installs these lines into this server's venv.\n"
        f"{_GYM_FROM_ITS_CHECKOUT}\n{requirement}\n"
    )


def add_gym_dir_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "gym-dir",
        help="write the NeMo Gym server directory for --model-type switchyard_model",
        description="Write a NeMo Gym server directory (app.py, configs/switchyard_model.yaml, requirements.txt) "
        "that Gym's own setup installs: put it at <Gym>/responses_api_models/switchyard_model, or at "
        "<root>/responses_api_models/switchyard_model for NEMO_GYM_EXTRA_ROOTS / --search-dir <root>.",
    )
    p.add_argument("directory", help="the server directory to write (created if missing)")
    p.add_argument(
        "--requirement",
        help="what Gym installs for this server (default: this installation's checkout or wheel, by absolute path)",
    )


def run_gym_dir(args: argparse.Namespace) -> int:
    target = Path(args.directory).expanduser().resolve()
    try:
        write_server_dir(target, args.requirement or own_requirement())
    except (OSError, ValueError) as exc:
        print(f"switchyard-model gym-dir: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {target} (installs: {(target / 'requirements.txt').read_text().splitlines()[-1]})")
    return EXIT_OK
