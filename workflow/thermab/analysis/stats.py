"""Arm comparisons over repeated phases: spread, intervals, findings, repeats needed.

Input is the long per-phase table of ``metrics.phase_metrics`` (order, rep, arm, metric,
unit, value), possibly pooled over several run directories of one cluster.  Output is the
numeric part of ``variance.csv``; the words (verdicts) are written by ``summary``.

Two estimates of an arm's effect, both as (arm − reference), also in % of the reference mean:

* Welch t (unequal variances) on the phase values of the two arms; needs n ≥ 2 per arm.
  With a single order (e.g. AB repeated) an arm always runs in the same position, so this
  difference also contains any order (period) effect such as heat soak of the later phase.
* When the data hold more than one order (AB and BA, ABCD and DCBA), arm and position are no
  longer confounded: an ordinary least-squares fit ``value ~ arm + position`` (position =
  index of the arm in its order, a linear drift per step) separates the arm effect from the
  period effect, each with a t interval on the residual degrees of freedom.  This estimate
  is then the one reported.  Where a metric's phases ran load windows of more than one length
  (``WINDOW``: ``until: decided`` shortens the windows once only speed questions are open),
  the fit has a window term as well (one indicator: shorter than the longest): a shorter
  window moves some metrics by itself (a speed-only window runs more probes beside the
  load), the same in both arms of its block.

The interval in % divides by the reference mean and treats it as fixed, so it is given only
where that mean can be told from zero (``per_cent_of``); a difference is a finding ("real")
only when its interval excludes zero AND it is at least as large as the restart variance,
the larger coefficient of variation between repeats of either arm (the larger sd, in the
metric's unit, where there is no %).
"""

import math
from collections.abc import Iterable, Mapping
from typing import TypedDict

import pandas as pd

from thermab import metric_names as names

# SciPy and statsmodels are imported where they are used: together they take about a second
# to import, which every importer of the finding names (summary, the report) would pay

# the long table's column of the load window a phase was asked for, named as validity.csv
# names it (phase_length.with_windows)
WINDOW = "load_s"
VARIANCE_COLUMNS = [
    "metric",
    "unit",
    "arm",
    "label",
    "n",
    "mean",
    "sd",
    "cv_pct",
    "reference",
    "ref_n",
    "diff",
    "diff_pct",
    "ci_low",
    "ci_high",
    "ci_low_pct",
    "ci_high_pct",
    "method",
    "period_effect",
    "period_ci_low",
    "period_ci_high",
    "restart_cv_pct",
    "finding",
    "repeats_needed_observed",
    "detect_pct",
    "repeats_needed",
]
# finding values, from least to most conclusive
UNDEFINED = "undefined"  # one phase in an arm: no variance, no interval
CONTAINS_ZERO = "interval contains zero"
VARIANCE_UNKNOWN = "restart variance unknown"
INSIDE_VARIANCE = "inside restart variance"
REAL = "real"

Estimate = tuple[float, float, float]  # an estimate with its interval: (estimate, low, high)


class Description(TypedDict):
    """One arm's phase values (``describe``)."""

    n: int
    mean: float
    sd: float
    cv_pct: float


class Interval(TypedDict):
    """A difference of means (arm − reference) with its interval (``welch_interval``)."""

    diff: float
    ci_low: float
    ci_high: float


class ArmPeriodFit(TypedDict):
    """The OLS fit of ``arm_period_fit``."""

    arms: dict[str, Estimate]  # arm → its effect against the reference
    period: Estimate  # per position step
    se: dict[str, tuple[float, float]]  # arm → (standard error, residual df)
    terms: list[str]  # the fit's terms beside the arm (``fit_terms`` names them)


class Effect(TypedDict):
    """An arm's effect on one metric as the tests of declared questions read it (``arm_effects``)."""

    diff: float
    se: float
    df: float
    method: str
    n: int
    ref_n: int
    ref: Description  # the reference arm's phase values
    unit: str


class Exclusion(TypedDict, total=False):
    """Why ``best_setting`` left an arm out: ``criterion`` ``stalls`` (the stall-gap means,
    the arm's and the reference's) or ``throughput`` (the loss, in % or in the unit)."""

    criterion: str
    mean: float
    reference_mean: float
    diff_pct: float
    diff: float
    unit: str


class BestSetting(TypedDict):
    """The arm ``best_setting`` chose, and why the others were left out."""

    arm: str
    label: str
    value: str | None
    mean: float
    excluded: dict[str, Exclusion]  # arm → why (the report puts it in words)
    checked: list[str]  # the criteria there were data for: stalls, throughput


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t distribution."""
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf(p, df))


def describe(values: pd.Series) -> Description:
    """n, mean, sd (n − 1) and CV in % of the mean; sd and CV are NaN for a single value."""
    n = int(values.count())
    mean = float(values.mean()) if n else math.nan
    sd = float(values.std(ddof=1)) if n >= 2 else math.nan
    if n >= 2 and sd == 0:
        cv = 0.0
    else:
        cv = abs(sd / mean) * 100 if mean else math.nan
    return {"n": n, "mean": mean, "sd": sd, "cv_pct": cv}


def welch_interval(reference: pd.Series, arm: pd.Series, alpha: float = 0.05) -> Interval:
    """Difference of means (arm − reference) with its Welch t interval; NaN interval with fewer
    than two values in either group."""
    diff = float(arm.mean() - reference.mean())
    ref_values, arm_values = reference.dropna().to_numpy(float), arm.dropna().to_numpy(float)
    if min(len(ref_values), len(arm_values)) < 2:
        return {"diff": diff, "ci_low": math.nan, "ci_high": math.nan}
    if reference.var(ddof=1) + arm.var(ddof=1) == 0:
        # no spread in either arm: the difference is exact, and Welch's degrees of freedom
        # are 0/0, which is left to no library's convention
        return {"diff": diff, "ci_low": diff, "ci_high": diff}
    from scipy import stats as scipy_stats

    low, high = scipy_stats.ttest_ind(arm_values, ref_values, equal_var=False).confidence_interval(1 - alpha)
    return {"diff": diff, "ci_low": float(low), "ci_high": float(high)}


SHORTER = "shorter_window"  # the fit's term: the phase ran a window shorter than the data's longest


def with_window_term(data: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``data`` with the fit's window term where its phases ran windows of more than one
    length (``WINDOW``), and that term's name: one indicator, shorter than the longest, as
    ``until: decided`` runs them (its full window, then speed-only blocks that run 3 × the
    probes beside the load, whatever their length).  What a shorter window moves by itself
    is that one shift, the same in both arms of its block; a level per length would spend a
    residual df on each length the rule happened to pick."""
    if WINDOW not in data or data[WINDOW].nunique() < 2:
        return data, []
    return data.assign(**{SHORTER: (data[WINDOW] < data[WINDOW].max()).astype(float)}), [SHORTER]


def fit_terms(terms: list[str]) -> str:
    """The method's words for a fit of ``terms`` beyond the arm: "position + window" etc."""
    words = {"position": "position", SHORTER: "window"}
    return " + ".join(words.get(term, term) for term in terms)


def arm_period_fit(data: pd.DataFrame, reference: str, alpha: float = 0.05) -> ArmPeriodFit | None:
    """OLS ``value ~ arm + position`` over all arms of one metric (arm as treatment contrasts
    against ``reference``, position as a number: a linear drift per step), with a window term
    where the phases ran windows of more than one length (``with_window_term``).

    Returns {"arms": {arm: (estimate, low, high)}, "period": (estimate, low, high),
    "se": {arm: (standard error, residual df)}, "terms": the terms beside the arm} with the
    period effect per position step, or None when arm and position are confounded (a single
    order, or no phase of the reference arm) or no residual degree of freedom is left.
    """
    if data["order"].nunique() < 2 or not (data["arm"] == reference).any():
        # one order: the position is a function of the arm; no reference: the arm columns
        # add up to the intercept.  Either way the design is rank-deficient, so skip the
        # fit (and the slow import of the formula API)
        return None
    from statsmodels.formula.api import ols  # slower still: only where orders are pooled

    position = [order.index(arm) for order, arm in zip(data["order"], data["arm"], strict=False)]
    arm_term = f"C(arm, Treatment(reference={reference!r}))"
    data, window = with_window_term(data)
    terms = ["position", *window]
    model = ols(f"value ~ {arm_term} + " + " + ".join(terms), data.assign(position=position))
    if model.df_resid < 1 or model.rank < model.exog.shape[1]:
        return None
    fit = model.fit()
    interval = fit.conf_int(alpha)

    def estimate(name: str) -> Estimate:
        low, high = interval.loc[name]
        return float(fit.params[name]), float(low), float(high)

    others = [a for a in pd.unique(data["arm"]) if a != reference]
    return {
        "arms": {a: estimate(f"{arm_term}[T.{a}]") for a in others},
        "period": estimate("position"),
        "se": {a: (float(fit.bse[f"{arm_term}[T.{a}]"]), float(fit.df_resid)) for a in others},
        "terms": terms,
    }


def arm_effects(long: pd.DataFrame, reference: str) -> dict[tuple[str, str], Effect]:
    """The arm effect ``compare`` reports, as (metric, arm) → {"diff", "se", "df", "method",
    "n", "ref_n", "ref"} (``ref``: ``describe`` of the reference), for the tests of declared
    questions at any level: the OLS fit where orders are pooled, else Welch's (standard error
    and Satterthwaite df from statsmodels' CompareMeans).  se and df are NaN with one phase
    in either arm."""
    from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

    effects: dict[tuple[str, str], Effect] = {}
    for metric, data in long.groupby("metric", sort=False):
        fit = arm_period_fit(data, reference)
        ref_values = data.loc[data["arm"] == reference, "value"].dropna()
        ref = describe(ref_values)
        for arm in pd.unique(data["arm"]):
            values = data.loc[data["arm"] == arm, "value"].dropna()
            if arm == reference or values.empty or ref["n"] == 0:
                continue
            diff, se, df = float(values.mean() - ref_values.mean()), math.nan, math.nan
            method = "none (n = 1)"
            if fit is not None:
                diff, se, df = fit["arms"][arm][0], *fit["se"][arm]
                method = f"OLS arm + {fit_terms(fit['terms'])}, orders pooled"
            elif min(len(values), len(ref_values)) >= 2:
                method = "Welch t"
                if values.var(ddof=1) + ref_values.var(ddof=1) == 0:
                    se, df = 0.0, math.inf  # no spread: the difference is exact (as welch_interval)
                else:
                    means = CompareMeans(DescrStatsW(values.to_numpy(float)), DescrStatsW(ref_values.to_numpy(float)))
                    se, df = float(means.std_meandiff_separatevar), float(means.ttest_ind(usevar="unequal")[2])
            effects[(str(metric), arm)] = {
                "diff": float(diff),
                "se": se,
                "df": df,
                "method": method,
                "n": len(values),
                "ref_n": ref["n"],
                "ref": ref,
                "unit": str(data["unit"].iloc[0]),
            }
    return effects


def covariate_effects(
    long: pd.DataFrame, reference: str, metrics: Iterable[str], covariates: Iterable[str]
) -> dict[tuple[str, str], Effect]:
    """``arm_effects`` of ``metrics`` adjusted for per-phase ``covariates`` (metrics of the same
    phases in ``long``): the OLS fit ``value ~ arm + position + covariates`` (ANCOVA; position
    only where orders are pooled and a window term only where the phases ran more than one
    window, as ``arm_period_fit``), its arm coefficient, standard error and residual df.  A
    metric is left out where a phase lacks a covariate or the fit has no residual degree of
    freedom: its raw effect stands."""
    keys = ["order", "rep", "arm"]
    covariate_values = {}
    for index, name in enumerate(covariates):
        values = long.loc[long["metric"] == name, [*keys, "value"]]
        if values.empty or values.duplicated(keys).any():
            return {}
        covariate_values[f"covariate{index}"] = values.set_index(keys)["value"]
    if not covariate_values:
        return {}
    effects: dict[tuple[str, str], Effect] = {}
    for metric in metrics:
        data = long[long["metric"] == metric].join(pd.DataFrame(covariate_values), on=keys)
        data = data.dropna(subset=["value", *covariate_values])
        for arm, effect in _covariate_fit(data, reference, list(covariate_values)).items():
            effects[(metric, arm)] = effect
    return effects


def _covariate_fit(data: pd.DataFrame, reference: str, covariates: list[str]) -> dict[str, Effect]:
    """arm → the arm effect of one metric's OLS fit with ``covariates``; {} where it cannot be fitted."""
    if data.empty or not (data["arm"] == reference).any() or data["arm"].nunique() < 2:
        return {}
    from statsmodels.formula.api import ols

    design = []
    if data["order"].nunique() > 1:
        design.append("position")
        data = data.assign(position=[o.index(a) for o, a in zip(data["order"], data["arm"], strict=True)])
    data, window = with_window_term(data)
    design += window
    terms = [f"C(arm, Treatment(reference={reference!r}))", *design, *covariates]
    model = ols("value ~ " + " + ".join(terms), data)
    if model.df_resid < 1 or model.rank < model.exog.shape[1]:
        return {}
    fit = model.fit()
    ref = describe(data.loc[data["arm"] == reference, "value"])
    effects: dict[str, Effect] = {}
    for arm in pd.unique(data["arm"]):
        if arm == reference:
            continue
        name = f"{terms[0]}[T.{arm}]"
        effects[arm] = {
            "diff": float(fit.params[name]),
            "se": float(fit.bse[name]),
            "df": float(fit.df_resid),
            "method": "ANCOVA arm + " + "".join(f"{fit_terms([term])} + " for term in design) + "covariates",
            "n": int((data["arm"] == arm).sum()),
            "ref_n": ref["n"],
            "ref": ref,
            "unit": str(data["unit"].iloc[0]),
        }
    return effects


def repeats_needed(sd: float, difference: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Phases per arm to detect ``difference`` with a two-sided test at ``alpha`` and ``power``
    (normal approximation, equal n): 2 (z₁₋α/₂ + z_power)² sd² / difference², at least 2 so
    that the variance can be estimated.  NaN when sd is unknown or the difference is zero.

    The normal approximation is kept on purpose, in its closed form (the far tail of the
    two-sided test is ignored, as the one-tail formula at α/2 does).  The exact t-based
    answer (``TTestIndPower().solve_power``) asks about one phase more at these sizes, e.g. 17
    rather than 16 for a 1-sd difference; ``NormalIndPower().solve_power`` solves numerically,
    differs in the fifth digit and fails (NaN) where fewer than one phase would do."""
    if math.isnan(sd) or math.isnan(difference) or difference == 0:
        return math.nan
    from statsmodels.stats.power import normal_sample_size_one_tail

    # the difference of two means of n phases each has sd √2·sd/√n
    n = normal_sample_size_one_tail(abs(difference), power, alpha / 2, std_null=math.sqrt(2) * sd)
    return float(max(2, math.ceil(n)))


def compare(
    long: pd.DataFrame,
    arms: Mapping[str, Mapping[str, str]],
    reference: str,
    detect_pct: float = 5.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> pd.DataFrame:
    """variance.csv without the verdict: one row per metric and arm (in the order of ``arms``,
    a mapping letter → {"label", "value"}); non-reference rows carry the difference to
    ``reference``, its interval, the finding and the repeats per arm needed to detect the
    observed difference and a ``detect_pct`` % difference at the pooled sd."""
    rows = []
    for metric, data in long.groupby("metric", sort=False):
        fit = arm_period_fit(data, reference, alpha)
        ref_values = data.loc[data["arm"] == reference, "value"]
        ref = describe(ref_values)
        for arm, spec in arms.items():
            values = data.loc[data["arm"] == arm, "value"]
            if values.empty:
                continue
            described = describe(values)
            row: dict[str, object] = {
                "metric": metric,
                "unit": data["unit"].iloc[0],
                "arm": arm,
                "label": spec.get("label", arm),
                **described,
            }
            if arm != reference and ref["n"]:
                row.update(_difference(ref, ref_values, described, values, fit, arm, alpha, power, detect_pct))
                row.update(reference=reference, ref_n=ref["n"])
            rows.append(row)
    return pd.DataFrame(rows).reindex(columns=VARIANCE_COLUMNS)


def _difference(
    ref: Description,
    ref_values: pd.Series,
    arm_stats: Description,
    values: pd.Series,
    fit: ArmPeriodFit | None,
    arm: str,
    alpha: float,
    power: float,
    detect_pct: float,
) -> dict[str, float | str]:
    if fit is not None:
        diff, low, high = fit["arms"][arm]
        period = fit["period"]
        method = f"OLS arm + {fit_terms(fit['terms'])}, orders pooled"
    else:
        welch = welch_interval(ref_values, values, alpha)
        diff, low, high = welch["diff"], welch["ci_low"], welch["ci_high"]
        period = (math.nan, math.nan, math.nan)
        method = "Welch t" if not math.isnan(low) else "none (n = 1)"
    scale = per_cent_of(ref)
    pooled_sd = _pooled_sd(ref, arm_stats)
    restart_cv = _restart_cv(ref, arm_stats)
    return {
        "diff": diff,
        "diff_pct": diff * scale,
        "ci_low": low,
        "ci_high": high,
        "ci_low_pct": low * scale,
        "ci_high_pct": high * scale,
        "method": method,
        "period_effect": period[0],
        "period_ci_low": period[1],
        "period_ci_high": period[2],
        "restart_cv_pct": restart_cv,
        "finding": _finding(diff, low, high, ref, arm_stats, restart_cv, scale),
        "repeats_needed_observed": repeats_needed(pooled_sd, diff, alpha, power),
        "detect_pct": detect_pct,
        "repeats_needed": repeats_needed(pooled_sd, detect_pct / scale, alpha, power),
    }


def _pooled_sd(a: Description, b: Description) -> float:
    if min(a["n"], b["n"]) < 2:
        return math.nan
    return math.sqrt(((a["n"] - 1) * a["sd"] ** 2 + (b["n"] - 1) * b["sd"] ** 2) / (a["n"] + b["n"] - 2))


def _restart_cv(ref: Description, arm: Description) -> float:
    """The larger CV between repeats of the two arms (a zero mean has none: the other's)."""
    known = [cv for cv in (ref["cv_pct"], arm["cv_pct"]) if not math.isnan(cv)]
    return max(known) if known else math.nan


def per_cent_of(ref: Description) -> float:
    """100 / the reference mean: the factor to a share of it, or NaN where a share of it says
    nothing, for a mean of zero or one whose own 95 % interval contains zero (a stall in one
    of three phases: "+2900 %" of that is noise over noise)."""
    mean, sd, n = ref["mean"], ref["sd"], ref["n"]
    if not mean or math.isnan(mean):
        return math.nan
    if n >= 2 and not math.isnan(sd) and abs(mean) <= t_quantile(0.975, n - 1) * sd / math.sqrt(n):
        return math.nan
    return 100 / mean


def _finding(
    diff: float, low: float, high: float, ref: Description, arm: Description, restart_cv: float, scale: float
) -> str:
    if math.isnan(low):
        return UNDEFINED
    if low <= 0 <= high:
        return CONTAINS_ZERO
    if math.isnan(ref["sd"]) or math.isnan(arm["sd"]):
        return VARIANCE_UNKNOWN
    # restart variance as CV (|diff| in % of the reference vs the larger CV); without a CV,
    # or a reference that cannot be told from zero, in the metric's own unit against the larger sd
    if not math.isnan(scale) and not math.isnan(restart_cv):
        inside = abs(diff * scale) < restart_cv
    else:
        inside = abs(diff) < max(ref["sd"], arm["sd"])
    return INSIDE_VARIANCE if inside else REAL


def best_setting(
    variance: pd.DataFrame,
    arms: Mapping[str, Mapping[str, str]],
    reference: str,
    temperature_metric: str,
    throughput_metric: str = names.OUTPUT_THROUGHPUT,
    stall_metric: str = names.STALL_GAPS,
    tolerance_pct: float = 5.0,
) -> BestSetting | None:
    """The arm with the lowest mean of ``temperature_metric`` among those that neither stall
    more than the reference (mean stall-gap count above the reference's: every stall is
    visible to a user) nor lose throughput beyond variance (a "real" loss, or where the
    variance is unknown a loss larger than ``tolerance_pct`` %).  Returns
    {"arm", "label", "value", "mean", "excluded": {arm: reason}, "checked": [criteria]} or None
    without temperature data; a reason is {"criterion": "stalls", "mean", "reference_mean"}
    (the stall-gap counts) or {"criterion": "throughput", "diff_pct", "diff", "unit"} (the
    loss), which the report puts in words."""

    def rows_of(metric: str) -> pd.DataFrame:
        return variance[variance["metric"] == metric].set_index("arm")

    temperature, throughput, stalls = rows_of(temperature_metric), rows_of(throughput_metric), rows_of(stall_metric)
    if temperature.empty:
        return None
    stall_means = stalls["mean"].astype(float)
    throughput_of = {str(arm): row for arm, row in throughput.iterrows()}
    excluded: dict[str, Exclusion] = {}
    for arm in map(str, temperature.index.drop(reference, errors="ignore")):
        if arm in stall_means and reference in stall_means and stall_means[arm] > stall_means[reference]:
            excluded[arm] = {
                "criterion": "stalls",
                "mean": float(stall_means[arm]),
                "reference_mean": float(stall_means[reference]),
            }
        elif arm in throughput_of and _throughput_loss(throughput_of[arm], tolerance_pct):
            loss = throughput_of[arm]
            excluded[arm] = {
                "criterion": "throughput",
                "diff_pct": float(loss["diff_pct"]),
                "diff": float(loss["diff"]),
                "unit": str(loss["unit"]),
            }
    candidates = temperature.drop(index=list(excluded))["mean"].astype(float)
    best = str(candidates.idxmin())
    return {
        "arm": best,
        "label": arms[best].get("label", best),
        "value": arms[best].get("value"),
        "mean": float(candidates[best]),
        "excluded": excluded,
        "checked": [name for name, table in (("stalls", stalls), ("throughput", throughput)) if not table.empty],
    }


def _throughput_loss(row: pd.Series, tolerance_pct: float) -> bool:
    if not row["diff"] < 0:  # a gain, no change, or no difference known
        return False
    if row["finding"] in (UNDEFINED, VARIANCE_UNKNOWN):
        return bool(abs(row["diff_pct"]) > tolerance_pct)
    return bool(row["finding"] == REAL)
