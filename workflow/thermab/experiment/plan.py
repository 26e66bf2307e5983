"""The phase sequence of a run, as pure functions: baseline once, then for each repeat
every arm in ``order``, and in a run of levels (``load.users`` a list) every level of each,
ascending in odd repeats and descending in even ones.  Phase ids are ``rep{rep}-{arm}``, and
``rep{rep}-{arm}-u{users}`` in a run of levels (docs/design.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from thermab.config import default_questions, defaults as schema_defaults, user_levels
from thermab.layout import BASELINE, RunDir, phase_id


class Phase(NamedTuple):
    rep: int
    arm: str
    users: int | None = None  # the level, in a run of levels

    @property
    def id(self) -> str:
        return phase_id(self.rep, self.arm, self.users)


def levels(users) -> list[int] | None:
    """The levels of ``load.users`` when it is a list (even of one), else None: a single
    number keeps the phase ids and files of a run without levels."""
    return user_levels(users) if isinstance(users, list) else None


def level_order(users: list[int] | None, rep: int) -> list[int | None]:
    """The levels of repeat ``rep`` in the order they run: ascending in odd repeats,
    descending in even ones, so a level's position is balanced as an arm's is."""
    if users is None:
        return [None]
    ascending = sorted(users)
    return ascending if rep % 2 else ascending[::-1]


def williams_orders(order: str) -> list[str]:
    """The rows of a Williams design for the arms of ``order`` (its first row ``order``):
    every arm in every position equally often and every arm after every other equally often
    (for an odd number of arms the design and its mirror, 2k rows).  For two arms: AB, BA."""
    k = len(order)
    first, low, high = [0], 1, k - 1  # the standard first row 0, 1, k−1, 2, k−2, …
    while len(first) < k:
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    rows = [[(j + shift) % k for j in first] for shift in range(k)]
    if k % 2:
        rows += [row[::-1] for row in rows]
    letter = {index: order[position] for position, index in enumerate(rows[0])}  # row 0 is ``order``
    return ["".join(letter[i] for i in row) for row in rows]


def order_of_repeat(order: str, rep: int, crossover: bool = True) -> str:
    """The order of repeat ``rep`` (1-based): ``order`` itself, or in a crossover run
    (``until: decided``) the rows of its Williams design in turn (AB, BA, AB, …)."""
    if not crossover:
        return order
    rows = williams_orders(order)
    return rows[(rep - 1) % len(rows)]


def phases(order: str, repeats: int, crossover: bool = False, users: list[int] | None = None) -> list[Phase]:
    """Every phase in the order it runs; ``users``: the levels (``levels``), or None."""
    return [
        Phase(rep, arm, level)
        for rep in range(1, repeats + 1)
        for arm in order_of_repeat(order, rep, crossover)
        for level in level_order(users, rep)
    ]


def job_phases(rep: int, arm: str, users: list[int] | None = None) -> list[Phase]:
    """The phases one phase job runs, in order: one restart, then a window per level."""
    return [Phase(rep, arm, level) for level in level_order(users, rep)]


def previous(order: str, rep: int, arm: str, crossover: bool = False, users: list[int] | None = None) -> str:
    """Id of the phase that must finish before the job ``rep{rep}-{arm}``: the last of the
    job before it (each job's phases finish together), the baseline for the first.

    Only earlier repeats are named, so raising ``repeats`` later never changes the chain
    of the phases that already ran."""
    sequence = phases(order, rep, crossover, users)
    index = sequence.index(job_phases(rep, arm, users)[0])
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


def run_plan(
    *,
    cluster: str,
    order: str,
    repeats: int,
    arms: dict,
    setting: str,
    head: str,
    hosts: list[str],
    analysis: dict | None = None,
    questions: list[dict] | None = None,
    **facts,
) -> dict:
    """The experiment plan of a run directory (``run.json``): what the analysis needs to
    read the run without its config.  ``facts`` add what the writer knows (trip point,
    max_tokens, load_s, where an import came from).  Without ``questions``, the study's
    default questions (config.default_questions)."""
    analysis = {**DEFAULT_ANALYSIS, **(analysis or {})}
    if questions is None:
        questions = default_questions(analysis["timeline_zone"])
    return {
        "cluster": cluster,
        "order": order,
        "repeats": repeats,
        "arms": arms,
        "reference_arm": next(iter(arms)),
        "setting": setting,
        "head": head,
        "hosts": hosts,
        **{key: analysis[key] for key in DEFAULT_ANALYSIS},
        "questions": questions,
        **facts,
    }


def write_run_json(run_dir: Path, plan: dict) -> Path:
    """The one writer of ``run.json`` (preflight and the chart importer both call it)."""
    path = RunDir(run_dir).run_json
    path.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    return path
