"""Time to a decision: what a run says about the study that would decide its questions, as
pure functions (``python -m thermab plan RUN_DIR``, the open questions' paragraph of
summary.md, and the cluster-time budget of ``until: decided``; docs/planning.md).

**The spread.**  Per question, the spread *between phases* is the residual sd of the arm
effect the question is tested on (``stats.arm_effects``: se / √(1/n + 1/n_ref)); each phase
restarts the server, so it holds the spread between restarts and what is left of the noise
within a phase.  The spread *within a phase* is measured where a phase's value is a rate over
its window (the in-window throughput): ``performance.csv``'s ``output_tok_s_se``, the
standard error of the phase's rate from ``metrics.BATCHES`` equal parts of its window
(batch means, ``metrics.in_window_se``).  The spread between restarts is then
√(between² − within²), or zero where the phases spread no more than their windows explain.
A heat metric's phase is one trajectory up a heat-up ramp: its parts are not exchangeable,
so it has no within-phase figure.

**The power solver.**  statsmodels' ``TTestIndPower``, one-sided at α, for the distance
between the estimate and the bound that would decide the question (``questions``), with
``n`` phases in each arm.  Independent samples, not ``TTestPower`` on pair differences:
every phase restarts the server, so the restart spread enters each phase on its own and no
pair of phases shares it (a paired test gains only where a pair shares a random effect); the
drift along a pair is the position term of the OLS fit, not a pairing.  The solver's t has
2n − 2 df where the fit has 2n − 3: tests/unit/test_planning.py simulates a planned study and
measures the power it reaches.

**Cluster time.**  A phase job (patch, restart, load window(s), cooldown) takes what the
run's events measured (the median job, from its first ``patch_applied`` or ``restart_start``
to its last ``cooldown_end``), the baseline once; ``time_scale`` study seconds stand for one
second of the run (30 on the simulated cluster, ``timings.time_scale``).  A plan is whole
crossover blocks of repeats (``sequential.pair_size``), as ``until: decided`` runs them.
The budget stop prices the next look's jobs at the median of the measured jobs of their
kind, full or speed-only (``job_price``): the kinds differ by the heat cooldown.

**A restart CV to plan for** (``restart_cv_pct``): for the metrics restarts move (speed and
energy per token, ``metric_names.BETWEEN_RESTARTS``) the planned sd becomes
√(within² + (CV × mean)²) in place of the measured between-phase spread: a plan for a
cluster whose restart spread the run could not see (one phase per arm) or did not have.
"""

from __future__ import annotations

import math
import shlex
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from thermab.analysis import sequential
from thermab.analysis.metrics import PHASE_KEYS
from thermab.analysis.model import Plan, RunData, read_events
from thermab.analysis.questions import (  # ALPHA, POWER and UNDECIDED re-exported: a plan's words read them here
    ALPHA as ALPHA,
    POWER as POWER,
    UNDECIDED as UNDECIDED,
    decisive_distance,
    gain_sign,
    margin_in_unit,
    phases_needed as solve_phases,
)
from thermab.analysis.stats import Effect
from thermab.config import first_testing_repeats, phase_job_s, question_words, repeats_in_budget
from thermab.contracts import PLAN_COLUMNS
from thermab.experiment import plan as experiment_plan
from thermab.layout import RunDir
from thermab.load_levels import Level
from thermab.metric_names import BETWEEN_RESTARTS, OUTPUT_THROUGHPUT

# The restart CV a plan assumes for speed and energy per token until the run has measured
# its own (one phase per arm): vLLM's throughput at 4 streams across restarts, driven by the
# drafter's acceptance (docs/simulation.md, "Restart variance"); ``--restart-cv`` wins.
FIELD_RESTART_CV_PCT = 7.5
MAX_REPEATS = 100  # max_repeats' bound in config.schema.yaml (tests/unit/test_planning.py holds them equal)
MAX_PLANNED_REPEATS = 10_000  # beyond this a margin is out of reach whatever the budget
DEFAULT_MAX_REPEATS = 8  # max_repeats' default in config.schema.yaml
# the --cores of the command that continues a run whose run.json does not record its own
# (an older or imported run): Snakemake's smallest, as the README's commands give it
UNRECORDED_CORES = 1


@dataclass(frozen=True)
class Timings:
    """What a run's clock measured: seconds of the baseline and of one phase job (median),
    and ``time_scale`` study seconds per second of the run."""

    baseline_s: float
    job_s: float
    jobs: int
    time_scale: float = 1.0

    def hours(self, repeats: float, arms: int) -> float:
        """Cluster-hours of a study of ``repeats`` repeats of ``arms`` arms, baseline included."""
        return (self.baseline_s + repeats * arms * self.job_s) * self.time_scale / 3600

    def repeats_within(self, hours: float, arms: int) -> int:
        """The most repeats whose study fits in ``hours`` (0: not one crossover pair), every
        phase job at the measured median (``config.repeats_in_budget``, which prices the
        budget at the config read too)."""
        room_s = (hours * 3600 / self.time_scale if self.time_scale > 0 else math.inf) - self.baseline_s
        if self.job_s <= 0 or room_s < 2 * arms * self.job_s:  # not one crossover pair (AB, BA)
            return 0
        if room_s / (arms * self.job_s) >= MAX_PLANNED_REPEATS:  # a tiny job would floor an infinity
            return MAX_PLANNED_REPEATS
        return min(
            MAX_PLANNED_REPEATS, repeats_in_budget(room_s, arms, self.job_s, self.job_s, first_testing_repeats(arms))
        )


def study_plan(
    run: RunData,
    performance: pd.DataFrame,
    pooled: pd.DataFrame,
    answers: pd.DataFrame | None,
    *,
    hours: float | None = None,
    restart_cv_pct: float | None = None,
    time_scale: float | None = None,
) -> tuple[Timings | None, pd.DataFrame]:
    """The plan of one run (a model.RunData at one level) from its performance table, pooled
    per-phase metrics and questions.csv: (its timings, ``plan_rows``).  ``time_scale``:
    in place of run.json's (1 where it has none)."""
    from thermab.analysis import speed, stats

    config = run.plan
    scale = time_scale if time_scale is not None else float(config.time_scale)
    timings = measured_timings(run.events, scale)
    se = performance["output_tok_s_se"].dropna()
    within = {OUTPUT_THROUGHPUT: float(np.sqrt(np.mean(se**2)))} if len(se) else {}
    effects = stats.arm_effects(pooled, config.reference_arm) if len(pooled) else {}
    # the effects the questions are answered on: speed and energy per token adjusted (analysis/speed.py)
    effects.update(speed.adjusted_effects(effects, pooled, config.reference_arm, config.covariates, ALPHA))
    rows = plan_rows(
        config.questions,  # a level's plan holds the questions asked at it (levels.plan_at)
        effects,
        config,
        timings,
        answers=answers,
        within=within,
        restart_cv_pct=restart_cv_pct,
        hours=hours,
    )
    return timings, rows


def measured_timings(events: pd.DataFrame, time_scale: float = 1.0) -> Timings | None:
    """The run's timings from its events; None where no phase job ran from its restart to
    its cooldown's end (an imported run)."""
    jobs = measured_jobs(events)
    if jobs.empty:
        return None
    starts = events.loc[events["event"] == "baseline_start", "t"]
    ends = events.loc[events["event"] == "baseline_end", "t"]
    baseline = float(ends.max() - starts.max()) if len(starts) and len(ends) and ends.max() > starts.max() else 0.0
    return Timings(baseline, float(np.median(jobs)), len(jobs), time_scale)


def measured_jobs(events: pd.DataFrame) -> pd.Series:
    """Cluster seconds each phase job the events saw whole added, by ``PHASE_KEYS``: from
    the end of what preceded it (the last ``cooldown_end`` or ``baseline_end`` up to its
    first ``patch_applied`` or ``restart_start``; that start itself where nothing preceded
    it) to its last ``cooldown_end`` (every level's window in one job).  The gap ahead of a
    job (a look's analysis, the workflow's scheduling) is cluster time it costs as much as
    its restart is: a budget that left it out would let a run's last look overrun.  Empty
    where no job was seen whole."""
    seconds: dict[tuple[object, ...], float] = {}
    if not events.empty and "event" in events and all(key in events for key in PHASE_KEYS):
        marks = events[events["event"].isin(["patch_applied", "restart_start", "cooldown_end"])]
        done = events.loc[events["event"].isin(["cooldown_end", "baseline_end"]), "t"].to_numpy(dtype=float)
        for keys, job in marks.dropna(subset=["rep"]).groupby(PHASE_KEYS, sort=False):
            begun = job.loc[job["event"] != "cooldown_end", "t"]
            ended = job.loc[job["event"] == "cooldown_end", "t"]
            if len(begun) and len(ended) and ended.max() > begun.min():
                preceding = done[done <= begun.min()]
                start = preceding.max() if len(preceding) else begun.min()
                seconds[tuple(keys)] = float(ended.max() - start)
    index = pd.MultiIndex.from_tuples(list(seconds), names=PHASE_KEYS) if seconds else None
    return pd.Series(list(seconds.values()), index=index, dtype="float64")


def decide_repeats(answers: pd.DataFrame, plan: Plan) -> int:
    """``max_repeats`` for a run until decided that would settle the open questions
    (questions.csv's rows, ``answers``): the phases per arm they need at the observed spread,
    in whole crossover blocks, above what ran; with no spread yet (one phase per arm) the
    schema's default cap."""
    block = sequential.pair_size(plan.order)
    open_ = answers[answers["verdict"] == UNDECIDED]
    ran = int(answers["phases_per_arm"].max()) if len(answers) else 0
    needed = open_["phases_needed"].max() if len(open_) else math.nan
    wanted = max(DEFAULT_MAX_REPEATS if math.isnan(needed) else math.ceil(needed), ran + block)
    return min(math.ceil(wanted / block) * block, MAX_REPEATS)


def decide_command(answers: pd.DataFrame, plan: Plan) -> str:
    """The command that runs the run's study on until its open questions are decided, from
    the directory the run was started in: the config files, ``--cores`` and --config entries
    it was started with (run.json's ``configfiles``, ``cores`` and ``overrides``), its order,
    and ``decide_repeats``.  It resumes from the phases on disk.  Every command a run prints
    that continues it is this one."""
    cores = plan.cores or UNRECORDED_CORES
    files = plan.configfiles or ()
    words = ["snakemake", "--cores", str(cores), "all", *(["--configfile", *files] if files else [])]
    words += ["--config", *experiment_plan.continuation_entries(plan.overrides)]
    if plan.order != "AB":
        words.append(f"order={plan.order}")
    words += ["until=decided", f"max_repeats={decide_repeats(answers, plan)}"]
    return shlex.join(words)


def elapsed_hours(events: pd.DataFrame, time_scale: float = 1.0) -> float:
    """Cluster-hours a run has taken so far: from its baseline (its first event without one)
    to its last ``cooldown_end``, the analyses between looks included."""
    if events.empty or "event" not in events:
        return 0.0
    starts = events.loc[events["event"] == "baseline_start", "t"]
    ends = events.loc[events["event"] == "cooldown_end", "t"]
    begun = starts.min() if len(starts) else events["t"].min()
    return float(max(0.0, ends.max() - begun)) * time_scale / 3600 if len(ends) else 0.0


@dataclass(frozen=True)
class NextJobs:
    """The phase jobs of the next look, as the config prices them: their load window
    ``window_s``, the run's full window ``load_s`` and its heat cooldown's cap, and the
    levels of load each job runs a window of."""

    window_s: float
    load_s: float
    cooldown_max_s: float
    levels: int = 1

    @property
    def speed_only(self) -> bool:
        """A window shorter than the run's full one (``experiment.plan.speed_only``)."""
        return self.window_s < self.load_s

    @property
    def formula_s(self) -> float:
        """The most such a job costs by the config (``config.phase_job_s``, every level's)."""
        return phase_job_s(self.load_s, self.cooldown_max_s, self.window_s) * self.levels


def job_price(events: pd.DataFrame, windows: Mapping[int, float], jobs: NextJobs) -> tuple[float, bool]:
    """(seconds, measured): the price of one phase job of the next look.  The median of the
    run's measured jobs of its kind, where one was measured: a full job's heat cooldown, or
    a speed-only job's restart and wait for the requests in flight, are the cluster's and no
    formula knows them; else the config's price (``NextJobs.formula_s``).  ``windows``: the
    load window each repeat was asked for (``experiment.plan.recorded_windows``); a job of a
    repeat without one ran the full window."""
    measured = measured_jobs(events)
    if not measured.empty:
        asked = [windows.get(int(rep), jobs.load_s) for rep in measured.index.get_level_values("rep")]
        alike = measured[[(window < jobs.load_s) == jobs.speed_only for window in asked]]
        if len(alike):
            return float(np.median(alike)), True
    return jobs.formula_s, False


@dataclass(frozen=True)
class BudgetCheck:
    """Whether the look at ``target`` repeats fits in what is left of ``budget_hours`` after
    ``repeats``: cluster-hours ``used`` so far and ``need`` for the next look, at ``job_s``
    per phase job (``measured``: the median of the run's jobs of its kind; else the
    config's price of its window; ``job_price``), ``speed_only``: its window's kind."""

    fits: bool
    used: float
    need: float
    repeats: int
    target: int
    budget_hours: float
    job_s: float
    measured: bool
    speed_only: bool


def budget_check(
    events: pd.DataFrame,
    windows: Mapping[int, float],
    jobs: NextJobs,
    arms: int,
    repeats: int,
    target: int,
    budget_hours: float,
    time_scale: float = 1.0,
) -> BudgetCheck | None:
    """The budget's check of the look at ``target`` repeats after ``repeats``, each of its
    phase jobs at ``job_price``; None where there is none to make: before any job was
    measured the look runs (the config check keeps a budget of less than one pair of phases
    out)."""
    if target <= repeats or measured_jobs(events).empty:
        return None
    used = elapsed_hours(events, time_scale)
    price, measured = job_price(events, windows, jobs)
    need = (target - repeats) * arms * price * time_scale / 3600
    fits = used + need <= budget_hours
    return BudgetCheck(fits, used, need, repeats, target, budget_hours, price, measured, jobs.speed_only)


def run_budget_check(
    run_dir: Path,
    order: str,
    every: list[Level] | None,
    jobs: NextJobs,
    repeats: int,
    target: int,
    budget_hours: float,
    time_scale: float = 1.0,
) -> BudgetCheck | None:
    """``budget_check`` of the run in ``run_dir``: its events, and the windows its phase
    records were asked for (a job of a repeat not yet whole is one of them).  The one check
    the budget stop acts on and summary.md words."""
    windows = experiment_plan.recorded_windows(run_dir, order, target, crossover=True, every=every)
    events = read_events(RunDir(run_dir).events)
    return budget_check(events, windows, jobs, len(order), repeats, target, budget_hours, time_scale)


def resume_within_budget(
    run_dir: Path,
    order: str,
    max_repeats: int,
    every: list[Level] | None = None,
    budget_hours: float | None = None,
    time_scale: float = 1.0,
    jobs: NextJobs | None = None,
) -> int:
    """``sequential.resume_repeats``, stopped at the repeats done when the look it asks for
    does not fit in what is left of ``budget_hours`` (``run_budget_check``, its phase jobs
    ``jobs``)."""
    wanted = sequential.resume_repeats(run_dir, order, max_repeats, every)
    if budget_hours is None or jobs is None:
        return wanted
    done = sequential.completed_repeats(run_dir, order, every)
    if done == 0 or wanted <= done:
        return wanted
    check = run_budget_check(run_dir, order, every, jobs, done, wanted, budget_hours, time_scale)
    return wanted if check is None or check.fits else done


def smallest_effect(repeats: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest distance, in sd of a phase, that ``repeats`` phases per arm decide with
    ``power`` (TTestIndPower, one-sided at ``alpha``); NaN below 2."""
    if repeats < 2:
        return math.nan
    from statsmodels.stats.power import TTestIndPower

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        effect = TTestIndPower().solve_power(nobs1=repeats, alpha=alpha, power=power, alternative="larger")
    return float(np.asarray(effect).item())


def smallest_margin(question: Mapping[str, Any], estimate: float, distance: float) -> float:
    """The smallest margin (or ``by``) a study deciding ``distance`` from the bound decides,
    at the estimate seen: non-inferiority and superiority reach a ``yes`` beyond it (0: even
    no loss at all), equivalence a ``yes`` within ± it."""
    if question["kind"] == "equivalent":
        return abs(estimate) + distance
    gain = gain_sign(question) * estimate
    if question["kind"] == "non_inferior":
        return max(0.0, distance - gain)
    return max(0.0, gain - distance)  # the largest ``by`` a yes clears: reported as the reach


def restart_spread(between: float, within: float) -> float:
    """√(between² − within²), zero where the phases spread no more than their windows explain."""
    if math.isnan(between) or math.isnan(within):
        return math.nan
    return math.sqrt(max(0.0, between**2 - within**2))


def plan_rows(
    questions: Iterable[Mapping[str, Any]],
    effects: Mapping[tuple[str, str], Effect],
    run: Plan,
    timings: Timings | None,
    *,
    answers: pd.DataFrame | None = None,
    within: Mapping[str, float] | None = None,
    restart_cv_pct: float | None = None,
    hours: float | None = None,
    alpha: float = ALPHA,
    power: float = POWER,
) -> pd.DataFrame:
    """One row per question and arm: the spread seen, the phases per arm and cluster-hours
    that decide it at ``power``, and with ``hours`` the most repeats that budget runs and the
    smallest margin they decide.  ``effects``: ``stats.arm_effects``; ``answers``:
    questions.csv (for the verdict); ``within``: metric → the root mean square of its
    phases' within-phase standard errors."""
    from thermab.analysis.questions import resolve_metric

    reference = run.reference_arm
    arms = [a for a in run.arms if a != reference]
    block = sequential.pair_size(run.order)
    verdicts: dict[tuple[str, str], str] = {}
    if answers is not None and len(answers):
        verdicts = {(m, a): v for m, a, v in zip(answers["metric"], answers["arm"], answers["verdict"], strict=False)}
    budget_repeats = timings.repeats_within(hours, len(run.arms)) if hours and timings else None
    rows: list[dict[str, object]] = []
    for question in questions:
        metric = resolve_metric(question["metric"], run)
        for arm in arms:
            effect = effects.get((metric, arm))
            row: dict[str, object] = dict.fromkeys(PLAN_COLUMNS, math.nan)
            row.update(question=question_words(question), metric=metric, arm=arm, kind=question["kind"])
            row["verdict"] = verdicts.get((metric, arm), UNDECIDED)
            if effect is None:
                rows.append({**row, "phases_per_arm": 0, "sd_from": "no data", "reach": "no data in this run"})
                continue
            inside = (within or {}).get(metric, math.nan)
            planned = _planned(question, metric, effect, run, timings, inside, restart_cv_pct, block, alpha, power)
            rows.append({**row, **planned})
            if budget_repeats is not None:
                rows[-1].update(_within_budget(question, effect, planned, budget_repeats, alpha, power))
    return pd.DataFrame(rows).reindex(columns=PLAN_COLUMNS)


class Planned(TypedDict):
    """A question's and arm's plan: the spread it rests on and what decides it (``plan_rows``)."""

    unit: str
    phases_per_arm: int
    estimate: float
    between_sd: float
    within_sd: float
    restart_sd: float
    planned_sd: float
    sd_from: str
    distance: float
    phases_needed: float
    repeats_needed: float  # whole repeats, NaN where no number decides
    hours_needed: float
    reach: str


class _BudgetRepeats(TypedDict):
    budget_repeats: int


class BudgetReach(_BudgetRepeats, total=False):
    """What ``hours`` of budget reach for a question and arm (``plan_rows``)."""

    budget_distance: float
    smallest_margin: float
    smallest_margin_pct: float
    reach: str


def _planned(
    question: Mapping[str, Any],
    metric: str,
    effect: Effect,
    run: Plan,
    timings: Timings | None,
    inside: float,
    restart_cv_pct: float | None,
    block: int,
    alpha: float,
    power: float,
) -> Planned:
    n = min(effect["n"], effect["ref_n"])
    between = effect["se"] / math.sqrt(1 / effect["n"] + 1 / effect["ref_n"]) if effect["n"] else math.nan
    planned, sd_from = between, "measured between phases"
    if metric in BETWEEN_RESTARTS and (restart_cv_pct is not None or math.isnan(between)):
        cv = FIELD_RESTART_CV_PCT if restart_cv_pct is None else restart_cv_pct
        assumed = cv / 100 * abs(effect["ref"]["mean"])
        planned = math.hypot(0.0 if math.isnan(inside) else inside, assumed)
        sd_from = (
            f"restart CV {cv:g} % assumed"
            + (" (vLLM's at 4 streams; --restart-cv to change)" if restart_cv_pct is None else "")
            + ("" if math.isnan(inside) else " + within phase")
        )
    elif math.isnan(between):
        sd_from = "unknown: one phase per arm"
    margin = margin_in_unit(question, effect["ref"])
    distance = decisive_distance(question["kind"], gain_sign(question), margin, effect["diff"])
    needed = 2.0 if planned == 0 and distance > 0 else solve_phases(distance, planned, alpha, power)
    repeats: float = math.ceil(needed / block) * block if math.isfinite(needed) else math.nan
    hours = timings.hours(repeats, len(run.arms)) if timings and math.isfinite(repeats) else math.nan
    return {
        "unit": effect["unit"],
        "phases_per_arm": n,
        "estimate": effect["diff"],
        "between_sd": between,
        "within_sd": inside,
        "restart_sd": restart_spread(between, inside),
        "planned_sd": planned,
        "sd_from": sd_from,
        "distance": distance,
        "phases_needed": needed,
        "repeats_needed": repeats,
        "hours_needed": hours,
        "reach": _reach(margin, distance, planned, needed, run, timings),
    }


def _reach(margin: float, distance: float, sd: float, needed: float, run: Plan, timings: Timings | None) -> str:
    if math.isnan(margin):
        return "no margin to plan for: it is in % of a reference mean that cannot be told from zero"
    if math.isnan(sd):
        first = first_testing_repeats(len(run.arms))
        cost = f", {timings.hours(first, len(run.arms)):.1f} cluster-hours" if timings else ""
        return (
            f"its spread between restarts is measured at the first look of until: decided that tests"
            f" ({first} repeats{cost}), where it may already decide"
        )
    if math.isnan(distance) or distance <= 0 or math.isnan(needed):
        return "out of reach: the estimate lies on the margin, no number of phases decides it at this estimate"
    return "reachable"


def _within_budget(
    question: Mapping[str, Any], effect: Effect, row: Planned, budget_repeats: int, alpha: float, power: float
) -> BudgetReach:
    if budget_repeats == 0:  # a plan with no phases to count keeps its own reason
        reach = "out of reach: the budget does not fit one crossover block"
        return {"budget_repeats": 0, "reach": reach if row["reach"] == "reachable" else row["reach"]}
    if math.isnan(row["planned_sd"]):
        return {"budget_repeats": budget_repeats}
    distance = smallest_effect(budget_repeats, alpha, power) * row["planned_sd"]
    margin = smallest_margin(question, effect["diff"], distance)
    if question["kind"] in ("lower", "higher") and gain_sign(question) * effect["diff"] < distance:
        margin = math.nan  # no ``by`` at all is cleared at this estimate
    mean = abs(effect["ref"]["mean"])
    if math.isfinite(row["repeats_needed"]) and row["repeats_needed"] <= budget_repeats:
        reach = "reachable in the budget"
    elif row["reach"] == "reachable":
        reach = f"out of reach in the budget: it needs {row['repeats_needed']:.0f} repeats"
    else:
        reach = row["reach"]
    return {
        "budget_repeats": budget_repeats,
        "budget_distance": distance,
        "smallest_margin": margin,
        "smallest_margin_pct": margin / mean * 100 if mean and not math.isnan(margin) else math.nan,
        "reach": reach,
    }
