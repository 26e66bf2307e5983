"""Speed taken apart: the per-phase acceptance, steps and tokens per step from the server's
rates, empty with the reason where they cannot be read; the acceptance balance check; and
speed adjusted for what each restart draws (ANCOVA on the acceptance length), its wrong-yes
rate simulated over crossover experiments with the simulated server's restart draws."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as scipy_stats
from scipy.stats import binomtest

from support.crossover import adjusted_least_squares, design, least_squares
from support.paths import REPO
from thermab import metric_names as names
from thermab.analysis import questions, speed, stats
from thermab.analysis.model import Plan
from thermab.config import ConfigError, default_questions, question_words, validate
from thermab.report import summary
from thermab.sim import restart
from thermab.telemetry import server_metrics

WINDOWS = pd.DataFrame(
    {"order": ["AB", "AB"], "rep": [0, 0], "arm": ["A", "B"], "load_start": [0.0, 100.0], "load_end": [50.0, 150.0]}
)


def server(phases: dict) -> pd.DataFrame:
    """Tidy server rows: phase start → {sensor: value at every second of the window}."""
    rows = []
    for start, sensors in phases.items():
        for sensor, value in sensors.items():
            rows += [(start + t + 0.5, "head", "server", sensor, value) for t in range(40)]
    return pd.DataFrame(rows, columns=["t", "host", "kind", "sensor", "value"])


HEALTHY = {"spec_drafts_s": 40.0, "spec_accepted_s": 56.0, "engine_steps_s": 10.0, "generation_tok_s": 95.0}


def test_each_phase_gets_acceptance_length_steps_and_tokens_per_step():
    table = speed.phase_speed(server({0.0: HEALTHY, 100.0: {**HEALTHY, "spec_accepted_s": 40.0}}), WINDOWS, "head")
    assert list(table["acceptance_length"]) == pytest.approx([2.4, 2.0])
    assert list(table["engine_steps_s"]) == pytest.approx([10.0, 10.0])
    assert list(table["tokens_per_step"]) == pytest.approx([9.5, 9.5])
    assert list(table["reason"]) == ["", ""]
    long = speed.phase_metrics(table)
    assert set(long["metric"]) == {names.ACCEPTANCE_LENGTH, names.ENGINE_STEPS, names.TOKENS_PER_STEP}


def test_a_server_without_spec_decoding_has_steps_but_no_acceptance_and_says_why():
    plain = {"engine_steps_s": 10.0, "generation_tok_s": 40.0}
    table = speed.phase_speed(server({0.0: plain, 100.0: plain}), WINDOWS, "head")
    assert table["acceptance_length"].isna().all()
    assert list(table["tokens_per_step"]) == pytest.approx([4.0, 4.0])
    assert set(table["reason"]) == {speed.NO_SPEC}
    rows = speed.not_measured(table, {"A": {"label": "stock"}, "B": {"label": "patched"}})
    assert list(rows["metric"]) == [names.ACCEPTANCE_LENGTH] * 2
    assert rows["mean"].isna().all()
    assert all(speed.NO_SPEC in reasons for reasons in rows[speed.NOT_MEASURED])
    assert all(verdict.startswith("not measured: ") for verdict in summary.verdicts(rows))


def test_counters_that_went_back_in_one_phase_empty_the_acceptance_of_every_phase():
    faulty = {**HEALTHY, server_metrics.SPEC_FAULT: 1.0}
    del faulty["spec_drafts_s"], faulty["spec_accepted_s"]
    table = speed.phase_speed(server({0.0: HEALTHY, 100.0: faulty}), WINDOWS, "head")
    assert table["acceptance_length"].isna().all()  # measured in one phase only: no comparison
    assert "went back within the phase" in table["reason"][1]
    assert all("acceptance length not measured in rep0-B" in reason for reason in table["reason"])
    assert table["engine_steps_s"].notna().all()


def test_no_scrape_at_all_is_empty_with_the_reason():
    table = speed.phase_speed(server({}), WINDOWS, "head")
    assert table[list(speed.VALUES)].isna().all().all()
    assert set(table["reason"]) == {speed.NO_SCRAPE}
    assert speed.not_measured(table, {"A": {}, "B": {}}).empty  # speed.csv says why; variance.csv as it was


@pytest.mark.parametrize(
    "low, high, state",
    [(-1.0, 1.5, "balanced"), (-3.0, 1.0, "undecided"), (2.0, 5.0, "unbalanced"), (math.nan, math.nan, "undecided")],
)
def test_tost_states(low, high, state):
    assert speed.tost(low, high, 2.0) == state


DEFAULT_CONFIG = yaml.safe_load((REPO / "config/config.yaml").read_text())


@pytest.mark.parametrize("margin", [-1, math.nan, math.inf, 100, 250, "2"])
def test_a_bad_acceptance_margin_is_a_one_line_config_error(margin):
    config = copy.deepcopy(DEFAULT_CONFIG)
    config["analysis"]["acceptance_margin_pct"] = margin
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert "'analysis.acceptance_margin_pct'" in str(error.value) and "\n" not in str(error.value)


def test_the_acceptance_margin_and_the_restart_switch_have_defaults():
    config = validate(copy.deepcopy(DEFAULT_CONFIG))
    assert config["analysis"]["acceptance_margin_pct"] == 2.0
    assert config["clusters"]["sim"]["hosts"]["head"]["restart_variance"] is True
    off = copy.deepcopy(DEFAULT_CONFIG)
    off["clusters"]["sim"]["hosts"]["head"]["restart_variance"] = "no"
    with pytest.raises(ConfigError, match="'clusters.sim.hosts.head.restart_variance'"):
        validate(off)


# ---- the decision rule, simulated ------------------------------------------------------

USERS = 4
STEPS_S = 25.0  # a 40-ms step
REPEATS = 8  # AB, BA, ... : 8 phases per arm, orders pooled
EXPERIMENTS = 20_000
ALPHA = 0.05
PROBE_CV = 0.04  # the probes' own spread (a median of 3 probes, each drawing its drafts)
PROBE_STEP_CV = 0.028  # their steps' jitter, which their acceptance does not see (test_decision_time.py)
POOL = 20_000  # server starts drawn by the simulated server's own restart.draw, sampled from


def start_pool(seed: int, acceptance: float = restart.ACCEPTANCE) -> tuple[np.ndarray, np.ndarray]:
    """(mean acceptance length, step factor) of POOL starts of the simulated server."""
    rng = random.Random(seed)
    starts = [restart.draw(rng, acceptance=acceptance) for _ in range(POOL)]
    return (
        np.array([restart.acceptance_length(start.acceptance) for start in starts]),
        np.array([start.step_factor for start in starts]),
    )


def experiments(seed: int, b_steps: float = 1.0, b_acceptance: float = restart.ACCEPTANCE) -> dict:
    """EXPERIMENTS crossover experiments of REPEATS repeats (AB, BA, …), each phase a fresh
    start of the simulated server: per phase the measured acceptance length and the three
    metrics the adjustment is for.  Arm B's steps are ``b_steps`` times arm A's, its starts
    drawn around ``b_acceptance``."""
    is_b, position = design(REPEATS)
    rng = np.random.default_rng(seed)
    shape = (EXPERIMENTS, len(is_b))
    pools = [start_pool(seed), start_pool(seed + 1, b_acceptance)]
    pick = rng.integers(0, POOL, shape)
    length = np.where(is_b == 1, pools[1][0][pick], pools[0][0][pick])
    factor = np.where(is_b == 1, pools[1][1][pick], pools[0][1][pick])

    def noise(cv):
        return 1 + cv * rng.standard_normal(shape)

    steps = STEPS_S * np.where(is_b == 1, b_steps, 1.0) / factor * noise(0.005)
    throughput = steps * USERS * length * noise(0.01)
    probes_length = length * noise(PROBE_CV)  # the start's acceptance and the probes' own luck
    return {
        "is_b": is_b,
        "position": position,
        names.ACCEPTANCE_LENGTH: length * noise(0.005),
        names.PROBE_ACCEPTANCE_LENGTH: probes_length,
        names.OUTPUT_THROUGHPUT: throughput,
        names.PROBE_DECODE_SPEED: steps * probes_length * noise(PROBE_STEP_CV),
        names.CLUSTER_ENERGY_PER_TOKEN: 250.0 * noise(0.002) / throughput,
    }


def verdicts_of(fit, phases: dict, question: dict) -> np.ndarray:
    """Each experiment's verdict from its (estimate, se, df) at α, the margin in % of its
    reference arm's mean, as the run states it."""
    estimate, se, df = fit
    reference = phases[question["metric"]][:, phases["is_b"] == 0].mean(axis=1)
    margin = question.get("margin_pct", 0.0) / 100 * reference
    half = scipy_stats.t.ppf(1 - ALPHA, df) * se
    sign = questions.gain_sign(question)
    return np.array(
        [
            questions.verdict(question["kind"], sign, m, e - h, e + h)
            for m, e, h in zip(margin, estimate, half, strict=True)
        ]
    )


def decide(phases: dict, question: dict, own: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The run's rule on every experiment: the arm's effect on acceptance (the phase's and,
    for the probes, their own: speed.covariates_of) tested two-sided at α; where none is
    seen, the question answered on the effect adjusted for the metric's own acceptance, else
    on the raw one, whose yes needs the adjusted one's too.  (verdicts, adjusted?)."""
    is_b, position, y = phases["is_b"], phases["position"], phases[question["metric"]]
    measures = speed.OWN_MEASURE.get(question["metric"], {}) if own else {}
    own = measures.get(names.ACCEPTANCE_LENGTH, names.ACCEPTANCE_LENGTH)
    adjusted = np.ones(len(y), bool)
    for covariate in dict.fromkeys([names.ACCEPTANCE_LENGTH, own]):
        moved_estimate, moved_se, moved_df = least_squares(phases[covariate], is_b, position)
        adjusted &= 2 * scipy_stats.t.sf(np.abs(moved_estimate) / moved_se, moved_df) >= ALPHA
    raw = verdicts_of(least_squares(y, is_b, position), phases, question)
    fitted = verdicts_of(adjusted_least_squares(y, is_b, position, phases[own]), phases, question)
    confirmed = np.where((raw == questions.YES) & (fitted != questions.YES), questions.UNDECIDED, raw)
    return np.where(adjusted, fitted, confirmed), adjusted


QUESTIONS = {q["metric"]: q for q in default_questions() if q["metric"] in names.ADJUSTED}
# each speed question at its null (a true loss of exactly its margin, or no gain where it
# asks for one), the arms' acceptance drawn alike: every yes is wrong
NULLS = {
    names.OUTPUT_THROUGHPUT: 1 - QUESTIONS[names.OUTPUT_THROUGHPUT]["margin_pct"] / 100,
    names.PROBE_DECODE_SPEED: 1 - QUESTIONS[names.PROBE_DECODE_SPEED]["margin_pct"] / 100,
    names.CLUSTER_ENERGY_PER_TOKEN: 1.0,
}


def test_the_simulated_restarts_carry_a_seven_per_cent_throughput_cv_mostly_in_acceptance():
    phases = experiments(3)
    a = phases["is_b"] == 0
    throughput, acceptance = phases[names.OUTPUT_THROUGHPUT][:, a], phases[names.ACCEPTANCE_LENGTH][:, a]
    cv = float(throughput.std() / throughput.mean())
    share = float(acceptance.std() / acceptance.mean()) / cv
    print(f"restart CV of throughput {cv:.1%}, of acceptance length {share * cv:.1%}")
    assert 0.06 < cv < 0.085 and share > 0.75


@pytest.mark.parametrize("metric", list(NULLS))
def test_the_adjusted_answer_keeps_wrong_yes_at_alpha_at_each_speed_null(metric):
    """20,000 crossover experiments of 8 phases per arm at the question's null: a wrong yes
    at most α (its exact binomial 95 % interval printed, reaching down to α), and the
    adjustment used in about 95 % of them (the acceptance test's own level)."""
    verdicts, adjusted = decide(experiments(17, b_steps=NULLS[metric]), QUESTIONS[metric])
    yes = int((verdicts == questions.YES).sum())
    low, high = binomtest(yes, EXPERIMENTS).proportion_ci(0.95, method="exact")
    print(
        f"{question_words(QUESTIONS[metric])} at its null: wrong yes {yes}/{EXPERIMENTS} = {yes / EXPERIMENTS:.2%}"
        f" (95 % CI {low:.2%} to {high:.2%}), adjusted in {adjusted.mean():.1%}"
    )
    assert low <= ALPHA and yes / EXPERIMENTS <= ALPHA + 0.005
    tests = 1 if metric not in speed.OWN_MEASURE else 2  # the probes' own acceptance is tested too
    assert 1 - tests * ALPHA - 0.02 < adjusted.mean() < 1 - ALPHA + 0.02


def test_the_adjustment_decides_where_the_raw_answer_cannot():
    """At the study's small effect (−0.7 %), 8 phases per arm: the adjusted answer says yes
    to 'no worse than 5 %' far more often than the raw one."""
    phases = experiments(19, b_steps=0.993)
    question = QUESTIONS[names.OUTPUT_THROUGHPUT]
    adjusted = decide(phases, question)[0] == questions.YES
    raw = verdicts_of(least_squares(phases[question["metric"]], phases["is_b"], phases["position"]), phases, question)
    print(f"yes at −0.7 %: adjusted rule {adjusted.mean():.1%}, raw {np.mean(raw == questions.YES):.1%}")
    assert adjusted.mean() > np.mean(raw == questions.YES) + 0.2


def test_the_probes_own_acceptance_decides_their_speed_where_the_phases_cannot():
    """At the study's small effect (−0.7 %), 8 phases per arm: 'probe decode speed no worse
    than 6 %' adjusted for the probes' own acceptance (their luck with their drafts taken
    out) says yes far more often than adjusted for the phase's."""
    phases = experiments(31, b_steps=0.993)
    question = QUESTIONS[names.PROBE_DECODE_SPEED]
    own = np.mean(decide(phases, question)[0] == questions.YES)
    phase = np.mean(decide(phases, question, own=False)[0] == questions.YES)
    print(f"probe speed yes at −0.7 %: adjusted for the probes' own acceptance {own:.1%}, for the phase's {phase:.1%}")
    assert own > phase + 0.2


@pytest.mark.parametrize("metric", [names.OUTPUT_THROUGHPUT, names.PROBE_DECODE_SPEED])
def test_an_arm_that_moves_acceptance_gets_no_adjusted_yes(metric):
    """Arm B's drafter accepts 0.42 where A's accepts 0.60, its steps as fast: its
    throughput and its probes' speed are far lower, all of it through the acceptance.
    Adjusted, they would look no worse; the acceptance test sees the move, so no experiment
    is adjusted and none says yes."""
    phases = experiments(23, b_acceptance=0.42)
    verdicts, adjusted = decide(phases, QUESTIONS[metric])
    assert not adjusted.any()
    assert not (verdicts == questions.YES).any()


def test_the_numpy_fit_is_stats_covariate_effects():
    phases = experiments(29)
    is_b, position = phases["is_b"], phases["position"]
    order = ["AB" if (p == 0) != bool(b) else "BA" for b, p in zip(is_b, position, strict=True)]
    rows = []
    for metric in (names.OUTPUT_THROUGHPUT, names.ACCEPTANCE_LENGTH):
        for phase, (o, b) in enumerate(zip(order, is_b, strict=True)):
            rows.append((o, phase // 2, "B" if b else "A", metric, "", float(phases[metric][0, phase])))
    long = pd.DataFrame(rows, columns=["order", "rep", "arm", "metric", "unit", "value"])
    fitted = stats.covariate_effects(long, "A", [names.OUTPUT_THROUGHPUT], [names.ACCEPTANCE_LENGTH])
    effect = fitted[(names.OUTPUT_THROUGHPUT, "B")]
    numpy_fit = adjusted_least_squares(
        phases[names.OUTPUT_THROUGHPUT][:1], is_b, position, phases[names.ACCEPTANCE_LENGTH][:1]
    )
    assert (effect["diff"], effect["se"], effect["df"]) == pytest.approx(
        (numpy_fit[0][0], numpy_fit[1][0], numpy_fit[2])
    )
    assert effect["method"] == "ANCOVA arm + position + covariates"


def _effects(acceptance_diff: float, acceptance_se: float = 0.01) -> tuple[dict, pd.DataFrame]:
    """The raw effects of a two-phase-per-arm crossover and its long table, acceptance
    moved by ``acceptance_diff`` as far as the raw effect says."""
    rows = []
    for rep, order in enumerate(["AB", "BA", "AB", "BA"]):
        for arm in order:
            length = 2.4 + (0.003 * rep) - (0.002 * (arm == "B"))
            rows.append((order, rep, arm, names.ACCEPTANCE_LENGTH, "tokens/draft", length))
            rows.append((order, rep, arm, names.OUTPUT_THROUGHPUT, "tok/s", 90 * length + rep + (arm == "B")))
    long = pd.DataFrame(rows, columns=["order", "rep", "arm", "metric", "unit", "value"])
    effects = stats.arm_effects(long, "A")
    effects[(names.ACCEPTANCE_LENGTH, "B")] = {
        **effects[(names.ACCEPTANCE_LENGTH, "B")],
        "diff": acceptance_diff,
        "se": acceptance_se,
    }
    return effects, long


def test_adjusted_effects_say_which_answer_and_why():
    covariates = [names.ACCEPTANCE_LENGTH]

    def words(effect):
        fields = (effect.get("adjustment_covariate", ""), effect.get("adjustment_p", math.nan))
        return summary.adjustment_words(effect["adjustment"], *fields, covariates)

    effects, long = _effects(0.0)
    chosen = speed.adjusted_effects(effects, long, "A", covariates, ALPHA)[(names.OUTPUT_THROUGHPUT, "B")]
    assert chosen["adjustment"] == speed.ADJUSTED and words(chosen) == "adjusted for acceptance length"
    assert chosen["method"].startswith("ANCOVA") and chosen["raw"] is effects[(names.OUTPUT_THROUGHPUT, "B")]
    moved = speed.adjusted_effects(*_effects(0.1), "A", covariates, ALPHA)[(names.OUTPUT_THROUGHPUT, "B")]
    assert moved["adjustment"] == speed.RAW_MOVED_CONFIRM and moved["adjustment_p"] < ALPHA
    assert words(moved).startswith("raw: the arm moves acceptance length (two-sided t, p = ")
    assert words(moved).endswith("; a yes needs the adjusted too")
    assert moved["diff"] == effects[(names.OUTPUT_THROUGHPUT, "B")]["diff"]
    declared = speed.adjusted_effects(effects, long, "A", [], ALPHA)[(names.OUTPUT_THROUGHPUT, "B")]
    assert declared["adjustment"] == speed.RAW_NO_COVARIATES
    assert words(declared).startswith("raw: analysis.covariates is empty")
    unmeasured = {key: value for key, value in effects.items() if key[0] != names.ACCEPTANCE_LENGTH}
    missing = speed.adjusted_effects(unmeasured, long, "A", covariates, ALPHA)[(names.OUTPUT_THROUGHPUT, "B")]
    assert missing["adjustment"] == speed.RAW_NOT_MEASURED
    assert words(missing) == "raw: no acceptance length measured"


def test_the_probes_speed_is_adjusted_for_their_own_acceptance_where_every_phase_has_it():
    rows = []
    for rep, order in enumerate(["AB", "BA", "AB", "BA"]):
        for arm in order:
            server_length, luck = 2.4 + 0.003 * rep, 0.05 * ((rep + (arm == "B")) % 3 - 1)
            rows += [
                (order, rep, arm, names.ACCEPTANCE_LENGTH, "tokens/draft", server_length),
                (order, rep, arm, names.PROBE_ACCEPTANCE_LENGTH, "tokens/step", server_length + luck),
                (order, rep, arm, names.PROBE_DECODE_SPEED, "tok/s", 24 * (server_length + luck) + 0.01 * rep),
            ]
    long = pd.DataFrame(rows, columns=["order", "rep", "arm", "metric", "unit", "value"])
    covariates = [names.ACCEPTANCE_LENGTH]
    assert speed.covariates_of(names.PROBE_DECODE_SPEED, covariates, long) == [names.PROBE_ACCEPTANCE_LENGTH]
    assert speed.covariates_of(names.OUTPUT_THROUGHPUT, covariates, long) == covariates
    effects = stats.arm_effects(long, "A")
    chosen = speed.adjusted_effects(effects, long, "A", covariates, ALPHA)[(names.PROBE_DECODE_SPEED, "B")]
    assert chosen["adjustment"] == speed.ADJUSTED
    assert chosen["adjustment_covariate"] == names.PROBE_ACCEPTANCE_LENGTH
    # their own luck is in the covariate: the adjusted effect is the steps' (none), the raw one is not
    assert abs(chosen["diff"]) < abs(chosen["raw"]["diff"]) / 10
    assert summary.adjustment_words(chosen["adjustment"], chosen["adjustment_covariate"], math.nan, covariates) == (
        "adjusted for probe acceptance length"
    )
    moved = {**effects, (names.PROBE_ACCEPTANCE_LENGTH, "B"): {**effects[(names.PROBE_ACCEPTANCE_LENGTH, "B")]}}
    moved[(names.PROBE_ACCEPTANCE_LENGTH, "B")].update(diff=0.5, se=0.01)
    refused = speed.adjusted_effects(moved, long, "A", covariates, ALPHA)[(names.PROBE_DECODE_SPEED, "B")]
    assert refused["adjustment"] == speed.RAW_MOVED_CONFIRM
    assert refused["adjustment_covariate"] == names.PROBE_ACCEPTANCE_LENGTH
    # a phase without the probes' own: the phase's acceptance for every phase, none dropped
    partial = long.drop(long[(long["metric"] == names.PROBE_ACCEPTANCE_LENGTH) & (long["rep"] == 0)].index)
    assert speed.covariates_of(names.PROBE_DECODE_SPEED, covariates, partial) == covariates


@pytest.mark.parametrize(
    "covariates, words",
    [
        (["no such metric"], "is no per-phase metric"),
        ([names.OUTPUT_THROUGHPUT], "is itself a question's or an adjusted metric"),
        (["head TSOC mean"], "is itself a question's or an adjusted metric"),
    ],
)
def test_a_covariate_that_is_no_phase_metric_or_a_questions_is_a_one_line_config_error(covariates, words):
    config = copy.deepcopy(DEFAULT_CONFIG)
    config["analysis"]["covariates"] = covariates
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert "'analysis.covariates.0'" in str(error.value) and words in str(error.value)
    assert "\n" not in str(error.value)


def test_the_summary_reports_the_acceptance_check_without_gating_on_it():
    run = Plan({"arms": {"A": {"label": "stock"}, "B": {"label": "patched"}, "C": {"label": "other"}}})
    balance = speed.balance_frame(
        {
            "B": {"state": "balanced", "low_pct": -1.0, "high_pct": 1.5, "margin_pct": 2.0, "n": 8},
            "C": {"state": "unbalanced", "low_pct": -30.0, "high_pct": -20.0, "margin_pct": 2.0, "n": 8},
        },
        "A",
    )
    text = "\n".join(summary.balance_section(balance, run))
    assert "B (patched) vs A: mean acceptance length -1.0 % to +1.5 %" in text and ": balanced" in text
    assert "C (other) vs A: mean acceptance length -30.0 % to -20.0 %" in text and "**unbalanced**" in text
    assert "reported, not a gate" in text
    assert summary.balance_section(speed.balance_frame({}, "A"), run) == []
