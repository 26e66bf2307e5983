"""The declared questions of a run (``questions`` in run.json, config/README.md), answered.

Each question is tested for every arm against the reference on the arm effect of
``variance.csv`` (``stats.arm_effects``: OLS arm + position where orders are pooled, Welch
otherwise), with statsmodels' t interval of that estimate at level 1 − 2α, so that each of
its bounds is a one-sided test at α:

* ``lower`` / ``higher`` (superiority by ``by``, default 0): ``yes`` when the whole interval
  is beyond ``by`` the claimed way, ``no`` when it lies wholly on the other side;
* ``non_inferior`` (``better``, margin m): ``yes`` when the interval excludes a loss of m,
  ``no`` when it lies wholly beyond that loss;
* ``equivalent`` (± m): TOST, ``yes`` when the 1 − 2α interval lies inside ± m (both
  one-sided tests reject), ``no`` when it lies wholly outside.

Anything else is ``undecided``, with ``phases_needed``: the phases per arm that would decide it
at the observed spread (statsmodels' ``TTestIndPower``, one-sided at α, power 0.8, for the
observed distance between the estimate and the decisive bound).  A ``yes`` built on a phase
whose load was not the configured one, or (for a question in °C) on arms whose starts were
not balanced, is withheld: the question stays ``undecided`` and its ``note`` says why.  The
``question`` column is the question's words alone: its caveats are the ``note``, the method
and adjustment their own columns, and ``unit`` and ``better`` (the way it hopes the arm
moves the metric) carry what its verdict line (report/verdict.py) says in units.

Output throughput, probe decode speed and energy per token are answered on their arm effect
adjusted for what each restart draws (analysis/speed.py, ``adjusted_effects``): ``effects``
then carries the adjusted effect with ``raw`` beside it and ``adjustment`` (a code, with the
covariate and p it concerns), which fill the ``adjustment*`` and ``raw_*`` columns.

``answer`` gives ``ANSWER_COLUMNS``, the numbers; questions.csv (``QUESTION_COLUMNS``) is
what the report makes of them: ``adjustment`` in words, and ``balance``, the arm's
acceptance check in words.

A sequential run (``sequential``) calls ``answer`` at each look with that look's α.
Pure functions over frames and dicts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from thermab.analysis import stats
from thermab.analysis.model import Plan
from thermab.config import question_words

QUESTION_COLUMNS = [
    "question",
    "metric",
    "arm",
    "reference",
    "kind",
    "margin",
    "estimate",
    "ci_low",
    "ci_high",
    "level",
    "method",
    "phases_per_arm",
    "verdict",
    "phases_needed",
    "adjustment",
    "raw_estimate",
    "raw_ci_low",
    "raw_ci_high",
    "unit",
    "better",
    "note",
    "balance",
]
# the answers as the analysis writes them: no ``balance`` (the report's, from the acceptance
# frame), ``adjustment`` a code of ``speed`` (``ADJUSTED``, ``RAW_*``) with what it concerns beside it
ANSWER_COLUMNS = [column for column in QUESTION_COLUMNS if column != "balance"] + [
    "adjustment_covariate",
    "adjustment_p",
]
YES, NO, UNDECIDED = "yes", "no", "undecided"
ALPHA = 0.05
POWER = 0.8
THERMAL_UNIT = "°C"


def resolve_metric(metric: str, plan: Plan) -> str:
    """A question's metric as variance.csv names it: ``head …`` is the run's head, unless a
    host is itself called head."""
    first, _, rest = metric.partition(" ")
    if first == "head" and rest and "head" not in plan.hosts:
        return f"{plan.head} {rest}"
    return metric


def gain_sign(question: Mapping[str, Any]) -> int:
    """+1 where a larger value (arm − reference) is what the question hopes for, −1 where a smaller."""
    wanted = question.get("better") if question["kind"] == "non_inferior" else question["kind"]
    return 1 if wanted == "higher" else -1


def better(question: Mapping[str, Any]) -> str:
    """The way the question hopes the arm moves the metric (questions.csv's ``better``):
    ``higher`` or ``lower``; "" for equivalence, which hopes for neither."""
    if question["kind"] == "equivalent":
        return ""
    return "higher" if gain_sign(question) > 0 else "lower"


def margin_in_unit(question: Mapping[str, Any], ref: stats.Description) -> float:
    """The question's margin (or ``by``) in the metric's unit; NaN where it is in % of a
    reference mean that cannot be told from zero."""
    if "margin_pct" in question:
        return float(question["margin_pct"]) / abs(stats.per_cent_of(ref))
    return float(question.get("margin", question.get("by", 0.0)))


def interval(estimate: float, se: float, df: float, alpha: float) -> tuple[float, float]:
    """The two-sided 1 − 2α t interval (each bound a one-sided test at α), from statsmodels."""
    if math.isnan(se) or math.isnan(df):
        return math.nan, math.nan
    if se == 0:
        return estimate, estimate
    from statsmodels.stats.weightstats import _tconfint_generic

    low, high = _tconfint_generic(estimate, se, df, 2 * alpha, "two-sided")
    return float(low), float(high)


def effect_interval(effect: Mapping[str, Any], alpha: float) -> tuple[float, float]:
    """The 1 − 2α interval of an arm effect (``stats.arm_effects``)."""
    return interval(effect["diff"], effect["se"], effect["df"], alpha)


def verdict(kind: str, sign: int, margin: float, low: float, high: float) -> str:
    """yes / no / undecided from the interval of (arm − reference)."""
    if math.isnan(low) or math.isnan(margin):
        return UNDECIDED
    if kind == "equivalent":
        if -margin < low and high < margin:
            return YES
        return NO if low > margin or high < -margin else UNDECIDED
    # the gain (the hoped-for direction) and the bound it must clear
    gain_low, gain_high = sorted((sign * low, sign * high))
    bound = -margin if kind == "non_inferior" else margin
    if gain_low > bound:
        return YES
    return NO if gain_high < bound else UNDECIDED


def decisive_bounds(question: Mapping[str, Any], margin: float) -> list[float]:
    """Where the interval of (arm − reference) must lie beyond for a ``yes``: the margin
    lines of the forest plot."""
    if question["kind"] == "equivalent":
        return [-margin, margin]
    sign = gain_sign(question)
    return [sign * (-margin if question["kind"] == "non_inferior" else margin)]


def decisive_distance(kind: str, sign: int, margin: float, estimate: float) -> float:
    """How far the estimate lies from the bound that would decide the question."""
    if kind == "equivalent":
        return abs(margin - abs(estimate))
    bound = -margin if kind == "non_inferior" else margin
    return abs(sign * estimate - bound)


def phases_needed(distance: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Phases per arm for a one-sided t test at ``alpha`` to tell ``distance`` from zero with
    ``power`` at spread ``sd`` (statsmodels' TTestIndPower, equal n); NaN where unknown."""
    if math.isnan(distance) or math.isnan(sd) or sd <= 0 or distance <= 0:
        return math.nan
    from statsmodels.stats.power import TTestIndPower

    solver = TTestIndPower()
    if solver.power(distance / sd, nobs1=2, alpha=alpha, alternative="larger") >= power:
        return 2.0  # the solver finds no root below 2 phases, the fewest that have a variance
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no convergence is a NaN answer, said by the empty cell
        try:
            n = solver.solve_power(effect_size=distance / sd, alpha=alpha, power=power, alternative="larger")
        except (ValueError, RuntimeError):
            return math.nan
    n = float(n[0] if hasattr(n, "__len__") else n)
    return float(max(2, math.ceil(n))) if math.isfinite(n) else math.nan


def answer(
    questions: Iterable[Mapping[str, Any]],
    effects: Mapping[tuple[str, str], Mapping[str, Any]],
    plan: Plan,
    *,
    alpha: float = ALPHA,
    withheld: Mapping[tuple[str, str], str] | None = None,
) -> pd.DataFrame:
    """questions.csv: one row per question and non-reference arm.  ``effects`` is
    ``stats.arm_effects``; ``withheld`` maps (metric, arm) to why a ``yes`` may not be
    given (a short load, unbalanced starts)."""
    reference = plan.reference_arm
    arms = [arm for arm in plan.arms if arm != reference]
    withheld = withheld or {}
    rows: list[dict[str, Any]] = []
    for question in questions:
        metric = resolve_metric(question["metric"], plan)
        for arm in arms:
            row = {
                "question": question_words(question),
                "metric": metric,
                "arm": arm,
                "reference": reference,
                "kind": question["kind"],
                "level": 1 - 2 * alpha,
                "better": better(question),
            }
            effect = effects.get((metric, arm))
            if effect is None:
                rows.append(
                    {
                        **row,
                        "method": "no data",
                        "phases_per_arm": 0,
                        "verdict": UNDECIDED,
                        "note": f"no data for {metric} in this run",
                    }
                )
                continue
            rows.append({**row, **_tested(question, effect, alpha, withheld.get((metric, arm)))})
    return pd.DataFrame(rows).reindex(columns=ANSWER_COLUMNS)


def _tested(
    question: Mapping[str, Any], effect: Mapping[str, Any], alpha: float, withheld: str | None
) -> dict[str, Any]:
    kind, sign = question["kind"], gain_sign(question)
    margin = margin_in_unit(question, effect["ref"])
    low, high = effect_interval(effect, alpha)
    decided = verdict(kind, sign, margin, low, high)
    notes = []
    if math.isnan(margin):
        notes.append("margin in % of a reference mean that cannot be told from zero")
    elif math.isnan(low):
        notes.append("one phase in an arm: no interval")
    if (
        decided == YES
        and "confirm" in effect
        and verdict(kind, sign, margin, *effect_interval(effect["confirm"], alpha)) != YES
    ):
        decided = UNDECIDED  # a raw yes where the arm's acceptance differs: the adjusted must agree
        notes.append("not yes: the effect adjusted for what each restart draws does not agree")
    if decided == YES and withheld:
        decided = UNDECIDED
        notes.append(f"not yes: {withheld}")
    needed = math.nan
    if decided == UNDECIDED and not math.isnan(effect["se"]):
        spread = effect["se"] / math.sqrt(1 / effect["n"] + 1 / effect["ref_n"])
        # a fixed design's answer at the usual α (a look of until: decided may spend less)
        needed = phases_needed(decisive_distance(kind, sign, margin, effect["diff"]), spread)
    raw = effect.get("raw", effect)
    raw_low, raw_high = effect_interval(raw, alpha)
    return {
        "note": "; ".join(notes),
        "unit": raw.get("unit", ""),
        "adjustment": effect.get("adjustment", ""),
        "adjustment_covariate": effect.get("adjustment_covariate", ""),
        "adjustment_p": effect.get("adjustment_p", math.nan),
        "raw_estimate": raw["diff"],
        "raw_ci_low": raw_low,
        "raw_ci_high": raw_high,
        "margin": margin if kind in ("non_inferior", "equivalent") or question.get("by") else math.nan,
        "estimate": effect["diff"],
        "ci_low": low,
        "ci_high": high,
        "method": effect["method"],
        "phases_per_arm": min(effect["n"], effect["ref_n"]),
        "verdict": decided,
        "phases_needed": needed,
    }


def withheld_yes(pooled: pd.DataFrame, start_balance: Mapping[str, str] | None = None) -> dict[tuple[str, str], str]:
    """(metric, arm) → why a ``yes`` is withheld: a phase of the arm or the reference whose
    load was short (``load_valid`` False), or for a metric in °C unbalanced starts
    (``start_balance``: arm → reason, the reference's own reason applies to every arm)."""
    start_balance = start_balance or {}
    reasons: dict[tuple[str, str], str] = {}
    short = pooled[pooled["load_valid"].eq(False)] if "load_valid" in pooled else pooled.iloc[:0]
    for metric, data in pooled.groupby("metric", sort=False):
        for arm in pd.unique(data["arm"]):
            why = []
            bad = short[(short["metric"] == metric)]
            if not bad.empty:
                phases = zip(bad["rep"], bad["arm"], strict=True)
                why.append("short load in " + ", ".join(f"rep{int(rep)}-{short_arm}" for rep, short_arm in phases))
            if data["unit"].iloc[0] == THERMAL_UNIT and arm in start_balance:
                why.append(start_balance[arm])
            if why:
                reasons[(str(metric), str(arm))] = "; ".join(why)
    return reasons
