"""`make bench`: the same load sent straight to Switchyard and through this server, interleaved, in one table.

Usage: python bench/run.py [--quick] [--only a,b] [--json PATH] [--profile DIR] [--mock-tree PATH] [--injection-tree NAME=PATH]
See bench/README.md for what each figure means, how the load generator was checked, and how to add a section.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/run.py` puts bench/, not the repo, on sys.path

import orjson  # noqa: E402

from bench import capture, disk, injection, latency, reads, recon, rollouts, stream_load, telemetry, twins  # noqa: E402
from bench.harness import Bench, Section, print_table  # noqa: E402

# The sections in the order they run; `--only` names them. A section is a function of the run (bench/harness.py).
SECTIONS: dict[str, Section] = {
    "ceiling": latency.ceiling,
    "sequential": latency.sequential,
    "concurrency": latency.concurrency,
    "twins": twins.twins,
    "streams": latency.streams,
    "stream_load": stream_load.stream_load,
    "capture": capture.capture,
    "telemetry": telemetry.telemetry,
    "injection": injection.injection,
    "reconstruction": recon.reconstruction,
    "reads": reads.reads,
    "disk": disk.disk,
    "hold": capture.hold,
    "rollouts": rollouts.rollouts,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each series briefly (a few minutes in all)")
    parser.add_argument(
        "--only", help=f"comma-separated sections: {','.join(SECTIONS)} (with --profile: the profile loads to run)"
    )
    parser.add_argument("--json", help="also write every number (raw summaries) to this file")
    parser.add_argument("--profile", metavar="DIR", help="instead: py-spy the server under sequential and c=64 load")
    parser.add_argument("--mock-tree", metavar="PATH", help="run the mock upstream from this source tree (A/B runs)")
    parser.add_argument(
        "--injection-tree",
        action="append",
        metavar="NAME=PATH",
        help="injection section: also an injection server from this source tree, side by side (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.profile:
        from bench.profile import profile  # py-spy's loads, not a section

        return profile(args)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    if unknown := only - set(SECTIONS):
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    bench = Bench(args.quick, only, mock_tree=args.mock_tree, injection_trees=args.injection_tree)
    bench.run(SECTIONS)
    data = bench.data
    data["rows"] = bench.rows
    print()
    print(
        f"switchyard-model benchmark ({'quick' if bench.quick else 'full'}), {data['started_at']}, "
        f"{data['machine']['cpus']} CPUs ({data['machine']['cpu']}), load avg at start "
        f"{data['machine']['load_avg_at_start']}, commit {data['machine']['commit']}, {data['total_seconds']} s, "
        f"hosted Switchyard's threads {data['machine']['switchyard_threads']}"
    )
    background = data.get("background_cores", {})
    if background:
        print(
            f"CPU not used by this run's processes (other tenants, kernel networking) per section, "
            f"in cores of {data['machine']['cpus']}: " + ", ".join(f"{k} {v:.2f}" for k, v in background.items())
        )
    print()
    print_table(bench.rows)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        print(f"\nall numbers: {args.json}")
    if bench.failed:
        print(f"\nsome sections failed; process logs kept in {bench.log_dir}")
        return 1
    shutil.rmtree(bench.log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
