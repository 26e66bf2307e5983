"""The decision rule of ``until: decided`` alone, simulated: repeats of phases in crossover
order (AB, BA, …) with unit sd between phases and a drift per position, the OLS arm +
position estimate at each look (after every repeat from 3), the question ``lower``
(superiority, bound 0) tested at the look's nominal α, stopping at the first ``yes`` or
``no`` or at 8 repeats (16 phases).  A non-inferiority question is the same test with its
bound moved by the margin, so the effect ``d`` below is the distance from the decisive
bound in sd of a phase.

What the simulation measured (seeds fixed; 50,000 null experiments per design, 4,000 per
effect; one-sided α = 0.05, at most 8 repeats = 16 phases):

* a wrong ``yes`` with no true difference: the rule (Pocock-type spending, information in
  residual df less one) 0.0486 (95 % Wilson 0.0467–0.0505); the same on plain residual df
  0.0513 (0.0494–0.0532), on repeats 0.0575 (0.0555–0.0596); O'Brien–Fleming-type 0.0505
  (0.0486–0.0524); Bonferroni 0.0283 (0.0269–0.0298); a fixed design of 16 phases 0.0496
  (0.0478–0.0516);
* power / median phases to a decision at the study's effects (d: distance from the decisive
  bound in sd of a phase, from the default study's until=decided run):

  =========================================  ==========  ===============  ==========  ==========
  effect                                     rule        O'Brien–Fleming  Bonferroni  fixed 16
  =========================================  ==========  ===============  ==========  ==========
  energy per token lower, d = 0.79           0.345 / 16  0.421 / 16       0.242 / 16  0.441 / 16
  throughput non-inferior, d = 0.94          0.428 / 16  0.516 / 16       0.301 / 16  0.546 / 16
  probe decode speed non-inferior, d = 1.9   0.934 / 10  0.969 / 12       0.881 / 10  0.974 / 16
  10 % at 5 % CV, d = 2                      0.959 / 8   0.979 / 12       0.912 / 10  0.983 / 16
  =========================================  ==========  ===============  ==========  ==========

  The rule spends α nearly evenly, so it decides large effects sooner and, at the cap, says
  ``yes`` less often to effects barely decidable in 16 phases than O'Brien–Fleming-type
  spending, which keeps α for the last look: the trade a budget-bound study makes
  (docs/statistics.md).  At d ≈ 0.8–0.9 a fixed design needs 15 (d = 0.94) and 21
  (d = 0.79) phases per arm for 80 % power.
"""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from scipy.stats import multivariate_normal
from statsmodels.stats.power import TTestIndPower
from statsmodels.stats.proportion import proportion_confint

from support.crossover import PERIOD, design, least_squares
from thermab.analysis import questions, sequential, stats
from thermab.errors import UserError

MAX_REPEATS = 8
# d of the default study's open and nearly open questions (tables/questions.csv of its run
# with until=decided, 8 repeats): distance from the decisive bound / residual sd of a phase
STUDY_EFFECTS = {
    "cluster energy per token lower": 0.79,
    "output throughput non-inferior": 0.94,
    "probe decode speed non-inferior": 1.9,
    "10 % at 5 % CV": 2.0,
}
FIXED = "fixed 16 phases"


def simulate(seed: int, d: float, method: str, n: int, information: str = sequential.INFORMATION):
    """(final verdicts, phases run) of ``n`` experiments with B − A = −d sd under the rule
    with ``method``'s look levels; ``FIXED``: one test at α after all 16 phases."""
    is_b, position = design(MAX_REPEATS)
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(n, len(is_b))) - d * is_b + PERIOD * position
    levels = (
        {MAX_REPEATS: questions.ALPHA}
        if method == FIXED
        else sequential.look_alphas("AB", MAX_REPEATS, method=method, information=information)
    )
    verdicts = np.full(n, questions.UNDECIDED, dtype=object)
    phases = np.full(n, 2 * MAX_REPEATS)
    open_ = np.ones(n, bool)
    for repeats, alpha in levels.items():
        seen = 2 * repeats
        if alpha > 0:
            estimate, se, df = least_squares(y[open_, :seen], is_b[:seen], position[:seen])
            half = questions.interval(0.0, 1.0, df, alpha)[1]  # the look's t quantile, as the analysis takes it
            found = [
                questions.verdict("lower", -1, 0.0, e - half * s, e + half * s)
                for e, s in zip(estimate, se, strict=False)
            ]
            verdicts[open_] = found
        now = open_ & (verdicts != questions.UNDECIDED)
        phases[now] = seen
        open_ &= ~now
        if repeats >= MAX_REPEATS or sequential.next_repeats("AB", MAX_REPEATS, repeats, [questions.UNDECIDED]) is None:
            break
    return verdicts, phases


def test_the_simulations_estimate_is_the_analysis_estimate():
    is_b, position = design(4)
    values = np.random.default_rng(0).normal(size=len(is_b)) - 2.0 * is_b + PERIOD * position
    frame = pd.DataFrame(
        {
            "order": [sequential.order_of_repeat("AB", rep) for rep in range(1, 5) for _ in "AB"],
            "rep": [rep for rep in range(1, 5) for _ in "AB"],
            "arm": ["B" if b else "A" for b in is_b],
            "metric": "m",
            "unit": "u",
            "value": values,
        }
    )
    effect = stats.arm_effects(frame, "A")[("m", "B")]
    estimate, se, df = least_squares(values[None, :], is_b, position)
    assert (estimate[0], se[0], df) == pytest.approx((effect["diff"], effect["se"], effect["df"]))


def test_the_boundaries_are_lan_demets_spending():
    # O'Brien–Fleming-type spending, 4 equally spaced looks, one-sided 0.025: the published
    # boundaries (Jennison & Turnbull; gsDesign's sfLDOF) 4.3326, 2.9631, 2.3590, 2.0141
    fractions = [0.25, 0.5, 0.75, 1.0]
    obrien_fleming = sequential.boundaries(fractions, 0.025, sequential.OBRIEN_FLEMING)
    assert obrien_fleming == pytest.approx([4.3326, 2.9631, 2.3590, 2.0141], abs=2e-4)
    # independently: the chance of any crossing of either boundary under the null is α
    # (scipy's multivariate normal, corr √(tⱼ/tₖ))
    t = np.array(fractions)
    corr = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for method in (sequential.OBRIEN_FLEMING, sequential.POCOCK):
        bounds = sequential.boundaries(fractions, 0.05, method)
        assert 1 - multivariate_normal.cdf(bounds, cov=corr, abseps=1e-6, releps=1e-6) == pytest.approx(
            0.05, abs=1e-4
        ), method
    pocock = sequential.boundaries(fractions, 0.05, sequential.POCOCK)
    assert pocock == sorted(pocock, reverse=True) and pocock[0] - pocock[-1] < 0.1  # Pocock-type: nearly flat
    assert sequential.spent(1.0) == pytest.approx(questions.ALPHA) and sequential.spent(0.0) == 0.0


def test_the_looks_test_at_the_boundarys_nominal_levels():
    alphas = sequential.look_alphas("AB", MAX_REPEATS)
    # a look after every repeat from the first with 3 residual df (3 repeats of two arms)
    assert list(alphas) == [3, 4, 5, 6, 7, 8]
    # Pocock-type: nearly the same level at every look, most of α within reach of the first
    levels = list(alphas.values())
    assert all(0.01 < a < questions.ALPHA for a in levels) and max(levels) / min(levels) < 1.6
    # on the df-less-one scale they rise: a later look never tests the same phases at a smaller α
    assert levels == sorted(levels)
    obrien_fleming = sequential.look_alphas("AB", MAX_REPEATS, method=sequential.OBRIEN_FLEMING)
    assert obrien_fleming[3] < alphas[3] / 10  # strict early, keeping α for looks a budget may never reach
    assert list(sequential.look_alphas("ABC", 4)) == [3, 4]  # three arms: 2 residual df at 2 repeats, 5 at 3
    bonferroni = sequential.look_alphas("AB", MAX_REPEATS, method=sequential.BONFERRONI)
    assert sum(bonferroni.values()) == pytest.approx(questions.ALPHA)
    assert sequential.look_alpha("AB", 8, 5) == alphas[5] and sequential.look_alpha("AB", 8, 2) == 0.0
    assert sequential.williams_orders("AB") == ["AB", "BA"]
    orders = sequential.williams_orders("ABCD")
    assert orders[0] == "ABCD" and len(orders) == 4
    for arm in "ABCD":  # every arm once in every position
        assert sorted(o.index(arm) for o in orders) == [0, 1, 2, 3]
    # every ordered pair of neighbours once (carry-over balanced)
    assert len({(o[i], o[i + 1]) for o in orders for i in range(3)}) == 12
    assert len(sequential.williams_orders("ABC")) == 6
    assert sequential.next_repeats("AB", 8, 4, ["yes", "no"]) is None
    assert sequential.next_repeats("AB", 8, 4, ["yes", "undecided"]) == 5
    assert sequential.next_repeats("AB", 8, 8, ["undecided"]) is None


def test_no_true_difference_gives_a_wrong_yes_at_the_nominal_level():
    """Test: the rule's one-sided ``lower`` at α = 0.05 over its looks (3 to 8 repeats);
    n = 50,000 experiments with B = A for each design.  The rule's wrong-yes rate has a 95 %
    Wilson interval that holds 0.05 (or lies below it) and reaches above 0.045 (it spends its
    α, unlike Bonferroni).  Also printed: the same boundaries with information counted in
    residual df and in repeats (the textbook's for a known variance), which let more through."""
    n = 50_000
    designs = {
        "rule": (sequential.METHOD, sequential.INFORMATION),
        "Pocock-type on df": (sequential.POCOCK, sequential.DF),
        "Pocock-type on repeats": (sequential.POCOCK, sequential.REPEATS),
        "O'Brien–Fleming-type": (sequential.OBRIEN_FLEMING, sequential.INFORMATION),
        "O'Brien–Fleming-type on df": (sequential.OBRIEN_FLEMING, sequential.DF),
        "Bonferroni": (sequential.BONFERRONI, sequential.INFORMATION),
        FIXED: (FIXED, sequential.INFORMATION),
    }
    rates = {}
    for name, (method, information) in designs.items():
        verdicts, _ = simulate(24, 0.0, method, n, information)
        wrong = int((verdicts == questions.YES).sum())
        rates[name] = (wrong / n, *proportion_confint(wrong, n, alpha=0.05, method="wilson"))
    table = "; ".join(f"{m}: {r:.4f} (Wilson 95 % {lo:.4f}–{hi:.4f})" for m, (r, lo, hi) in rates.items())
    looks = ", ".join(str(r) for r, a in sequential.look_alphas("AB", MAX_REPEATS).items() if a > 0)
    print(
        f"test: one-sided t of 'lower' on the OLS arm + position estimate, looks at {looks} repeats; "
        f"level: alpha = {questions.ALPHA} over all looks; n = {n} null experiments each; "
        f"wrong yes (95 % Wilson binomial interval): {table}"
    )
    rate, low, high = rates["rule"]
    assert low <= questions.ALPHA, table
    assert high >= 0.045, f"the rule does not spend its α: {table}"
    assert rates["Bonferroni"][2] < questions.ALPHA, table


def test_power_and_phases_at_the_studys_effects():
    """Power (a ``yes``) and median phases to a decision at the study's effects, for the rule
    (O'Brien–Fleming-type), Pocock-type, Bonferroni and a fixed design of 16 phases; n = 4,000
    experiments each.  The rule has more power than Bonferroni at every effect, and at the
    a 10 % difference at 5 % CV (d = 2) decides in fewer phases than a fixed design of
    the same power (one-sided t test at 5 %, statsmodels' TTestIndPower)."""
    n = 4000
    rows = []
    for seed, (name, d) in enumerate(STUDY_EFFECTS.items()):
        for method in (*sequential.METHODS, FIXED):
            verdicts, phases = simulate(100 + seed, d, method, n)
            rows.append(
                {
                    "effect": name,
                    "d": d,
                    "method": method,
                    "power": float((verdicts == questions.YES).mean()),
                    "median_phases": float(np.median(phases)),
                    "mean_phases": float(phases.mean()),
                }
            )
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    power = table.pivot(index="effect", columns="method", values="power")
    assert (power[sequential.METHOD] > power[sequential.BONFERRONI]).all(), table.to_string()
    case = table[(table["d"] == 2.0) & (table["method"] == sequential.METHOD)].iloc[0]
    per_arm = TTestIndPower().solve_power(
        effect_size=2.0, alpha=0.05, power=min(case["power"], 0.99), alternative="larger"
    )
    fixed_phases = 2 * math.ceil(per_arm)
    assert case["median_phases"] < fixed_phases, (
        f"d = 2: power {case['power']:.3f}, median {case['median_phases']:.0f} phases; a fixed design of that "
        f"power needs {fixed_phases}"
    )


def test_crossover_phases_alternate_and_chain():
    from thermab.experiment import plan

    assert [p.id for p in plan.phases("AB", 3, crossover=True)] == [
        "rep1-A",
        "rep1-B",
        "rep2-B",
        "rep2-A",
        "rep3-A",
        "rep3-B",
    ]
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
            tmp_path / "tables" / "questions.csv", index=False
        )

    assert sequential.resume_repeats(tmp_path, "AB", 8) == 3
    done("rep1-A", "rep1-B", "rep2-B", "rep2-A", "rep3-A")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 3  # rep3-B was interrupted: redo it
    done("rep3-B")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 3  # its look has not been analysed yet
    answered(3, "yes", "undecided")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 4
    answered(3, "yes", "no")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 3  # decided: stay
    answered(3, "yes", "undecided")
    done("rep4-B")
    assert sequential.resume_repeats(tmp_path, "AB", 8) == 4
    assert sequential.look_alpha("AB", 8, 5) == sequential.look_alphas("AB", 8)[5]


def answered_run(tmp_path, content: bytes):
    for phase_id in ("rep1-A", "rep1-B", "rep2-B", "rep2-A", "rep3-A", "rep3-B"):
        (tmp_path / "phases" / phase_id).mkdir(parents=True, exist_ok=True)
        (tmp_path / "phases" / phase_id / "phase.json").write_text("{}")
    (tmp_path / "tables").mkdir(exist_ok=True)
    (tmp_path / "tables" / "questions.csv").write_bytes(content)


CELLS = st.one_of(st.sampled_from(["yes", "no", "undecided", "3", "2.5", "-1", "nan", ""]), st.text(max_size=4))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=60),
        st.lists(st.tuples(CELLS, CELLS), max_size=4).map(
            lambda rows: ("phases_per_arm,verdict\n" + "".join(f"{a},{b}\n" for a, b in rows)).encode()
        ),
        st.sampled_from([b"verdict\nyes\n", b"phases_per_arm\n3\n", b"\xff\xfe\x00garbage", b""]),
    )
)
def test_a_damaged_questions_csv_is_one_line_naming_it_never_decided(tmp_path, content):
    """Whatever questions.csv holds, the next look is read from it only where it is a table
    of whole phase counts and verdicts; otherwise one UserError naming the file."""
    answered_run(tmp_path, content)
    path = tmp_path / "tables" / "questions.csv"
    try:
        reached = sequential.resume_repeats(tmp_path, "AB", 8)
    except UserError as error:
        assert str(error).startswith(f"{path}: ") and "\n" not in str(error)
        return
    answers = sequential.read_answers(path)
    assert set(answers["verdict"]) <= {"yes", "no", "undecided"}
    still_open = len(answers) and answers["phases_per_arm"].max() >= 3 and (answers["verdict"] == "undecided").any()
    assert reached == (4 if still_open else 3)
