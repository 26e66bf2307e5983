"""The study that would decide a run's questions, from any run (a pilot, or a finished study).

Per question: the spread seen (between restarts and within phases), the phases per arm and
the cluster-hours that decide it at 80 % power (one-sided 5 %), and with --hours the
smallest margin that budget decides. docs/planning.md explains the plan."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from thermab import cli
from thermab.analysis import levels, planning, questions
from thermab.analysis.model import read_preflight
from thermab.analysis.run_analysis import compute
from thermab.layout import RunDir
from thermab.report import evidence, plan_words

MAX_RESTART_CV_PCT = 1000  # a spread ten times the mean: past it no plan means anything


def at_level(frame: pd.DataFrame, label: str | None) -> pd.DataFrame:
    """The rows of a table at the level of this label (every row for None)."""
    if label is None or levels.LEVEL not in frame:
        return frame
    return frame[frame[levels.LEVEL] == label].reset_index(drop=True)


def plan_text(
    run_dir: str | Path,
    *,
    hours: float | None = None,
    restart_cv_pct: float | None = None,
    time_scale: float | None = None,
) -> str:
    result = compute(run_dir)
    simulated = bool(evidence.simulated_hosts(read_preflight(RunDir(result.run.path).preflight)))
    every = levels.of_run(result.run.plan)
    out = []
    for level in every:
        run = levels.at_level(result.run, level)
        label = None if level is None else level.label
        timings, rows = planning.study_plan(
            run,
            at_level(result.tables["performance"], label),
            at_level(result.pooled, label),
            at_level(result.tables["questions"], label),
            hours=hours,
            restart_cv_pct=restart_cv_pct,
            time_scale=time_scale,
        )
        title = f"Plan for {run_dir}" + (f" at {label}" if len(every) > 1 else "")
        out += [title, "", *plan_words.plan_lines(rows, run.plan, timings, hours=hours, simulated=simulated), ""]
    answers = result.tables["questions"]
    if (answers["verdict"] == questions.UNDECIDED).any():
        out += [f"To decide what is open: {plan_words.decide_call(answers, result.run.plan, result.run.events)}", ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("plan", __doc__)
    parser.add_argument("run_dir", help="a run directory (results/{cluster}/{order}, a pilot or a finished study)")
    parser.add_argument(
        "--hours",
        type=cli.as_key("budget_hours", parse=float),
        help="a cluster-time budget: the smallest margin it decides",
    )
    parser.add_argument(
        "--restart-cv",
        type=cli.number(0, MAX_RESTART_CV_PCT, above=True),
        dest="restart_cv_pct",
        metavar="PCT",
        help="plan speed and per-token questions for this restart CV (%%) instead of the spread measured",
    )
    parser.add_argument(
        "--time-scale",
        type=cli.as_key("timings", "time_scale", parse=float),
        help="study seconds per second of the run, in place of run.json's time_scale (30 on the simulated cluster)",
    )
    args = parser.parse_args(argv)
    print(plan_text(args.run_dir, hours=args.hours, restart_cv_pct=args.restart_cv_pct, time_scale=args.time_scale))
    return 0
