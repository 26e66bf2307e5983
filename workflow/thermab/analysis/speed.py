"""Speed taken apart: per phase, the drafter's acceptance, the engine's steps and the tokens
each step yields, from the server's own ``/metrics`` (telemetry kind ``server``, the rates
ingest made: telemetry/server_metrics.py).

- ``acceptance length``: 1 + Δaccepted / Δdrafts, the tokens a drafting step yields for a
  request (vLLM's mean acceptance length);
- ``engine steps per second``: Δ``vllm:iteration_tokens_total_count`` / Δt;
- ``tokens per step``: Δ``vllm:generation_tokens_total`` / Δsteps, over the whole batch.

Output throughput is steps per second times tokens per step.  A server restart draws the
drafter's acceptance (docs/design.md, restart variance), which moves throughput, the probes'
decode speed and energy per token from one start to the next; a setting that leaves the
model's numerics alone cannot move it.  So those three are answered on their arm effect
adjusted for the phase's acceptance length (:func:`adjusted_effects`, ANCOVA: the fit
``metric ~ arm + position + acceptance length``), unless the arm is seen to move the
acceptance, and the arms' acceptance is reported as a balance check
(:func:`acceptance_balance`, TOST within ``analysis.acceptance_margin_pct``).  Where the
server exports none of these (no speculative decoding, an older vLLM), or its counters
went back or disagree within a phase, or a metric is measured in some phases only, the
values are empty with the reason, never a number.  Pure functions over frames and dicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import pandas as pd

from thermab import metric_names as names
from thermab.analysis import stats
from thermab.analysis.model import Telemetry, as_telemetry
from thermab.analysis.stats import Effect
from thermab.config import Arm
from thermab.contracts import ACCEPTANCE_COLUMNS
from thermab.telemetry import server_metrics

PHASE_KEYS = ["order", "rep", "arm"]
VALUES = {  # column of the speed table -> (metric of variance.csv, unit)
    "acceptance_length": (names.ACCEPTANCE_LENGTH, "tokens/draft"),
    "engine_steps_s": (names.ENGINE_STEPS, "steps/s"),
    "tokens_per_step": (names.TOKENS_PER_STEP, "tokens/step"),
}
SPEED_COLUMNS = PHASE_KEYS + list(VALUES) + ["reason"]
SENSORS = ("spec_drafts_s", "spec_accepted_s", "engine_steps_s", "generation_tok_s", server_metrics.SPEC_FAULT)
NO_SPEC = "no spec-decode counters on the server's /metrics (no speculative decoding, or an older vLLM)"
NO_STEPS = "no vllm:iteration_tokens_total on the server's /metrics"
NO_SCRAPE = "no scrape of the server's /metrics in the load window"
BALANCED, UNBALANCED, UNDECIDED = "balanced", "unbalanced", "undecided"


def _phase(inside: pd.DataFrame) -> tuple[dict[str, float], list[str]]:
    """One window's values from its server rows (sensor → values), and why any is empty."""

    def mean(sensor: str) -> float:
        values = inside.loc[inside["sensor"] == sensor, "value"]
        return float(values.mean()) if len(values) else math.nan

    why = []
    values = dict.fromkeys(VALUES, math.nan)
    faults = inside.loc[inside["sensor"] == server_metrics.SPEC_FAULT, "value"]
    drafts, accepted = mean("spec_drafts_s"), mean("spec_accepted_s")
    if inside.empty:
        why.append(NO_SCRAPE)
    elif len(faults):
        codes = sorted({int(code) for code in faults.to_numpy(dtype=float)})
        why.append("the spec-decode counters " + " and ".join(server_metrics.SPEC_FAULTS.get(c, "?") for c in codes))
    elif math.isnan(drafts) or math.isnan(accepted):
        why.append(NO_SPEC)
    elif drafts <= 0:
        why.append("no drafts in the load window")
    else:
        values["acceptance_length"] = 1 + accepted / drafts
    steps, generated = mean("engine_steps_s"), mean("generation_tok_s")
    if not inside.empty and math.isnan(steps):
        why.append(NO_STEPS)
    elif steps > 0:
        values["engine_steps_s"] = steps
        values["tokens_per_step"] = generated / steps
    return values, why


def phase_speed(telemetry: Telemetry | pd.DataFrame, windows: pd.DataFrame, host: str | None = None) -> pd.DataFrame:
    """The speed table: one row per load window, the three values and ``reason`` (why any
    is empty).  A value measured in some phases only is emptied in all, said in each."""
    frame = as_telemetry(telemetry).frame(kind="server", host=host)
    frame = frame[frame["sensor"].isin(SENSORS)]
    rows = []
    for window in windows.itertuples(index=False):
        inside = frame[(frame["t"] >= window.load_start) & (frame["t"] < window.load_end)]
        values, why = _phase(inside)
        rows.append({"order": window.order, "rep": window.rep, "arm": window.arm, **values, "reason": why})
    table = pd.DataFrame(rows, columns=SPEED_COLUMNS)
    for column in VALUES:
        measured = table[column].notna()
        if measured.any() and not measured.all():
            unmeasured = table.loc[~measured]
            missing = ", ".join(
                f"rep{rep}-{arm}" for rep, arm in zip(unmeasured["rep"].astype(int), unmeasured["arm"], strict=True)
            )
            table[column] = math.nan
            for reasons in table["reason"]:
                reasons.append(f"{column.replace('_', ' ')} not measured in {missing}: no comparison")
    table["reason"] = ["; ".join(dict.fromkeys(reasons)) for reasons in table["reason"]]
    return table


def phase_metrics(speed: pd.DataFrame) -> pd.DataFrame:
    """The speed table as rows of the per-phase metrics (order, rep, arm, metric, unit, value)."""
    parts = [
        speed[PHASE_KEYS].assign(metric=metric, unit=unit, value=speed[column].astype(float))
        for column, (metric, unit) in VALUES.items()
    ]
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"]).reset_index(drop=True)


def not_measured(speed: pd.DataFrame, arms: Mapping[str, Arm]) -> pd.DataFrame:
    """Rows of variance.csv for the speed metrics no phase has, where the server was
    scraped: empty values, speed.csv's reasons in ``not_measured`` (the report's verdict
    says so).  A run without any scrape (imported, or made before the scrape) has speed.csv's
    reasons alone."""
    rows = []
    scraped = not speed.empty and not (speed["reason"] == NO_SCRAPE).all()
    for column, (metric, unit) in VALUES.items():
        if not scraped or speed[column].notna().any():
            continue
        reasons = "; ".join(r for r in pd.unique(speed["reason"]) if r)
        for arm, spec in arms.items():
            rows.append(
                {
                    "metric": metric,
                    "unit": unit,
                    "arm": arm,
                    "label": spec.get("label", arm),
                    "n": 0,
                    NOT_MEASURED: reasons,
                }
            )
    return pd.DataFrame(rows, columns=stats.VARIANCE_COLUMNS + [NOT_MEASURED])


NOT_MEASURED = "not_measured"  # variance's column of a metric no phase has: speed.csv's reasons


def tost(low: float, high: float, margin: float) -> str:
    """An equivalence test's state from the 1 − 2α interval of a difference: balanced when
    it lies inside ± margin (both one-sided tests reject), unbalanced when wholly outside."""
    if math.isnan(low) or math.isnan(high):
        return UNDECIDED
    if -margin < low and high < margin:
        return BALANCED
    return UNBALANCED if low >= margin or high <= -margin else UNDECIDED


class Balance(TypedDict):
    """An arm's acceptance length against the reference's (``acceptance_balance``)."""

    state: str  # BALANCED, UNBALANCED or UNDECIDED
    low_pct: float
    high_pct: float
    margin_pct: float
    n: int


def acceptance_balance(
    effects: Mapping[tuple[str, str], Effect], margin_pct: float, alpha: float
) -> dict[str, Balance]:
    """arm → {state, low_pct, high_pct, margin_pct, n}: TOST of the arm's mean acceptance
    length against the reference's, within ± ``margin_pct`` % of the reference mean, on the
    arm effect ``stats.arm_effects`` gives (its t interval at 1 − 2α)."""
    from thermab.analysis.questions import interval

    balance: dict[str, Balance] = {}
    for (metric, arm), effect in effects.items():
        if metric != names.ACCEPTANCE_LENGTH:
            continue
        scale = stats.per_cent_of(effect["ref"])
        low, high = interval(effect["diff"], effect["se"], effect["df"], alpha)
        low_pct, high_pct = low * scale, high * scale
        balance[arm] = {
            "state": tost(low_pct, high_pct, margin_pct),
            "low_pct": low_pct,
            "high_pct": high_pct,
            "margin_pct": margin_pct,
            "n": min(effect["n"], effect["ref_n"]),
        }
    return balance


class _AdjustmentCode(TypedDict):
    adjustment: str  # ADJUSTED or a RAW_* code


class Adjustment(_AdjustmentCode, total=False):
    """How an effect on ``metric_names.ADJUSTED`` is answered, and what that concerns."""

    adjustment_covariate: str
    adjustment_p: float


class _WithRaw(Effect):
    raw: Effect


class AdjustedEffect(_WithRaw, Adjustment, total=False):
    """The effect a question on ``metric_names.ADJUSTED`` is answered on (``adjusted_effects``)."""

    confirm: Effect  # the adjusted effect a raw yes must agree with


def adjusted_effects(
    effects: Mapping[tuple[str, str], Effect],
    pooled: pd.DataFrame,
    reference: str,
    covariates: Sequence[str],
    alpha: float,
) -> dict[tuple[str, str], AdjustedEffect]:
    """(metric, arm) → the effect a question on ``metric_names.ADJUSTED`` is answered on:
    adjusted for ``covariates`` (``stats.covariate_effects``, ANCOVA) where the arm is not
    seen to move any of them, else the raw effect; each with ``raw`` (the raw effect) and
    ``adjustment`` (which, and why: a code below (``ADJUSTED``, ``RAW_*``), with the covariate it
    concerns in ``adjustment_covariate`` and the test's p in ``adjustment_p``; the report
    puts it in words).

    Each metric is fitted with its own covariates (``covariates_of``: the probes' decode speed
    with the probes' own acceptance length where the client measured it), named in
    ``adjustment_covariate``.  The arm's effect on a covariate, the declared ones and the
    metric's own, is tested two-sided at ``alpha`` on the covariate's own
    arm effect (``stats.arm_effects``): a setting that moves the drafter's acceptance would
    have part of its effect on speed taken away by the adjustment, so then the raw answer
    stands, with the adjusted effect as ``confirm``: a yes needs both (``questions``).  The
    test also flags α of the arms whose acceptance differs by the restarts' chance alone,
    and there the raw effect carries that chance imbalance: a raw yes alone would let
    through more than α wrong ones (tests/integration/test_speed.py simulates it).  The raw
    answer stands alone where a covariate was not measured (no spec-decode counters),
    could not be tested (one phase per arm) or ``covariates`` is empty (the user says the
    setting may move them)."""
    wanted = [(metric, arm) for (metric, arm) in effects if metric in names.ADJUSTED]
    if not wanted:
        return {}
    used = {metric: covariates_of(metric, covariates, pooled) for metric, _arm in wanted}
    adjusted = {}
    for metric, own in used.items():
        if own:
            adjusted.update(stats.covariate_effects(pooled, reference, [metric], own))
    result: dict[tuple[str, str], AdjustedEffect] = {}
    for metric, arm in wanted:
        raw = effects[(metric, arm)]
        fitted = adjusted.get((metric, arm))
        # the declared covariates and the metric's own measures of them: the arm may move neither
        why = _not_adjusted(effects, arm, list(dict.fromkeys([*covariates, *used[metric]])), alpha)
        if why is None and fitted is not None:
            result[(metric, arm)] = _answered_on(
                fitted, raw, {"adjustment": ADJUSTED, "adjustment_covariate": " + ".join(used[metric])}
            )
        elif why is None:
            result[(metric, arm)] = _answered_on(raw, raw, {"adjustment": RAW_NOT_IN_FIT})
        elif why["adjustment"] == RAW_MOVED and fitted is not None:
            result[(metric, arm)] = _answered_on(raw, raw, {**why, "adjustment": RAW_MOVED_CONFIRM}, confirm=fitted)
        else:
            result[(metric, arm)] = _answered_on(raw, raw, why)
    return result


# A metric's own measure of a covariate, where every one of its phases has it: the probes'
# decode speed moves with the tokens their own steps yielded (each probe draws its drafts,
# a luck beside the restart's draw that the batch's acceptance length cannot see), which the
# client measures per probe (analysis/metrics.py, ``probe_tokens_per_step``)
OWN_MEASURE = {names.PROBE_DECODE_SPEED: {names.ACCEPTANCE_LENGTH: names.PROBE_ACCEPTANCE_LENGTH}}


def covariates_of(metric: str, covariates: Sequence[str], pooled: pd.DataFrame) -> list[str]:
    """The covariates ``metric`` is adjusted for: ``covariates``, each replaced by the metric's
    own measure of it (OWN_MEASURE) where every phase of the metric in ``pooled`` has one."""
    keys = ["order", "rep", "arm"]
    phases = set(map(tuple, pooled.loc[pooled["metric"] == metric, keys].to_numpy().tolist()))
    own = []
    for covariate in covariates:
        measure = OWN_MEASURE.get(metric, {}).get(covariate)
        rows = pooled[(pooled["metric"] == measure) & pooled["value"].notna()] if measure else pooled.iloc[:0]
        covered = phases and phases <= set(map(tuple, rows[keys].to_numpy().tolist()))
        own.append(measure if measure and covered else covariate)
    return own


def _answered_on(effect: Effect, raw: Effect, why: Adjustment, confirm: Effect | None = None) -> AdjustedEffect:
    # field by field: a TypedDict unpacked with ** could carry any key of a subtype
    answered: AdjustedEffect = {
        "diff": effect["diff"],
        "se": effect["se"],
        "df": effect["df"],
        "method": effect["method"],
        "n": effect["n"],
        "ref_n": effect["ref_n"],
        "ref": effect["ref"],
        "unit": effect["unit"],
        "raw": raw,
        "adjustment": why["adjustment"],
    }
    if confirm is not None:
        answered["confirm"] = confirm
    if "adjustment_covariate" in why:
        answered["adjustment_covariate"] = why["adjustment_covariate"]
    if "adjustment_p" in why:
        answered["adjustment_p"] = why["adjustment_p"]
    return answered


# How a question on metric_names.ADJUSTED is answered (questions.csv's ``adjustment``)
ADJUSTED = "adjusted"  # on the arm coefficient adjusted for the covariates
RAW_NO_COVARIATES = "raw:no-covariates"  # analysis.covariates is empty
RAW_NOT_MEASURED = "raw:not-measured"  # the covariate is measured in no phase
RAW_UNTESTABLE = "raw:untestable"  # one phase in an arm: the arm's effect on it cannot be tested
RAW_MOVED = "raw:moved"  # the arm moves the covariate (two-sided t)
RAW_MOVED_CONFIRM = "raw:moved-confirm"  # ... and a yes needs the adjusted effect's yes too
RAW_NOT_IN_FIT = "raw:not-in-fit"  # no covariate in every phase of the fit
ADJUSTMENTS = (
    ADJUSTED,
    RAW_NO_COVARIATES,
    RAW_NOT_MEASURED,
    RAW_UNTESTABLE,
    RAW_MOVED,
    RAW_MOVED_CONFIRM,
    RAW_NOT_IN_FIT,
)


def _not_adjusted(
    effects: Mapping[tuple[str, str], Effect], arm: str, covariates: Sequence[str], alpha: float
) -> Adjustment | None:
    """Why ``arm``'s speed may not be adjusted for ``covariates`` (``adjustment`` and, where
    one covariate is the reason, ``adjustment_covariate`` and ``adjustment_p``), or None
    where it may."""
    if not covariates:
        return {"adjustment": RAW_NO_COVARIATES}
    for covariate in covariates:
        effect = effects.get((covariate, arm))
        if effect is None:
            return {"adjustment": RAW_NOT_MEASURED, "adjustment_covariate": covariate}
        p = two_sided_p(effect)
        if math.isnan(p):
            return {"adjustment": RAW_UNTESTABLE, "adjustment_covariate": covariate}
        if p < alpha:
            return {"adjustment": RAW_MOVED, "adjustment_covariate": covariate, "adjustment_p": p}
    return None


def two_sided_p(effect: Effect) -> float:
    """The two-sided p of an arm effect's t statistic (diff / se on its df); NaN without se."""
    se, df = effect["se"], effect["df"]
    if math.isnan(se) or math.isnan(df):
        return math.nan
    if se == 0:
        return 1.0 if effect["diff"] == 0 else 0.0
    from scipy import stats as scipy_stats

    return float(2 * scipy_stats.t.sf(abs(effect["diff"]) / se, df))


def balance_frame(balance: Mapping[str, Balance], reference: str) -> pd.DataFrame:
    """``acceptance_balance`` as rows, one per arm."""
    rows = [{"arm": arm, "reference": reference, **check} for arm, check in balance.items()]
    return pd.DataFrame(rows, columns=ACCEPTANCE_COLUMNS)
