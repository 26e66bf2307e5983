"""The decision rule of ``until: decided`` alone, simulated (issue 24): crossover pairs of
phases with 5 % CV, the OLS arm + position estimate at each look, the question ``lower``
tested at the look's α.  With no true difference a wrong ``yes`` stays at most 5 %; with a
true 10 % difference the median phases to a decision is below a fixed design's of the same
power."""

import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.power import TTestIndPower
from statsmodels.stats.proportion import proportion_confint

from thermab.analysis import questions, sequential, stats

MEAN, CV = 100.0, 0.05
MAX_REPEATS = 8


def crossover(rng, diff: float, repeats: int, period: float = 1.0) -> pd.DataFrame:
    """Phases of A (reference) and B = A + diff, in the crossover orders, a drift per position."""
    rows = []
    for rep in range(1, repeats + 1):
        order = sequential.order_of_repeat("AB", rep)
        for position, arm in enumerate(order):
            value = MEAN + diff * (arm == "B") + period * position + rng.normal(0, CV * MEAN)
            rows.append({"order": order, "rep": rep, "arm": arm, "metric": "m", "unit": "u", "value": value})
    return pd.DataFrame(rows)


def ols_effect(frame: pd.DataFrame) -> tuple[float, float, float]:
    """B − A of ``value ~ arm + position`` by least squares (what stats.arm_period_fit fits,
    here in numpy: 16,000 formula fits would take minutes)."""
    position = np.array([o.index(a) for o, a in zip(frame["order"], frame["arm"])], float)
    return _least_squares(frame["value"].to_numpy(float), (frame["arm"] == "B").to_numpy(float), position)


def _least_squares(y, is_b, position) -> tuple[float, float, float]:
    design = np.c_[np.ones(len(y)), is_b, position]
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    df = len(y) - design.shape[1]
    residual = y - design @ beta
    cov = residual @ residual / df * np.linalg.inv(design.T @ design)
    return float(beta[1]), float(math.sqrt(cov[1, 1])), float(df)


def sequential_run(rng, diff: float) -> tuple[str, int]:
    """(final verdict, phases run) of one experiment under the decision rule."""
    frame = crossover(rng, diff, MAX_REPEATS)  # in time order: a look at r repeats sees the first 2r phases
    y, is_b = frame["value"].to_numpy(float), (frame["arm"] == "B").to_numpy(float)
    position = np.array([o.index(a) for o, a in zip(frame["order"], frame["arm"])], float)
    alphas = sequential.look_alphas("AB", MAX_REPEATS)
    repeats, verdict = sequential.looks("AB", MAX_REPEATS)[0], questions.UNDECIDED
    while repeats is not None:
        seen = 2 * repeats
        if alphas[repeats] > 0:
            low, high = questions.interval(*_least_squares(y[:seen], is_b[:seen], position[:seen]), alphas[repeats])
            verdict = questions.verdict("lower", -1, 0.0, low, high)
        repeats = sequential.next_repeats("AB", MAX_REPEATS, repeats, [verdict])
    return verdict, seen


def test_the_simulations_estimate_is_the_analysis_estimate():
    frame = crossover(np.random.default_rng(0), -10.0, 4)
    effect = stats.arm_effects(frame, "A")[("m", "B")]
    assert ols_effect(frame) == pytest.approx((effect["diff"], effect["se"], effect["df"]))


def test_the_looks_spend_alpha_once():
    alphas = sequential.look_alphas("AB", MAX_REPEATS)
    assert list(alphas) == [2, 4, 6, 8] and alphas[2] == 0  # 1 residual df: no look worth spending on
    assert sum(alphas.values()) == pytest.approx(questions.ALPHA)
    assert sequential.williams_orders("AB") == ["AB", "BA"]
    orders = sequential.williams_orders("ABCD")
    assert orders[0] == "ABCD" and len(orders) == 4
    for arm in "ABCD":  # every arm once in every position
        assert sorted(o.index(arm) for o in orders) == [0, 1, 2, 3]
    # every ordered pair of neighbours once (carry-over balanced)
    assert len({(o[i], o[i + 1]) for o in orders for i in range(3)}) == 12
    assert len(sequential.williams_orders("ABC")) == 6
    assert sequential.next_repeats("AB", 8, 4, ["yes", "no"]) is None
    assert sequential.next_repeats("AB", 8, 4, ["yes", "undecided"]) == 6
    assert sequential.next_repeats("AB", 8, 8, ["undecided"]) is None


def test_no_true_difference_gives_a_wrong_yes_at_most_5_percent():
    rng = np.random.default_rng(24)
    n = 2000
    wrong = sum(sequential_run(rng, 0.0)[0] == questions.YES for _ in range(n))
    low, high = proportion_confint(wrong, n, alpha=0.05, method="wilson")
    print(f"wrong yes for 'lower' under no difference: {wrong}/{n} = {wrong / n:.3f} "
          f"(95 % Wilson interval {low:.3f}–{high:.3f})")
    assert wrong / n <= 0.05


def test_a_true_difference_is_decided_in_fewer_phases_than_a_fixed_design_of_the_same_power():
    rng = np.random.default_rng(10)
    runs = [sequential_run(rng, -0.10 * MEAN) for _ in range(500)]
    power = np.mean([verdict == questions.YES for verdict, _ in runs])
    median_phases = float(np.median([phases for _, phases in runs]))
    # the fixed design with the same power: one-sided t test at 5 %, effect 10 % / 5 % CV = 2 sd
    per_arm = TTestIndPower().solve_power(effect_size=0.10 / CV, alpha=0.05, power=min(power, 0.99),
                                          alternative="larger")
    fixed_phases = 2 * math.ceil(per_arm)
    print(f"10 % difference at 5 % CV: power {power:.3f}, median {median_phases:.0f} phases to a decision; "
          f"a fixed design of that power: {fixed_phases} phases")
    assert median_phases < fixed_phases


def test_crossover_phases_alternate_and_chain():
    from thermab.experiment import plan

    assert [p.id for p in plan.phases("AB", 3, crossover=True)] == ["rep1-A", "rep1-B", "rep2-B", "rep2-A",
                                                                    "rep3-A", "rep3-B"]
    assert [p.id for p in plan.phases("AB", 2)] == ["rep1-A", "rep1-B", "rep2-A", "rep2-B"]
    assert plan.previous("AB", 2, "B", crossover=True) == "rep1-B"
    assert plan.previous("AB", 2, "A", crossover=True) == "rep2-B"


def test_an_interrupted_sequential_run_resumes_at_its_look(tmp_path):
    def done(*ids):
        for phase_id in ids:
            (tmp_path / "phases" / phase_id).mkdir(parents=True, exist_ok=True)
            (tmp_path / "phases" / phase_id / "phase.json").write_text("{}")

    def answered(phases_per_arm, *verdicts):
        (tmp_path / "tables").mkdir(exist_ok=True)
        pd.DataFrame({"phases_per_arm": phases_per_arm, "verdict": list(verdicts)}).to_csv(
            tmp_path / "tables" / "questions.csv", index=False)

    assert sequential.resume_repeats(tmp_path, "AB", 8) == 2
    done("rep1-A", "rep1-B", "rep2-B")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 2  # rep2-A was interrupted: redo it
    done("rep2-A")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 2  # its look has not been analysed yet
    answered(2, "yes", "undecided")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 4
    answered(2, "yes", "no")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 2  # decided: stay
    answered(2, "yes", "undecided")
    done("rep3-A")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 4
    assert sequential.look_alpha("AB", 8, 5) == sequential.look_alphas("AB", 8)[4]
