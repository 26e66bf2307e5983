"""Where the tests find the checkout and their fixed inputs, whatever their tier's folder."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"  # captured outputs, the study's chart data, the e2e tier's short config


def default_config() -> dict:
    """The default config as written (a fresh copy: tests change theirs)."""
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())
