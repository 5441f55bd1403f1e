"""The benchmark pages stay readable: docs/benchmarks.md is short, and bench/README.md names every file in bench/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MAX_LINES = 300
# A row of bench/README.md's "Files" table: | `name` | job |
_FILES_ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)


def readme_files(readme: str) -> set[str]:
    """The file names in the first column of the README's "Files" table."""
    section = readme.split("## Files\n", 1)[1].split("\n## ", 1)[0]
    return set(_FILES_ROW.findall(section))


def bench_listing(folder: Path) -> set[str]:
    """What `ls bench` shows, less Python's bytecode cache (ignored by git, made by any import)."""
    return {p.name for p in folder.iterdir() if p.name != "__pycache__"}


def test_benchmarks_page_is_short():
    lines = (REPO / "docs" / "benchmarks.md").read_text().count("\n")
    assert lines <= BENCHMARKS_MAX_LINES, f"docs/benchmarks.md has {lines} lines; the run history is git's"


def test_bench_readme_names_exactly_what_is_in_bench():
    named = readme_files((REPO / "bench" / "README.md").read_text())
    listed = bench_listing(REPO / "bench")
    assert listed - named == set(), f"in bench/ but not in bench/README.md's Files table: {sorted(listed - named)}"
    assert named - listed == set(), f"in bench/README.md's Files table but not in bench/: {sorted(named - listed)}"


def test_the_listing_check_sees_an_unnamed_file(tmp_path):
    # Negative control for the test above: a file the table does not name is found, and so is a stale row.
    (tmp_path / "run.py").write_text("")
    (tmp_path / "ab_experiment.py").write_text("")
    named = readme_files("## Files\n\n| file | job |\n|---|---|\n| `run.py` | x |\n| `gone.py` | y |\n\n## Next\n")
    assert named == {"run.py", "gone.py"}
    assert bench_listing(tmp_path) - named == {"ab_experiment.py"}
    assert named - bench_listing(tmp_path) == {"gone.py"}
