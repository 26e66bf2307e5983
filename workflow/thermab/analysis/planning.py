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

**A restart CV to plan for** (``restart_cv_pct``): for the metrics restarts move (speed and
energy per token, ``metric_names.BETWEEN_RESTARTS``) the planned sd becomes
√(within² + (CV × mean)²) in place of the measured between-phase spread: a plan for a
cluster whose restart spread the run could not see (one phase per arm) or did not have.
"""

from __future__ import annotations

import math
import shlex
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from thermab.analysis import sequential
from thermab.analysis.metrics import PHASE_KEYS
from thermab.analysis.model import Plan, read_events
from thermab.analysis.questions import (
    ALPHA,
    POWER,
    UNDECIDED,
    decisive_distance,
    gain_sign,
    margin_in_unit,
    phases_needed as solve_phases,
)
from thermab.config import first_testing_repeats, question_words, repeats_in_budget
from thermab.layout import RunDir
from thermab.markup import md_text
from thermab.metric_names import BETWEEN_RESTARTS, OUTPUT_THROUGHPUT

PLAN_COLUMNS = [
    "question",
    "metric",
    "arm",
    "kind",
    "verdict",
    "phases_per_arm",
    "estimate",
    "between_sd",
    "within_sd",
    "restart_sd",
    "planned_sd",
    "sd_from",
    "distance",
    "phases_needed",
    "repeats_needed",
    "hours_needed",
    "budget_repeats",
    "budget_distance",
    "smallest_margin",
    "smallest_margin_pct",
    "reach",
    "unit",
]
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

    def hours(self, repeats: int, arms: int) -> float:
        """Cluster-hours of a study of ``repeats`` repeats of ``arms`` arms, baseline included."""
        return (self.baseline_s + repeats * arms * self.job_s) * self.time_scale / 3600

    def repeats_within(self, hours: float, arms: int) -> int:
        """The most repeats whose study fits in ``hours`` (0: not one crossover pair), every
        phase job at the measured median (``config.repeats_in_budget``, which prices the
        budget at the config read and the budget stop too)."""
        room_s = (hours * 3600 / self.time_scale if self.time_scale > 0 else math.inf) - self.baseline_s
        if self.job_s <= 0 or room_s < 2 * arms * self.job_s:  # not one crossover pair (AB, BA)
            return 0
        if room_s / (arms * self.job_s) >= MAX_PLANNED_REPEATS:  # a tiny job would floor an infinity
            return MAX_PLANNED_REPEATS
        return min(
            MAX_PLANNED_REPEATS, repeats_in_budget(room_s, arms, self.job_s, self.job_s, first_testing_repeats(arms))
        )


def study_plan(
    run,
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
    scale = time_scale if time_scale is not None else float(config.get("time_scale", 1.0))
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
    if events.empty or "event" not in events:
        return None
    marks = events[events["event"].isin(["patch_applied", "restart_start", "cooldown_end"])].dropna(subset=["rep"])
    jobs = []
    for _keys, job in marks.groupby(PHASE_KEYS, sort=False):
        begun = job.loc[job["event"] != "cooldown_end", "t"]
        ended = job.loc[job["event"] == "cooldown_end", "t"]
        if len(begun) and len(ended) and ended.max() > begun.min():
            jobs.append(float(ended.max() - begun.min()))
    if not jobs:
        return None
    starts = events.loc[events["event"] == "baseline_start", "t"]
    ends = events.loc[events["event"] == "baseline_end", "t"]
    baseline = float(ends.max() - starts.max()) if len(starts) and len(ends) and ends.max() > starts.max() else 0.0
    return Timings(baseline, float(np.median(jobs)), len(jobs), time_scale)


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
    the directory the run was started in: the config files and ``--cores`` it was started
    with (run.json's ``configfiles`` and ``cores``), its order, and ``decide_repeats``.  It
    resumes from the phases on disk.  Every command a run prints that continues it is this one."""
    cores = plan.get("cores") or UNRECORDED_CORES
    files = plan.get("configfiles") or ()
    words = ["snakemake", "--cores", str(cores), "all", *(["--configfile", *files] if files else []), "--config"]
    if plan.order != "AB":
        words.append(f"order={plan.order}")
    words += ["until=decided", f"max_repeats={decide_repeats(answers, plan)}"]
    return shlex.join(words)


def decide_cost(answers: pd.DataFrame, plan: Plan, events: pd.DataFrame | None) -> str:
    """What the command that decides would cost: the whole study's cluster-hours at this
    run's measured phase jobs, × its time scale; "" where no job was measured."""
    timings = None if events is None else measured_timings(events, float(plan.get("time_scale", 1.0)))
    if timings is None:
        return ""
    hours = timings.hours(decide_repeats(answers, plan), len(plan.arms))
    return (
        f" (at most {hours:.1f} cluster-hours: this run's median phase job of {timings.job_s:.0f} s"
        f" × {timings.time_scale:g} study seconds per second)"
    )


def decide_call(answers: pd.DataFrame, plan: Plan, events: pd.DataFrame | None) -> str:
    """The command that decides, in backticks, with its cost; where run.json does not record
    the config files the run was started with, the reader is told to add them."""
    unrecorded = (
        "" if "configfiles" in plan else " (add the `--configfile` the run was made with: run.json does not say)"
    )
    return f"`{decide_command(answers, plan)}`{decide_cost(answers, plan, events)}{unrecorded}"


def elapsed_hours(events: pd.DataFrame, time_scale: float = 1.0) -> float:
    """Cluster-hours a run has taken so far: from its baseline (its first event without one)
    to its last ``cooldown_end``, the analyses between looks included."""
    if events.empty or "event" not in events:
        return 0.0
    starts = events.loc[events["event"] == "baseline_start", "t"]
    ends = events.loc[events["event"] == "cooldown_end", "t"]
    begun = starts.min() if len(starts) else events["t"].min()
    return float(max(0.0, ends.max() - begun)) * time_scale / 3600 if len(ends) else 0.0


def budget_check(
    events: pd.DataFrame,
    arms: int,
    repeats: int,
    target: int,
    budget_hours: float,
    time_scale: float = 1.0,
    job_s: float | None = None,
) -> tuple[bool, str]:
    """Whether the look at ``target`` repeats fits in what is left of ``budget_hours`` after
    ``repeats``; (fits, the sentence that says so).  Each phase job of the next look at
    ``job_s`` (the price ``config.phase_job_s`` gives the window it runs: a speed-only one
    waits out no heat cooldown), or where none is given at the run's measured median.
    Before any job was measured the look runs (the config check keeps a budget of less than
    one pair of phases out)."""
    timings = measured_timings(events, time_scale)
    if timings is None or target <= repeats:
        return True, ""
    used = elapsed_hours(events, time_scale)
    price, priced = (timings.job_s, "the measured") if job_s is None else (job_s, "at most")
    need = (target - repeats) * arms * price * time_scale / 3600
    fits = used + need <= budget_hours
    sentence = (
        f"Budget {budget_hours:g} cluster-hours: {used:.2f} used after {repeats} repeats; the next look"
        f" ({target - repeats} more repeats, {need:.2f} h at {priced} {price:.0f} s per phase job)"
        + (" fits." if fits else " does not fit, so the run stopped here.")
    )
    return fits, sentence


def resume_within_budget(
    run_dir,
    order: str,
    max_repeats: int,
    every: list | None = None,
    budget_hours: float | None = None,
    time_scale: float = 1.0,
    job_s: float | None = None,
) -> int:
    """``sequential.resume_repeats``, stopped at the repeats done when the look it asks for
    does not fit in what is left of ``budget_hours`` (``budget_check``, its phase jobs at
    ``job_s``)."""
    wanted = sequential.resume_repeats(run_dir, order, max_repeats, every)
    if budget_hours is None:
        return wanted
    done = sequential.completed_repeats(run_dir, order, every)
    if done == 0 or wanted <= done:
        return wanted
    events = read_events(RunDir(run_dir).events)
    return wanted if budget_check(events, len(order), done, wanted, budget_hours, time_scale, job_s)[0] else done


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


def smallest_margin(question: dict, estimate: float, distance: float) -> float:
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
    questions: list[dict],
    effects: dict,
    run: Plan,
    timings: Timings | None,
    *,
    answers: pd.DataFrame | None = None,
    within: dict | None = None,
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
    verdicts = {}
    if answers is not None and len(answers):
        verdicts = {(m, a): v for m, a, v in zip(answers["metric"], answers["arm"], answers["verdict"], strict=False)}
    budget_repeats = timings.repeats_within(hours, len(run.arms)) if hours and timings else None
    rows = []
    for question in questions:
        metric = resolve_metric(question["metric"], run)
        for arm in arms:
            effect = effects.get((metric, arm))
            row = dict.fromkeys(PLAN_COLUMNS, math.nan)
            row.update(question=question_words(question), metric=metric, arm=arm, kind=question["kind"])
            row["verdict"] = verdicts.get((metric, arm), UNDECIDED)
            if effect is None:
                rows.append({**row, "phases_per_arm": 0, "sd_from": "no data", "reach": "no data in this run"})
                continue
            inside = (within or {}).get(metric, math.nan)
            rows.append(
                {**row, **_planned(question, metric, effect, run, timings, inside, restart_cv_pct, block, alpha, power)}
            )
            if budget_repeats is not None:
                rows[-1].update(_within_budget(question, effect, rows[-1], budget_repeats, alpha, power))
    return pd.DataFrame(rows).reindex(columns=PLAN_COLUMNS)


def _planned(question, metric, effect, run, timings, inside, restart_cv_pct, block, alpha, power) -> dict:
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
    repeats = math.ceil(needed / block) * block if math.isfinite(needed) else math.nan
    hours = timings.hours(repeats, len(run.arms)) if timings and math.isfinite(repeats) else math.nan
    return {
        "unit": effect.get("unit", effect.get("raw", {}).get("unit", "")),
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


def _within_budget(question, effect, row, budget_repeats, alpha, power) -> dict:
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


def one_more_pair(arms: int, block: int, timings: Timings | None) -> str:
    """What a run of one phase per arm cannot estimate, and what more phases would give: the
    spread between restarts on the residual df of the OLS arm + position fit, and the 80 %
    upper confidence bound of an sd on those df as a multiple of the estimate."""
    from scipy import stats as scipy_stats

    def gives(repeats):
        df = sequential.residual_df(arms, repeats)
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


def _num(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"


def _in(value: float, unit, sign: bool = False) -> str:
    """A number of the plan in the metric's unit (``—`` where unknown)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = f"{value:{'+' if sign else ''}.3g}"
    return f"{text} {unit}" if isinstance(unit, str) and unit else text


def _decided_margin(row) -> str:
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


def _budget_words(row, said: bool, block: int) -> str:
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


def timings_line(timings: Timings | None, arms: int, block: int, simulated: bool = False) -> str:
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
    rows: pd.DataFrame, run: Plan, timings: Timings | None, *, hours: float | None = None, simulated: bool = False
) -> list[str]:
    """The plan in words, one item per question and arm (the CLI's output, and summary.md's
    paragraph for the open questions); ``simulated``: the run's hosts are thermab's
    simulation, whose cluster-hours are the simulated study's."""
    labels = {a: spec.label for a, spec in run.arms.items()}
    block = sequential.pair_size(run.order)
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
    for row in rows.itertuples(index=False):
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


def open_questions_section(
    rows: pd.DataFrame,
    answers: pd.DataFrame,
    run: Plan,
    timings: Timings | None,
    events: pd.DataFrame,
    run_dir,
    simulated: bool = False,
) -> list[str]:
    """summary.md's paragraph for the questions left undecided: the plan of each (``rows``),
    the budget's account where ``until: decided`` had one, and the commands that plan and
    run the study that would decide them (``decide_call`` of questions.csv, ``answers``, as
    evidence.md gives it); [] when every question is decided.  ``simulated``: as
    ``plan_lines``."""
    open_rows = rows[rows["verdict"] == UNDECIDED]
    if open_rows.empty:
        return []
    lines = ["## What would decide the open questions", ""]
    budget, done = run.budget_hours, int(rows["phases_per_arm"].max())
    upcoming = sequential.next_repeats(run.order, run.max_repeats, done, [UNDECIDED])
    if run.until == "decided" and budget is not None and upcoming and timings is not None:
        scale = timings.time_scale
        lines += [budget_check(events, len(run.arms), done, upcoming, budget, scale)[1], ""]
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
    beyond = open_rows.loc[finite.index[finite > MAX_REPEATS], "question"]
    if len(beyond):
        lines.append(
            f"Beyond the {MAX_REPEATS} repeats `max_repeats` allows: {'; '.join(dict.fromkeys(beyond))}"
            " (out of reach of one study at the spread seen)."
        )
    return lines + [""]
