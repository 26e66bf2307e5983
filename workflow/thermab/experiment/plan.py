"""The phase sequence of a run, as pure functions: baseline once, then for each repeat
every arm in ``order``.  Phase ids are ``rep{rep}-{arm}`` (docs/design.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from thermab.config import defaults as schema_defaults
from thermab.layout import BASELINE, PHASE_PATTERN, RunDir


class Phase(NamedTuple):
    rep: int
    arm: str

    @property
    def id(self) -> str:
        return PHASE_PATTERN.format(rep=self.rep, arm=self.arm)


def phases(order: str, repeats: int) -> list[Phase]:
    return [Phase(rep, arm) for rep in range(1, repeats + 1) for arm in order]


def previous(order: str, rep: int, arm: str) -> str:
    """Id of the phase that must finish before ``rep{rep}-{arm}``; the baseline for the first.

    Only earlier repeats are named, so raising ``repeats`` later never changes the chain
    of the phases that already ran."""
    sequence = phases(order, rep)
    index = sequence.index(Phase(rep, arm))
    return BASELINE if index == 0 else sequence[index - 1].id


# the analysis settings a plan falls back on when nothing says otherwise: the schema's
DEFAULT_ANALYSIS = schema_defaults("analysis")
# counted by the load as the tokens arrive (the gaps themselves are not kept): a new value
# takes effect in the phases run after it, never by analysing again
LOAD_TIME_ANALYSIS = ("stall_gap_s",)


def reanalysis(analysis: dict) -> dict:
    """The analysis settings that analysing a run again applies (the analyze and report
    rules' params): every one but those the load applied as it ran."""
    return {key: value for key, value in analysis.items() if key not in LOAD_TIME_ANALYSIS}


def run_plan(*, cluster: str, order: str, repeats: int, arms: dict, setting: str, head: str,
             hosts: list[str], analysis: dict | None = None, **facts) -> dict:
    """The experiment plan of a run directory (``run.json``): what the analysis needs to
    read the run without its config.  ``facts`` add what the writer knows (trip point,
    max_tokens, load_s, where an import came from)."""
    analysis = {**DEFAULT_ANALYSIS, **(analysis or {})}
    return {"cluster": cluster, "order": order, "repeats": repeats, "arms": arms,
            "reference_arm": next(iter(arms)), "setting": setting, "head": head, "hosts": hosts,
            **{key: analysis[key] for key in DEFAULT_ANALYSIS}, **facts}


def write_run_json(run_dir: Path, plan: dict) -> Path:
    """The one writer of ``run.json`` (preflight and the chart importer both call it)."""
    path = RunDir(run_dir).run_json
    path.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    return path
