"""The setting discover checks on each host: the stock one (this package's
stock-setting.yaml) or another config's, where its file lies under vllm, and the value
the file holds now (read as the patcher reads it)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml

from thermab import config as thermab_config
from thermab.config import ConfigError
from thermab.experiment.discover.refusals import UsageError
from thermab.experiment.patch import anchor_matches, original_value

# the study's setting and arms, shipped with the package so an installed thermab needs no
# checkout; config/config.yaml states the same (tests/integration/test_discover.py holds them equal)
STOCK_SETTING = "stock-setting.yaml"
VLLM_PACKAGE = re.compile(r"/(?:site|dist)-packages/vllm/(?P<rel>.+)$")


def stock_setting() -> tuple[dict, dict]:
    stock = yaml.safe_load(resources.files(__package__).joinpath(STOCK_SETTING).read_text())
    return stock["setting"], stock["arms"]


def load_setting(path: Path | None) -> tuple[dict, dict]:
    """The setting and arms of the config at ``path`` (checked as a whole), else the stock ones."""
    if path is None:
        return stock_setting()
    try:
        stock = thermab_config.load(path)
    except FileNotFoundError:
        raise UsageError(f"--setting-from {path}: no such file") from None
    except ConfigError as error:
        raise UsageError(f"--setting-from {path}: {str(error).splitlines()[-1].strip()}") from None
    if stock["setting"]["method"] != "file":
        raise UsageError(
            f"--setting-from {path}: setting.method is {stock['setting']['method']}; "
            "discover checks settings patched in a file"
        )
    return stock["setting"], stock["arms"]


def file_in_vllm(template: str) -> str | None:
    """The setting's file relative to the vllm package, whether the stock config names it
    ``{vllm}/…`` or by an installed path (``…/dist-packages/vllm/…``); None for other files."""
    if template.startswith("{vllm}/"):
        return template[len("{vllm}/") :]
    match = VLLM_PACKAGE.search(template)
    return match["rel"] if match else None


def current_value(text: str, anchor: str, replacement: str) -> str | None:
    """The value the file holds now: the anchor's single match read through the
    replacement's ``{value}`` (``busy_loop_s: float = 1`` -> ``1``), as the patcher reads
    the value it replaces; None unless the anchor matches once in that shape."""
    matches = anchor_matches(text, anchor)
    if len(matches) != 1:
        return None
    return original_value(matches[0], replacement)
