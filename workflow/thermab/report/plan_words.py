"""The plan of a run in words: what would decide its open questions (summary.md's paragraph,
``python -m thermab plan``), the budget's account, and the command that decides, with its
cost (evidence.md, summary.md, ``status``, ``plan``). The numbers are ``analysis.planning``'s."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pandas as pd

from thermab.analysis import phase_length, planning, sequential
from thermab.analysis.model import Plan
from thermab.analysis.questions import ALPHA, POWER, UNDECIDED
from thermab.config import first_testing_repeats, residual_df
from thermab.experiment import plan as experiment_plan
from thermab.experiment.plan import pair_size
from thermab.markup import md_text
from thermab.report.table_rows import tuple_rows


class PlanRow(Protocol):
    """One row of the plan (``contracts.PLAN_COLUMNS``, ``planning.study_plan``) as the words
    read it; ``unit`` is NaN for a metric without one."""

    @property
    def question(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def arm(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def verdict(self) -> str: ...
    @property
    def phases_per_arm(self) -> float: ...
    @property
    def estimate(self) -> float: ...
    @property
    def between_sd(self) -> float: ...
    @property
    def within_sd(self) -> float: ...
    @property
    def restart_sd(self) -> float: ...
    @property
    def planned_sd(self) -> float: ...
    @property
    def sd_from(self) -> str: ...
    @property
    def distance(self) -> float: ...
    @property
    def phases_needed(self) -> float: ...
    @property
    def repeats_needed(self) -> float: ...
    @property
    def hours_needed(self) -> float: ...
    @property
    def budget_repeats(self) -> float: ...
    @property
    def budget_distance(self) -> float: ...
    @property
    def smallest_margin(self) -> float: ...
    @property
    def smallest_margin_pct(self) -> float: ...
    @property
    def reach(self) -> str: ...
    @property
    def unit(self) -> object: ...


# the plan's rows
plan_rows: Callable[[pd.DataFrame], Iterator[PlanRow]] = tuple_rows


def decide_cost(answers: pd.DataFrame, plan: Plan, events: pd.DataFrame | None) -> str:
    """What the command that decides would cost: the whole study's cluster-hours at this
    run's measured phase jobs, × its time scale; "" where no job was measured."""
    timings = None if events is None else planning.measured_timings(events, float(plan.time_scale))
    if timings is None:
        return ""
    hours = timings.hours(planning.decide_repeats(answers, plan), len(plan.arms))
    return (
        f" (at most {hours:.1f} cluster-hours: this run's median phase job of {timings.job_s:.0f} s"
        f" × {timings.time_scale:g} study seconds per second)"
    )


def decide_call(answers: pd.DataFrame, plan: Plan, events: pd.DataFrame | None) -> str:
    """The command that decides, in backticks, with its cost; where run.json does not record
    the config files the run was started with, the reader is told to add them."""
    unrecorded = (
        "" if plan.configfiles is not None else " (add the `--configfile` the run was made with: run.json does not say)"
    )
    return f"`{planning.decide_command(answers, plan)}`{decide_cost(answers, plan, events)}{unrecorded}"


def one_more_pair(arms: int, block: int, timings: planning.Timings | None) -> str:
    """What a run of one phase per arm cannot estimate, and what more phases would give: the
    spread between restarts on the residual df of the OLS arm + position fit, and the 80 %
    upper confidence bound of an sd on those df as a multiple of the estimate."""
    from scipy import stats as scipy_stats

    def gives(repeats: int) -> str:
        df = residual_df(arms, repeats)
        upper = math.sqrt(df / scipy_stats.chi2.ppf(0.2, df))
        cost = (
            f", {timings.hours(repeats - 1, arms) - timings.hours(0, arms):.1f} more cluster-hours" if timings else ""
        )
        return (
            f"{repeats} phases per arm{cost}: the spread on {df} residual df,"
            f" its 80 % upper bound {upper:.1f}× the estimate"
        )

    first_look = first_testing_repeats(arms)
    return (
        "One phase per arm: the spread between restarts cannot be estimated, so no plan rests on the"
        f" measured spread. One more pair (the arms in reverse order) gives {gives(2)}; the first look"
        f" of until: decided that tests gives {gives(first_look)}."
    )


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"


def _in(value: float | None, unit: object, sign: bool = False) -> str:
    """A number of the plan in the metric's unit (``—`` where unknown)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = f"{value:{'+' if sign else ''}.3g}"
    return f"{text} {unit}" if isinstance(unit, str) and unit else text


def _decided_margin(row: PlanRow) -> str:
    """The smallest margin (or the largest ``by``) the budget decides at the estimate, in words;
    a margin that shows as 0 is never offered: any margin above it is decided."""
    pct = f" ({row.smallest_margin_pct:.2g} % of the reference)" if math.isfinite(row.smallest_margin_pct) else ""
    shown_zero = math.isfinite(row.smallest_margin) and _num(row.smallest_margin) in ("0", "-0")
    if row.kind in ("lower", "higher"):
        if not math.isfinite(row.smallest_margin):
            return "a yes clears no `by` at this estimate"
        if shown_zero:
            return "a yes at this estimate clears no `by` above 0"
        return f"a yes at this estimate clears a `by` up to {_in(row.smallest_margin, row.unit)}{pct}"
    if shown_zero:
        return "at this estimate any margin above 0 is decided (the gain seen clears the bound)"
    return f"the smallest margin decided at this estimate is {_in(row.smallest_margin, row.unit)}{pct}"


def _budget_words(row: PlanRow, said: bool, block: int) -> str:
    """What the budget decides, in words; ``said``: the line has said the question out of
    reach already, so the budget's reason follows without saying it twice."""
    if row.budget_repeats == 0:
        reason = f"the budget does not fit one crossover block of {block} repeats"
        return f"{reason} either." if said else f"out of reach: {reason}."
    if math.isnan(row.budget_distance):
        return f"{row.budget_repeats:.0f} phases per arm, no plan on them until the spread is measured."
    runs = f"{row.budget_repeats:.0f} phases per arm decide {_in(row.budget_distance, row.unit)} from the bound"
    reach = ""
    if math.isfinite(row.repeats_needed):
        reach = (
            f"; out of reach in the budget: it needs {row.repeats_needed:.0f} repeats"
            if row.repeats_needed > row.budget_repeats
            else "; its plan fits in the budget"
        )
    return f"{runs}; {_decided_margin(row)}{reach}."


def timings_line(timings: planning.Timings | None, arms: int, block: int, simulated: bool = False) -> str:
    """Where the plan's cluster-hours come from: the run's measured phase jobs × its time
    scale; on the simulated cluster, the study's timings the simulation keeps, not the user's
    cluster's."""
    if timings is None:
        return "No phase job with its restart and cooldown in this run's events: no cluster-hours."
    line = (
        f"Cluster-hours are this run's measured phase times × its time scale: a phase job (restart, load,"
        f" cooldown) of {timings.job_s:.0f} s (median of {timings.jobs}) and the baseline of"
        f" {timings.baseline_s:.0f} s, × {timings.time_scale:g} study seconds per second of the run"
        f" (timings.time_scale); a crossover block of {block} repeats ({block * arms} phases) is"
        f" {timings.hours(block, arms) - timings.hours(0, arms):.2f} cluster-hours."
    )
    if simulated:
        line += (
            " On the simulated cluster these are the timings of the study it simulates, not of your cluster:"
            " a pilot run on your own cluster gives its own."
        )
    return line


def plan_lines(
    rows: pd.DataFrame,
    run: Plan,
    timings: planning.Timings | None,
    *,
    hours: float | None = None,
    simulated: bool = False,
) -> list[str]:
    """The plan in words, one item per question and arm (the CLI's output, and summary.md's
    paragraph for the open questions); ``simulated``: the run's hosts are thermab's
    simulation, whose cluster-hours are the simulated study's."""
    labels = {a: spec.label for a, spec in run.arms.items()}
    block = pair_size(run.order)
    arms = len(run.arms)
    lines = [timings_line(timings, arms, block, simulated)]
    lines.append(
        f"Phases per arm to decide at {POWER * 100:.0f} % power: statsmodels' TTestIndPower, one-sided at"
        f" {ALPHA:g}, for the distance between the estimate and the decisive bound at the planned sd"
        " (every phase is a restart of its own, so the arms' phases are independent samples);"
        f" rounded up to whole blocks of {block} repeats."
    )
    if len(rows) and rows["phases_per_arm"].max() <= 1:
        lines.append(one_more_pair(arms, block, timings))
    for row in plan_rows(rows):
        head = f"- {row.question}, {labels.get(row.arm, row.arm)} vs {labels[run.reference_arm]}:"
        head += f" {str(row.verdict).upper()} after {row.phases_per_arm:.0f} phase(s) per arm."
        if row.sd_from == "no data":
            lines.append(f"{head} No data for {row.metric} in this run.")
            continue
        spread = (
            f" Spread between phases {_in(row.between_sd, row.unit)} (within a phase {_in(row.within_sd, row.unit)},"
            f" between restarts {_in(row.restart_sd, row.unit)}); planned sd {_in(row.planned_sd, row.unit)}"
            f" ({row.sd_from}); estimate {_in(row.estimate, row.unit, sign=True)},"
            f" {_in(row.distance, row.unit)} from the decisive bound."
        )
        if math.isfinite(row.phases_needed):
            need = (
                f" Decided at {POWER * 100:.0f} % power by {row.phases_needed:.0f} phases per arm:"
                f" {row.repeats_needed:.0f} repeats, {row.repeats_needed * arms:.0f} phases"
                + (f", {row.hours_needed:.1f} cluster-hours." if math.isfinite(row.hours_needed) else ".")
            )
        else:
            need = f" {row.reach[0].upper()}{row.reach[1:]}."
        said = "out of reach" in need.lower()
        budget = "" if hours is None else f" In {hours:g} h: " + _budget_words(row, said, block)
        lines.append(head + spread + need + budget)
    return lines


def next_look_check(
    run: Plan, run_dir: str | Path, performance: pd.DataFrame, answers: pd.DataFrame, repeats: int
) -> planning.BudgetCheck | None:
    """The budget stop's check of the look after ``repeats`` (report/look.py's), made again
    at the run's end: the next block's window from the run's performance table and
    questions.csv (``answers``) as the look chose it (``phase_length.look_window_s``), and
    ``planning.run_budget_check``, which the stop acts on.  None without a budget, a next
    look or run.json's timings to price that window (a run.json of another tool's)."""
    load_s, min_load_s, cooldown_max_s = run.load_s, run.min_load_s, run.cooldown_max_s
    budget = run.budget_hours
    if run.until != "decided" or budget is None or load_s is None or min_load_s is None or cooldown_max_s is None:
        return None
    upcoming = sequential.next_repeats(run.order, run.max_repeats, repeats, answers["verdict"])
    if not upcoming:
        return None
    window = phase_length.look_window_s(performance, answers, run.order, run.reference_arm, load_s, min_load_s)
    every = None if run.users is None else experiment_plan.levels(run)
    jobs = planning.NextJobs(window, load_s, cooldown_max_s, len(every or [None]))
    return planning.run_budget_check(
        Path(run_dir), run.order, every, jobs, repeats, upcoming, budget, float(run.time_scale)
    )


def open_questions_section(
    rows: pd.DataFrame,
    answers: pd.DataFrame,
    run: Plan,
    timings: planning.Timings | None,
    events: pd.DataFrame,
    run_dir: str | Path,
    simulated: bool = False,
    check: planning.BudgetCheck | None = None,
) -> list[str]:
    """summary.md's paragraph for the questions left undecided: the plan of each (``rows``),
    the budget's account where ``until: decided`` had one (``check``: ``next_look_check``),
    and the commands that plan and run the study that would decide them (``decide_call`` of
    questions.csv, ``answers``, as evidence.md gives it); [] when every question is decided.
    ``simulated``: as ``plan_lines``."""
    open_rows = rows[rows["verdict"] == UNDECIDED]
    if open_rows.empty:
        return []
    lines = ["## What would decide the open questions", ""]
    lines += [budget_sentence(check), ""] if check else []
    # words of the run's questions and labels: escaped here
    for line in plan_lines(open_rows, run, timings, simulated=simulated):
        lines += ["- " + md_text(line[2:])] if line.startswith("- ") else [md_text(line), ""]
    finite = open_rows["repeats_needed"].dropna()
    command = f"`python -m thermab plan {run_dir} --hours H` gives the smallest margin H cluster-hours decide"
    if finite.empty:
        return [*lines, "", f"No number of repeats decides these at the estimates seen; {command}.", ""]
    lines += [
        "",
        f"To run it, resuming from the phases on disk (`budget_hours=H` caps its cluster time):"
        f" {decide_call(answers, run, events)}; {command}.",
    ]
    beyond = open_rows.loc[finite.index[finite > planning.MAX_REPEATS], "question"]
    if len(beyond):
        lines.append(
            f"Beyond the {planning.MAX_REPEATS} repeats `max_repeats` allows: {'; '.join(dict.fromkeys(beyond))}"
            " (out of reach of one study at the spread seen)."
        )
    return lines + [""]


def budget_sentence(check: planning.BudgetCheck) -> str:
    """The budget's account of the next look, in a sentence: the price of its phase jobs
    (``planning.job_price``) and where it comes from."""
    kind = "speed-only" if check.speed_only else "full"
    price = (
        f"the median {check.job_s:.0f} s of this run's {kind} phase jobs"
        if check.measured
        else f"the config's price of at most {check.job_s:.0f} s per {kind} phase job (none measured yet)"
    )
    return (
        f"Budget {check.budget_hours:g} cluster-hours: {check.used:.2f} used after {check.repeats} repeats;"
        f" the next look ({check.target - check.repeats} more repeats, {check.need:.2f} h at {price})"
        + (" fits." if check.fits else " does not fit, so the run stopped here.")
    )
