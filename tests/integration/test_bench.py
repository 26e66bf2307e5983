"""Every benchmark under bench/ runs: its ``--quick`` mode (seconds of work) exits cleanly
and prints its figures. What the figures are is docs/benchmarks.md's, never asserted."""

import os
import subprocess
import sys

import pytest

from support.paths import REPO

BENCHES = sorted((REPO / "bench").glob("bench_*.py"))


def test_every_bench_is_here():
    assert len(BENCHES) >= 7


@pytest.mark.parametrize("bench", BENCHES, ids=lambda path: path.stem)
def test_the_quick_mode_runs(bench, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "workflow"), os.environ.get("PYTHONPATH")])),
    }
    # the timeout only ends a hung bench: on two cores shared with other work the slowest took minutes
    result = subprocess.run(
        [sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.strip(), "it printed its figures"
    assert "Traceback" not in result.stderr
