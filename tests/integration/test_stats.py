"""Arm comparison on synthetic repeated phases with a known effect and known noise."""

import math

import numpy as np
import pandas as pd
import pytest

from thermab.analysis import stats
from thermab.report import summary

ARMS = {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}}


def phases(
    means: dict, sd: float, reps: int, seed: int, orders=("AB",), period_effect=0.0, metric="head TSOC mean", unit="°C"
) -> pd.DataFrame:
    """Per-phase values: arm mean + period_effect × position in the order + N(0, sd)."""
    rng = np.random.default_rng(seed)
    rows = []
    for order in orders:
        for rep in range(1, reps + 1):
            for position, arm in enumerate(order):
                value = means[arm] + period_effect * position + rng.normal(0, sd)
                rows.append((order, rep, arm, metric, unit, value))
    return pd.DataFrame(rows, columns=["order", "rep", "arm", "metric", "unit", "value"])


def difference_row(long, arms=ARMS) -> pd.Series:
    variance = stats.compare(long, arms, "A")
    return variance[variance["arm"] == "B"].iloc[0]


@pytest.mark.parametrize(
    "df, expected", [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (2.5, 3.5747)]
)
def test_t_quantile_matches_tables(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_real_effect_is_found():
    row = difference_row(phases({"A": 89.6, "B": 80.5}, sd=0.8, reps=4, seed=1))
    assert row["finding"] == stats.REAL
    assert row["ci_low"] < -9.1 < row["ci_high"] < 0
    assert row["method"] == "Welch t" and row["n"] == 4 and row["ref_n"] == 4
    assert row["diff_pct"] == pytest.approx(row["diff"] / 89.6 * 100, rel=0.02)


def test_real_effect_has_power_and_null_effect_is_rarely_claimed():
    # 3 sd effect with 4 repeats per arm: power ≈ 0.9; null: α = 0.05 at most
    found = sum(
        difference_row(phases({"A": 100, "B": 97}, 1.0, 4, seed))["finding"] == stats.REAL for seed in range(40)
    )
    claimed = sum(
        difference_row(phases({"A": 100, "B": 100}, 1.0, 4, seed))["finding"] == stats.REAL for seed in range(100, 160)
    )
    assert found >= 32
    assert claimed <= 5


def test_null_effect_seeded_is_not_claimed():
    row = difference_row(
        phases({"A": 85.8, "B": 85.8}, sd=11.0, reps=3, seed=7, metric="output throughput", unit="tok/s")
    )
    assert row["finding"] != stats.REAL
    assert (
        "no difference shown"
        in summary.verdicts(stats.compare(phases({"A": 85.8, "B": 85.8}, 11.0, 3, 7), ARMS, "A")).iloc[-1]
    )


def test_one_phase_per_arm_never_claims():
    row = difference_row(phases({"A": 89.6, "B": 80.5}, sd=0.0, reps=1, seed=0))
    assert row["finding"] == stats.UNDEFINED
    assert math.isnan(row["ci_low"]) and math.isnan(row["repeats_needed"])
    assert row["diff"] == pytest.approx(-9.1)
    variance = stats.compare(phases({"A": 89.6, "B": 80.5}, 0.0, 1, 0), ARMS, "A")
    verdict = summary.verdicts(variance).iloc[-1]
    assert "no claim" in verdict and "real" not in verdict and "lower than" not in verdict


def test_difference_inside_restart_variance_is_not_claimed():
    pattern = np.tile([-5.0, 5.0], 25)  # sd ≈ 5 (CV ≈ 5 %), n = 50: a 3 % difference is significant
    long = pd.concat(
        [
            pd.DataFrame(
                {
                    "order": "AB",
                    "rep": range(50),
                    "arm": arm,
                    "metric": "output throughput",
                    "unit": "tok/s",
                    "value": mean + pattern,
                }
            )
            for arm, mean in (("A", 100.0), ("B", 103.0))
        ]
    )
    row = difference_row(long)
    assert row["ci_low"] > 0
    assert row["finding"] == stats.INSIDE_VARIANCE
    assert "inside restart variance" in summary.verdicts(stats.compare(long, ARMS, "A")).iloc[-1]


def test_both_orders_separate_period_from_arm_effect():
    long = phases({"A": 90.0, "B": 80.0}, sd=0.3, reps=3, seed=3, orders=("AB", "BA"), period_effect=2.0)
    row = difference_row(long)
    assert row["method"].startswith("OLS")
    assert row["ci_low"] < -10 < row["ci_high"]
    assert row["period_ci_low"] < 2.0 < row["period_ci_high"] and row["period_ci_low"] > 0
    assert row["finding"] == stats.REAL
    # one order only: the period effect is confounded with the arm and not estimated
    single = difference_row(phases({"A": 90.0, "B": 80.0}, 0.3, 3, 3, period_effect=2.0))
    assert single["method"] == "Welch t" and math.isnan(single["period_effect"])


def test_repeats_needed_normal_approximation():
    # 2 (1.95996 + 0.84162)² = 15.70 → 16 phases per arm for a 1-sd difference
    assert stats.repeats_needed(10.0, 10.0) == 16
    assert stats.repeats_needed(10.0, 100.0) == 2
    assert math.isnan(stats.repeats_needed(math.nan, 5.0))
    long = phases({"A": 100, "B": 100}, 5.0, 3, 11)
    reference = stats.describe(long.query("arm == 'A'")["value"])
    row = difference_row(long)
    pooled_sd = math.sqrt((row["sd"] ** 2 + reference["sd"] ** 2) / 2)  # equal n
    assert row["repeats_needed"] == stats.repeats_needed(pooled_sd, reference["mean"] * 0.05)


def test_sweep_compares_every_arm_and_names_the_best_setting():
    arms = {
        "A": {"label": "1 s", "value": "1"},
        "B": {"label": "0.1 s", "value": "0.1"},
        "C": {"label": "0.01 s", "value": "0.01"},
        "D": {"label": "0.002 s", "value": "0.002"},
    }
    temperature = phases({"A": 90, "B": 86, "C": 82, "D": 80}, 0.3, 3, 5, orders=("ABCD",))
    throughput = phases(
        {"A": 86, "B": 86, "C": 86, "D": 86}, 1.0, 3, 6, orders=("ABCD",), metric="output throughput", unit="tok/s"
    )
    stalls = phases({"A": 0, "B": 0, "C": 0, "D": 6}, 0.0, 3, 7, orders=("ABCD",), metric="stall gaps", unit="gaps")
    variance = stats.compare(pd.concat([temperature, throughput, stalls]), arms, "A")
    assert set(variance.loc[variance["reference"] == "A", "arm"]) == {"B", "C", "D"}
    best = stats.best_setting(variance, arms, "A", "head TSOC mean")
    assert best["arm"] == "C" and best["value"] == "0.01"
    assert best["excluded"] == {"D": {"criterion": "stalls", "mean": 6.0, "reference_mean": 0.0}}
    assert summary.excluded_words(best["excluded"], "A") == "D: more stall gaps than A (6.0 vs 0.0)"


@pytest.mark.parametrize("seed", range(5))
def test_welch_interval_agrees_with_the_textbook_formula(seed):
    rng = np.random.default_rng(seed)
    reference = pd.Series(rng.normal(100, rng.uniform(0.5, 3), rng.integers(2, 9)))
    arm = pd.Series(rng.normal(97, rng.uniform(0.5, 3), rng.integers(2, 9)))
    v1, v2 = reference.var() / len(reference), arm.var() / len(arm)
    df = (v1 + v2) ** 2 / (v1**2 / (len(reference) - 1) + v2**2 / (len(arm) - 1))
    half = stats.t_quantile(0.975, df) * math.sqrt(v1 + v2)
    diff = arm.mean() - reference.mean()
    welch = stats.welch_interval(reference, arm)
    assert welch["diff"] == pytest.approx(diff, abs=1e-9)
    assert (welch["ci_low"], welch["ci_high"]) == pytest.approx((diff - half, diff + half), abs=1e-9)
    constant = stats.welch_interval(pd.Series([1.0, 1.0]), pd.Series([3.0, 3.0]))
    assert constant == {"diff": 2.0, "ci_low": 2.0, "ci_high": 2.0}


@pytest.mark.parametrize("seed", range(5))
def test_arm_period_fit_agrees_with_least_squares(seed):
    long = phases(
        {"A": 90.0, "B": 84.0, "C": 80.0}, sd=1.0, reps=2, seed=seed, orders=("ABC", "CBA"), period_effect=1.5
    )
    position = np.array([order.index(arm) for order, arm in zip(long["order"], long["arm"], strict=False)], float)
    design = np.column_stack([np.ones(len(long)), long["arm"] == "B", long["arm"] == "C", position]).astype(float)
    coef, *_ = np.linalg.lstsq(design, long["value"].to_numpy(), rcond=None)
    residual = long["value"].to_numpy() - design @ coef
    dof = len(long) - design.shape[1]
    se = np.sqrt(np.diag(residual @ residual / dof * np.linalg.inv(design.T @ design)))
    half = stats.t_quantile(0.975, dof) * se
    fit = stats.arm_period_fit(long, "A")
    for i, estimate in enumerate([fit["arms"]["B"], fit["arms"]["C"], fit["period"]], start=1):
        assert estimate == pytest.approx((coef[i], coef[i] - half[i], coef[i] + half[i]), abs=1e-9)
    assert stats.arm_period_fit(long[long["order"] == "ABC"], "A") is None  # one order: confounded


def _crossover(repeats: int, effect: float, shift: float, seed: int) -> pd.DataFrame:
    """A two-arm crossover of ``repeats`` (AB, BA, …), its last two repeats in a shorter
    window whose level is ``shift`` apart, the same in both arms; ``acceptance`` per phase."""
    rng = np.random.default_rng(seed)
    rows = []
    for rep in range(1, repeats + 1):
        order = "AB" if rep % 2 else "BA"
        window = 40.0 if rep > repeats - 2 else 60.0
        for arm in order:
            acceptance = rng.normal(2.4, 0.1)
            value = 1.0 + effect * (arm == "B") + shift * (window < 60) + 0.5 * acceptance + rng.normal(0, 0.01)
            rows += [
                (order, rep, arm, "J/token", "J/token", value, window),
                (order, rep, arm, "acceptance length", "tokens/draft", acceptance, window),
            ]
    return pd.DataFrame(rows, columns=["order", "rep", "arm", "metric", "unit", "value", stats.WINDOW])


@pytest.mark.parametrize("seed", range(3))
def test_a_level_shift_between_windows_is_a_term_of_the_fit_not_residual(seed):
    shifted, level = _crossover(6, -0.05, -0.2, seed), _crossover(6, -0.05, 0.0, seed)
    for adjusted in (False, True):
        if adjusted:
            effects = {
                name: stats.covariate_effects(frame, "A", ["J/token"], ["acceptance length"])[("J/token", "B")]
                for name, frame in (("shifted", shifted), ("level", level))
            }
        else:
            effects = {
                name: stats.arm_effects(frame[frame["metric"] == "J/token"], "A")[("J/token", "B")]
                for name, frame in (("shifted", shifted), ("level", level))
            }
        # the shift is the same in both arms of its block: the window term takes all of it
        assert effects["shifted"]["diff"] == pytest.approx(effects["level"]["diff"], abs=1e-9)
        assert effects["shifted"]["se"] == pytest.approx(effects["level"]["se"], rel=1e-6)
        assert "window" in effects["shifted"]["method"]
    jtoken = shifted[shifted["metric"] == "J/token"]
    with_term = stats.arm_effects(jtoken, "A")[("J/token", "B")]
    without = stats.arm_effects(jtoken.drop(columns=stats.WINDOW), "A")[("J/token", "B")]
    assert "window" not in without["method"] and without["se"] > 2 * with_term["se"]  # the shift in the residual
    one_window = level[level["rep"] <= 4]
    assert "window" not in stats.arm_effects(one_window, "A")[("J/token", "B")]["method"]


def test_repeats_needed_is_the_closed_form_normal_approximation():
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)
    for sd in (0.3, 1.0, 2.7, 10.0):
        for difference in (-4.0, 0.25, 1.0, 3.3, 12.0):
            expected = max(2, math.ceil(2 * (z * sd / difference) ** 2))
            assert stats.repeats_needed(sd, difference) == expected
    assert stats.repeats_needed(0.0, 1.0) == 2 and math.isnan(stats.repeats_needed(1.0, 0.0))


def long_values(values: dict, metric="stall gaps", unit="gaps") -> pd.DataFrame:
    return pd.DataFrame(
        [
            ("AB", rep, arm, metric, unit, value)
            for arm, series in values.items()
            for rep, value in enumerate(series, 1)
        ],
        columns=["order", "rep", "arm", "metric", "unit", "value"],
    )


def test_no_share_of_a_reference_that_cannot_be_told_from_zero():
    """A stall in one of three stock phases (mean 0.33, its own interval −1.1 to 1.8): "+2900 %"
    of that would be noise over noise, so there is no %, the finding is judged in gaps and no
    phases-needed figure rests on it; the difference itself stands."""
    row = difference_row(long_values({"A": [0, 1, 0], "B": [10, 9, 11]}))
    assert row["diff"] == pytest.approx(29 / 3)
    assert math.isnan(row["diff_pct"]) and math.isnan(row["ci_low_pct"]) and math.isnan(row["repeats_needed"])
    assert row["finding"] == stats.REAL
    verdict = summary.verdicts(stats.compare(long_values({"A": [0, 1, 0], "B": [10, 9, 11]}), ARMS, "A")).iloc[-1]
    assert "+10 gaps (no % of stock: its mean cannot be told from zero)" in verdict
    assert verdict.endswith(
        "beyond restart variance (the larger sd between repeats of an arm): patched is higher than stock."
    )


@pytest.mark.parametrize("reference", [[4, 5, 6], [-5, -5.1, -4.9], [0.01, 0.0101, 0.0099]])
def test_a_share_of_a_reference_clear_of_zero(reference):
    """Doubling a reference whose interval is clear of zero, however small or negative: +100 %."""
    row = difference_row(long_values({"A": reference, "B": [2 * v for v in reference]}, "x", "W"))
    assert row["diff_pct"] == pytest.approx(100.0)


def test_a_gain_over_a_reference_near_zero_is_no_throughput_loss():
    """The reference barely served (its throughput cannot be told from zero, so there is no
    %): the arm that serves is not excluded from the best setting as a "loss"."""
    temperature = phases({"A": 90, "B": 80}, 0.3, 3, 1)
    throughput = long_values({"A": [0.0, 0.2, 0.0], "B": [80.0, 81.0, 79.0]}, "output throughput", "tok/s")
    variance = stats.compare(pd.concat([temperature, throughput]), ARMS, "A")
    row = variance[(variance["metric"] == "output throughput") & (variance["arm"] == "B")].iloc[0]
    assert math.isnan(row["diff_pct"]) and row["finding"] == stats.REAL
    best = stats.best_setting(variance, ARMS, "A", "head TSOC mean")
    assert best["arm"] == "B" and best["excluded"] == {}
