"""The zone model the simulated nodes ship (thermab/sim/calibration.json) is the fit of the
study's chart data: ``python -m thermab.sim.fit --check`` fits it again and compares."""

import subprocess
import sys


def test_shipped_calibration_is_the_fit_of_the_published_data():
    result = subprocess.run(
        [sys.executable, "-m", "thermab.sim.fit", "--check"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
