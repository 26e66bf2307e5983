"""The package's types hold: mypy, strict, over the modules pyproject.toml names ([tool.mypy]),
so an annotation that no longer says what the code does is a red test and not a reader's
surprise."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from support.paths import REPO


def test_mypy_is_clean():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed here: pip install -e '.[test]' installs it")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
