"""The house's habits: ruff's lint and its formatter are clean over the whole
repository, with the rules pyproject.toml gives them, so a change that breaks either is a red
test here and not a reviewer's remark."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from support.paths import REPO


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_is_clean(command):
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed here: pip install -e '.[test]' installs it")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
