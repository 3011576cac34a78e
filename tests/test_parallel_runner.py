"""What ``make test``'s parallel run relies on from pytest-xdist: ``--dist loadgroup`` keeps the
tests of one ``xdist_group`` on one worker (tests/conftest.py groups a module's tests that share
a module-scoped fixture: a control worker, one executor run). pytest 9.2.0 broke it without a
word (pytest-xdist issue 1386): every test was handed out alone and each worker set up the
module's fixture again. requirements/dev.txt pins a pytest that groups; this says if it stops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest run of its own, with two workers

GROUPED = 4
MODULE = f"""
import pytest

@pytest.mark.parametrize("n", range({GROUPED}))
@pytest.mark.xdist_group("shared")
def test_grouped(n):
    pass

@pytest.mark.parametrize("n", range(4))
def test_alone(n):
    pass
"""


def test_loadgroup_runs_a_group_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_groups.py").write_text(MODULE)
    # A bare pytest: none of this suite's plugins or settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:django", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    workers = re.findall(r"\[(gw\d)\].*PASSED .*test_grouped\[\d\]", run.stdout)
    assert len(workers) == GROUPED, run.stdout[-3000:]
    assert len(set(workers)) == 1, f"the group was split over {sorted(set(workers))}"
    assert len(set(re.findall(r"\[(gw\d)\]", run.stdout))) == 2, "both workers ran tests"
