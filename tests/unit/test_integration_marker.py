"""`make test-fast` (`-m "not integration"`) leaves out every test under tests/integration/, marked once there."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.procs import REPO

# Two modules: one that starts processes in its tests, one whose fixtures do.
MODULES = ["tests/integration/test_error_messages.py", "tests/integration/test_responses_chain.py"]


def _collect(*marker: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marker, *MODULES],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode in (0, 5), run.stdout + run.stderr  # 5: every test deselected
    return run.stdout


def test_not_integration_deselects_every_integration_test():
    out = _collect("-m", "not integration")
    assert "::test_" not in out
    deselected = re.search(r"(\d+) deselected", out)
    assert deselected and int(deselected.group(1)) >= 5, out


def test_the_integration_marker_selects_them():
    # Negative control: the same modules do hold tests, and the marker is what selects them.
    out = _collect("-m", "integration")
    assert out.count("::test_") >= 5 and "deselected" not in out, out
