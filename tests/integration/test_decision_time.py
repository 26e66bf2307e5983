"""The whole rule of ``until: decided`` with a cluster-time budget, simulated with restart
variance as a parameter: crossover pairs of phases (AB, BA, …) whose values carry a spread
within the phase and a spread between restarts (each phase its own restart, a CV of the
mean), the OLS arm + position estimate at each look, the look's nominal α of the rule's
Pocock-type spending (``sequential.look_alphas``), a stop at the first decision, at
``max_repeats`` or where the budget has no room for the next look (``planning.Timings``).
The question is the default study's throughput one: non-inferior within 5 % (higher is
better).

Figures (seeds fixed; printed by the tests; within-phase CV 1 %):

* a wrong ``yes`` with the true effect on the margin (−5 %), 20,000 experiments each:
  printed with its 95 % Wilson interval for restart CV 0, 3.5 % and 7 %, with and without a
  budget that cuts the looks short;
* cluster-hours to a decision against the fixed design of equal power (80 %), at no true
  difference: the fixed design's phases from ``TTestIndPower``, the rule's ``max_repeats``
  the fewest whose simulated power reaches the fixed design's, each phase job the default
  config's load and full cooldown × its time scale;
* the default study's six questions with each block's load window chosen at the look before
  it (analysis/phase_length.py): a wrong ``yes`` with each speed question at its null, and
  cluster-hours against the full window at equal power (docs/benchmarks.md).
"""

import copy
import math

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from support.crossover import PERIOD, adjusted_least_squares, design, least_squares
from support.paths import REPO, default_config
from thermab import metric_names as names
from thermab.analysis import metrics, phase_length, planning, questions, sequential
from thermab.config import default_questions, first_testing_repeats, question_words, repeats_in_budget, validate

MARGIN = 0.05  # of the reference mean
WITHIN_CV = 0.01
DEFAULT = default_config()
TIMINGS = DEFAULT["timings"]
JOB_S = TIMINGS["load_s"] + TIMINGS["cooldown_max_s"]  # a phase job at the default timings, cooldown in full
STUDY = planning.Timings(TIMINGS["baseline_s"], JOB_S, 0, TIMINGS["time_scale"])


def phase_values(seed: int, n: int, repeats: int, effect: float, restart_cv: float) -> np.ndarray:
    """``n`` experiments of ``repeats`` crossover repeats: per phase 1 + effect (arm B) + a
    drift along the order + the within-phase and the restart spread, relative to the mean."""
    is_b, position = design(repeats)
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, WITHIN_CV, (n, len(is_b))) + rng.normal(0, restart_cv, (n, len(is_b)))
    sd = math.hypot(WITHIN_CV, restart_cv)
    return 1 + effect * is_b + PERIOD * sd * position + noise


def rule(values: np.ndarray, max_repeats: int, budget_hours: float | None = None):
    """(verdicts, repeats run) of the rule on every row of ``values`` (B − A, the question
    non-inferior within MARGIN, higher better)."""
    n = len(values)
    is_b, position = design(max_repeats)
    levels = sequential.look_alphas("AB", max_repeats)
    cap = max_repeats
    if budget_hours is not None:
        cap = min(cap, STUDY.repeats_within(budget_hours, 2))
    verdicts = np.full(n, questions.UNDECIDED, dtype=object)
    repeats = np.full(n, 0)
    open_ = np.ones(n, bool)
    for look, alpha in levels.items():
        if look > cap:
            break
        repeats[open_] = look
        if alpha > 0:
            seen = 2 * look
            estimate, se, df = least_squares(values[open_, :seen], is_b[:seen], position[:seen])
            half = questions.interval(0.0, 1.0, df, alpha)[1]
            verdicts[open_] = [
                questions.verdict("non_inferior", 1, MARGIN, e - half * s, e + half * s)
                for e, s in zip(estimate, se, strict=False)
            ]
        open_ &= verdicts == questions.UNDECIDED
    return verdicts, repeats


@pytest.mark.parametrize("restart_cv", [0.0, 0.035, 0.07])
@pytest.mark.parametrize("budget_hours", [None, 20.0])
def test_no_more_than_five_per_cent_wrong_yes_with_restart_variance_and_a_budget(restart_cv, budget_hours):
    n, max_repeats = 20_000, 16
    verdicts, repeats = rule(phase_values(11, n, max_repeats, -MARGIN, restart_cv), max_repeats, budget_hours)
    wrong = int((verdicts == questions.YES).sum())
    low, high = proportion_confint(wrong, n, method="wilson")
    print(
        f"restart CV {restart_cv:.1%}, budget {budget_hours or 'none'} h (≤ {repeats.max()} repeats):"
        f" wrong yes {wrong / n:.4f} (95 % Wilson {low:.4f}–{high:.4f}) of {n}"
    )
    assert low < questions.ALPHA and wrong / n <= questions.ALPHA + 0.005


def power_and_repeats(d_cv: float, max_repeats: int, n: int = 4000):
    verdicts, repeats = rule(phase_values(5, n, max_repeats, 0.0, d_cv), max_repeats)
    return float((verdicts != questions.UNDECIDED).mean()), repeats


@pytest.mark.parametrize("restart_cv", [0.02, 0.035, 0.07])
def test_cluster_hours_to_a_decision_against_the_fixed_design_at_equal_power(restart_cv):
    sd = math.hypot(WITHIN_CV, restart_cv)
    fixed = int(math.ceil(questions.phases_needed(MARGIN, sd) / 2) * 2)
    fixed_power = _fixed_power(fixed, restart_cv)
    cap = fixed
    while (power := power_and_repeats(restart_cv, cap))[0] < fixed_power - 0.01 and cap < 4 * fixed:
        cap += 2
    rule_power, repeats = power
    median = float(np.median(repeats))
    hours = STUDY.hours(median, 2), STUDY.hours(fixed, 2)
    print(
        f"restart CV {restart_cv:.1%}: fixed {fixed} repeats (power {fixed_power:.3f}, {hours[1]:.1f} h);"
        f" the rule with max_repeats {cap}: power {rule_power:.3f}, median {median:.0f} repeats ({hours[0]:.1f} h)"
    )
    assert rule_power >= fixed_power - 0.02
    assert median <= fixed


def _fixed_power(repeats: int, restart_cv: float, n: int = 4000) -> float:
    """One test at α after ``repeats`` repeats, no looks before."""
    values = phase_values(5, n, repeats, 0.0, restart_cv)
    is_b, position = design(repeats)
    estimate, se, df = least_squares(values, is_b, position)
    half = questions.interval(0.0, 1.0, df, questions.ALPHA)[1]
    return float((estimate - half * se > -MARGIN).mean())


def test_the_default_time_scale_is_the_simulated_clusters():
    from thermab.sim.node import TIME_COMPRESSION

    assert TIMINGS["time_scale"] == TIME_COMPRESSION


# The default study's six questions under the whole rule with each block's window chosen at
# the look before it (analysis/phase_length.py), against the same rule at the full window.
LOAD_S, MIN_LOAD_S = TIMINGS["load_s"], TIMINGS["min_load_s"]
# the probes' own spread (their median of 3), whatever the window: all of it their own drafts'
# luck (thermab.sim.vllm.accepted_tokens over 256-token probes: 6.4 % a probe, 4.2 % the
# median of 3), which their own acceptance length measures; beside it their step time's
# jitter (another stream's prefill lengthens a step now and then, the host's scheduling): in
# the one-night run their speed over their own tokens per step spread 3.7 % between phases,
# the restart's step draw ~2.5 % of it
PROBE_CV = 0.04
PROBE_STEP_CV = 0.028
POWER_CV = 0.002  # a window's mean power, beside its tokens
SIX = default_questions(DEFAULT["analysis"]["timeline_zone"])
HEAT_LIKE = [q["metric"] for q in SIX if q["metric"] not in names.BETWEEN_RESTARTS]
# per metric: the reference's level and a phase's own spread (°C, % of a core, gaps); the
# speed and per-token ones are relative to a mean of 1, their spread the restart draw's
LEVEL = {
    names.zone_mean("head", "TSOC"): (80.0, 0.3),
    names.cpu_median("head"): (400.0, 5.0),
    names.STALL_GAPS: (0.0, 0.1),
}
STUDY_EFFECTS = {  # B − A as the default study measured them (docs/benchmarks.md)
    names.zone_mean("head", "TSOC"): -8.8,
    names.cpu_median("head"): -189.0,
    names.STALL_GAPS: 0.0,
    names.OUTPUT_THROUGHPUT: -0.007,
    names.PROBE_DECODE_SPEED: -0.007,
    # at the nodes' plugs, the default config's meters: the patched arm's cluster power −3.9 %
    # (262 against 272 W in the one-night run), less throughput's −0.7 %
    names.CLUSTER_ENERGY_PER_TOKEN: -0.032,
}
# each speed question at its null: a yes is wrong (heat, CPU and gaps as measured, so that
# they are decided at the first look that tests and the windows shorten after it)
NULL_EFFECTS = {
    **STUDY_EFFECTS,
    names.OUTPUT_THROUGHPUT: -0.05,
    names.PROBE_DECODE_SPEED: -0.06,
    names.CLUSTER_ENERGY_PER_TOKEN: 0.0,
}


def _margin(question: dict) -> float:
    """The margin in the metric's unit: the speed metrics' mean is 1."""
    return question["margin_pct"] / 100 if "margin_pct" in question else question.get("margin", 0.0)


ACCEPTANCE_SHARE = 0.064 / 0.073  # of the restart CV, the simulated server's draw (docs/simulation.md)


PROBE_S = 5.0  # a probe of the simulated cluster, one after another (docs/planning.md: ~7 of 9 end in 40 s)
# a speed-only job beyond its window: the restart (~3 s) and the wait for the requests in flight
# at the window's end (~6 s): the one-night run's 40-s speed-only jobs took 45–51 s
SPEED_ONLY_OVERHEAD_S = 8.0
FULL_JOB_S = 88.0  # the same run's full jobs, restart and heat cooldown included: 85–90 s (the price's most is 100)


def probes_ended(window_s: np.ndarray) -> np.ndarray:
    """Of the 3 × ``load.probe_n`` probes a speed-only phase asks from 10 % of its window (plan.
    SPEED_ONLY_PROBES, SPEED_ONLY_PROBE_AT), the ones that end inside it: at least one."""
    asked = 3 * DEFAULT["load"]["probe_n"]
    return np.clip(np.floor(0.9 * window_s / PROBE_S), 1, asked)


# what a shorter window moves by itself, the same in both arms (relative to a mean of 1): a
# speed-only phase's 3 × 3 probes beside the load make more tokens per joule (J/token
# 0.94–1.01 in the speed-only phases of the one-night run against 1.01–1.29 in the full ones,
# docs/benchmarks.md) and take a little of the load's throughput
WINDOW_SHIFT = {names.CLUSTER_ENERGY_PER_TOKEN: -0.10, names.OUTPUT_THROUGHPUT: -0.02}


def six_questions(
    seed,
    n,
    max_repeats,
    effects,
    restart_cv,
    min_load_s=MIN_LOAD_S,
    adjusted=False,
    cheaper_speed=False,
    stop_at=None,
    levels=None,
    probes_own=True,
):
    """``n`` runs of ``until: decided`` (AB, BA, … to ``max_repeats``) of the six questions, each
    block of phases at the window ``phase_length.next_window_s`` gives at the look before it
    (``min_load_s`` ≥ LOAD_S: the full window always).  A phase: the metric's level + effect
    (arm B) + a drift along the order + its own spread; throughput 1 + the restart draw (CV
    ``restart_cv``) + the window's noise (WITHIN_CV at LOAD_S, × √(LOAD_S / window)), whose
    batch-means estimate has 5 df; energy per token the same draws with the opposite sign plus
    the power's; the probes' speed the restart draw plus their own.  Heat, CPU and gaps are
    tested on the full-window phases only.  ``adjusted``: the restart draw is the drafter's
    acceptance (ACCEPTANCE_SHARE of its variance) and the step time's, the phase's measured
    acceptance the covariate of the speed questions (analysis/speed.py; the arms draw it
    alike, so the rule adjusts), the probes' speed adjusted for the probes' own acceptance
    (the restart's draw and their own luck) where ``probes_own``, else for the phase's.
    ``cheaper_speed``: a speed-only phase (its window below
    LOAD_S) has no cooldown but SPEED_ONLY_OVERHEAD_S, and its probes' median is over the
    ``probes_ended`` of its window (their spread × √(probe_n / that)).  ``stop_at``: the run
    stops after the look at these repeats, as a budget that has no room for the next look
    stops it.  ``levels``: repeat → the α of
    its look, ``sequential.look_alphas`` where None.  Returns (final verdicts, a yes at any
    look: both (n, 6), repeats run, cluster-hours)."""
    is_b, position = design(max_repeats)
    phases = len(is_b)
    rng = np.random.default_rng(seed)
    draws = {q["metric"]: rng.standard_normal((n, phases)) for q in SIX}
    acceptance = restart_cv * math.sqrt(ACCEPTANCE_SHARE) * rng.standard_normal((n, phases))
    steps = restart_cv * math.sqrt(1 - ACCEPTANCE_SHARE) * rng.standard_normal((n, phases))
    restart = acceptance + steps
    measured = acceptance + 0.002 * rng.standard_normal((n, phases))  # the counters' own noise
    probe_steps = rng.standard_normal((n, phases))
    power = POWER_CV * rng.standard_normal((n, phases))
    se_draw = np.sqrt(rng.chisquare(metrics.BATCHES - 1, (n, phases)) / (metrics.BATCHES - 1))
    window = np.full((n, phases), float(LOAD_S))
    levels = sequential.look_alphas("AB", max_repeats) if levels is None else levels
    verdicts = np.full((n, len(SIX)), questions.UNDECIDED, dtype=object)
    ever_yes = np.zeros((n, len(SIX)), bool)
    repeats, open_ = np.zeros(n, int), np.ones(n, bool)
    speed_sd = math.hypot(WITHIN_CV, restart_cv)
    for look, alpha in levels.items():
        seen = 2 * look
        repeats[open_] = look
        within = WITHIN_CV * np.sqrt(LOAD_S / window[:, :seen])
        speed_only = cheaper_speed & (window < LOAD_S)
        probe_scale = np.where(speed_only, np.sqrt(DEFAULT["load"]["probe_n"] / probes_ended(window)), 1.0)
        drift = PERIOD * position[:seen]
        throughput = 1 + restart[:, :seen] + within * draws[names.OUTPUT_THROUGHPUT][:, :seen]
        shorter = window[:, :seen] < LOAD_S
        probes_luck = PROBE_CV * probe_scale[:, :seen] * draws[names.PROBE_DECODE_SPEED][:, :seen]
        covariate = {names.PROBE_DECODE_SPEED: measured[:, :seen] + probes_luck if probes_own else measured[:, :seen]}
        values = {
            names.OUTPUT_THROUGHPUT: throughput + speed_sd * drift,
            names.CLUSTER_ENERGY_PER_TOKEN: 2 - throughput + power[:, :seen] + speed_sd * drift,
            names.PROBE_DECODE_SPEED: 1
            + restart[:, :seen]
            + probes_luck
            + PROBE_STEP_CV * probe_scale[:, :seen] * probe_steps[:, :seen]
            + math.hypot(PROBE_CV, restart_cv) * drift,
            **{metric: level + sd * (draws[metric][:, :seen] + drift) for metric, (level, sd) in LEVEL.items()},
        }
        if alpha > 0:
            for column, question in enumerate(SIX):
                metric = question["metric"]
                y = values[metric] + effects[metric] * is_b[:seen] + WINDOW_SHIFT.get(metric, 0.0) * shorter
                # experiments grouped by which phases ran the shorter window: heat, CPU and gaps
                # on the full ones only, speed and energy per token on all with a window term
                every = metric in names.BETWEEN_RESTARTS
                for pattern in np.unique(shorter[open_], axis=0):
                    rows = open_ & (shorter == pattern).all(axis=1)
                    mask = np.ones(seen, bool) if every else ~pattern
                    if mask.sum() - 3 < sequential.MIN_DF:
                        continue
                    estimate, se, df = adjusted_least_squares(
                        y[rows][:, mask],
                        is_b[:seen][mask],
                        position[:seen][mask],
                        covariate.get(metric, measured[:, :seen])[rows][:, mask]
                        if adjusted and metric in names.ADJUSTED
                        else None,
                        pattern[mask],
                    )
                    if df < sequential.MIN_DF:
                        continue
                    half = questions.interval(0.0, 1.0, df, alpha)[1]
                    sign, margin = questions.gain_sign(question), _margin(question)
                    verdicts[rows, column] = [
                        questions.verdict(question["kind"], sign, margin, e - half * s, e + half * s)
                        for e, s in zip(estimate, se, strict=True)
                    ]
            ever_yes |= verdicts == questions.YES
        open_ &= (verdicts == questions.UNDECIDED).any(axis=1)
        if look == max_repeats or not open_.any() or look == stop_at:
            break
        if alpha == 0:  # nothing tested yet, heat open: the next block runs the full window
            continue
        # the next block's window, from what this look saw of the throughput
        se = within * se_draw[:, :seen]
        within_1s = np.sqrt(np.mean(se**2 * window[:, :seen], axis=1))
        _e, effect_se, _df = least_squares(throughput + speed_sd * drift, is_b[:seen], position[:seen])
        between = effect_se / math.sqrt(2 / look)
        restart_seen = np.sqrt(np.maximum(0.0, between**2 - np.mean(se**2, axis=1)))
        following = 2 * next(r for r in levels if r > look)
        for row in np.flatnonzero(open_):
            undecided = [q["metric"] for q, v in zip(SIX, verdicts[row], strict=True) if v == questions.UNDECIDED]
            window[row, seen:following] = phase_length.next_window_s(
                undecided, within_1s[row], restart_seen[row], LOAD_S, min_load_s
            )
    cooldown = np.where(cheaper_speed & (window < LOAD_S), SPEED_ONLY_OVERHEAD_S, FULL_JOB_S - LOAD_S)
    run_s = TIMINGS["baseline_s"] + np.array(
        [np.sum(window[row, : 2 * repeats[row]] + cooldown[row, : 2 * repeats[row]]) for row in range(n)]
    )
    return verdicts, ever_yes, repeats, run_s * TIMINGS["time_scale"] / 3600


def test_the_window_chosen_per_look_keeps_wrong_yes_at_five_per_cent():
    n, max_repeats, restart_cv = 4000, 16, 0.07
    verdicts, ever_yes, repeats, _hours = six_questions(13, n, max_repeats, NULL_EFFECTS, restart_cv)
    for column, question in enumerate(SIX):
        if question["metric"] not in names.BETWEEN_RESTARTS:
            assert (verdicts[:, column] == questions.YES).all(), "heat, CPU and gaps decided as measured"
            continue
        wrong = int((verdicts[:, column] == questions.YES).sum())
        low, high = proportion_confint(wrong, n, method="wilson")
        print(
            f"window per look, restart CV {restart_cv:.0%}, {question_words(question)} at its null:"
            f" wrong yes {wrong / n:.4f} (95 % Wilson {low:.4f}–{high:.4f}) of {n};"
            f" a yes at any look {ever_yes[:, column].mean():.4f}; median {np.median(repeats):.0f} repeats"
        )
        assert low < questions.ALPHA and wrong / n <= questions.ALPHA + 0.005


def _power(verdicts: np.ndarray) -> float:
    """The share of runs that answer every question yes (the study's effects: all are)."""
    return float((verdicts == questions.YES).all(axis=1).mean())


def _fewest_repeats(min_load_s: int, target: float, n: int) -> tuple[int, float, np.ndarray, np.ndarray]:
    """The fewest ``max_repeats`` (whole blocks) whose runs reach ``target`` power, by bisection
    on the same draws: (max_repeats, power, repeats run, cluster-hours)."""
    low, high = 2, 80
    while high - low > 2:
        middle = (low + high) // 4 * 2
        verdicts, _ever, _repeats, _hours = six_questions(5, n, middle, STUDY_EFFECTS, 0.07, min_load_s)
        low, high = (low, middle) if _power(verdicts) >= target else (middle, high)
    verdicts, _ever, repeats, hours = six_questions(5, n, high, STUDY_EFFECTS, 0.07, min_load_s)
    return high, _power(verdicts), repeats, hours


def test_the_window_chosen_per_look_takes_fewer_cluster_hours_at_equal_power():
    """The six questions at the study's effects, restart CV 7 %: the full window always
    (``min_load_s`` = ``load_s``) and the window per look, each with the fewest
    ``max_repeats`` that reach the power of the other (60 % for the full window first: 80 %
    needs more than the search's 80 repeats without the adjustment)."""
    n = 1000  # each bisection step simulates up to 80 repeats of every run: 2,000 took 3.5 min in the suite
    cap, power, repeats, hours = _fewest_repeats(LOAD_S, 0.6, n)
    cap_per_look, power_per_look, repeats_per_look, hours_per_look = _fewest_repeats(MIN_LOAD_S, power - 0.01, n)
    for what, c, p, r, h in (
        (f"full {LOAD_S}-s window", cap, power, repeats, hours),
        (f"window per look (floor {MIN_LOAD_S} s)", cap_per_look, power_per_look, repeats_per_look, hours_per_look),
    ):
        print(
            f"{what}: max_repeats {c}, all six yes {p:.3f}, median {np.median(r):.0f} repeats,"
            f" {np.median(h):.1f} cluster-hours (quartiles {np.quantile(h, 0.25):.1f}–{np.quantile(h, 0.75):.1f})"
        )
    assert power_per_look >= power - 0.02
    assert np.median(hours_per_look) < np.median(hours)


def test_speed_adjusted_for_acceptance_decides_the_six_in_fewer_cluster_hours():
    """The six questions at the study's effects, restart CV 7 % (the acceptance carrying most
    of it), the window per look, ``max_repeats`` 16: all six yes more often and sooner with
    the speed questions adjusted for the acceptance than raw, and sooner still with cheaper
    speed-only phases (cluster-hours printed with quartiles, docs/benchmarks.md); and at each
    speed question's null the whole rule's wrong yes stays at α."""
    n, cap = 2000, 16
    results = {}
    for adjusted, cheaper in ((False, False), (True, False), (True, True)):
        verdicts, _ever, repeats, hours = six_questions(
            5, n, cap, STUDY_EFFECTS, 0.07, adjusted=adjusted, cheaper_speed=cheaper
        )
        results[adjusted, cheaper] = (_power(verdicts), np.median(hours))
        what = ("adjusted" if adjusted else "raw") + (", cheaper speed-only phases" if cheaper else "")
        print(
            f"{what}: all six yes {_power(verdicts):.3f}, median {np.median(repeats):.0f}"
            f" repeats, {np.median(hours):.1f} cluster-hours (quartiles {np.quantile(hours, 0.25):.1f}–"
            f"{np.quantile(hours, 0.75):.1f})"
        )
    raw, adjusted, cheaper = results[False, False], results[True, False], results[True, True]
    assert adjusted[0] > raw[0] and adjusted[1] < raw[1]
    assert cheaper[0] >= adjusted[0] - 0.02 and cheaper[1] < adjusted[1]
    verdicts, _ever, _repeats, _hours = six_questions(13, n, cap, NULL_EFFECTS, 0.07, adjusted=True, cheaper_speed=True)
    for column, question in enumerate(SIX):
        if question["metric"] in names.ADJUSTED:
            wrong = int((verdicts[:, column] == questions.YES).sum())
            low, _high = proportion_confint(wrong, n, method="wilson")
            print(f"adjusted, {question_words(question)} at its null: wrong yes {wrong / n:.4f} of {n}")
            assert low < questions.ALPHA


BUDGET_HOURS = 8.0


def _budget_table(name: str, verdicts: np.ndarray, hours: np.ndarray) -> float:
    """Prints a schedule's line of the budget's table; returns its share of runs with all
    six yes within BUDGET_HOURS (a run past them the budget stop ends undecided)."""
    within = float(((verdicts == questions.YES).all(axis=1) & (hours <= BUDGET_HOURS)).mean())
    print(
        f"{name}: all six yes within {BUDGET_HOURS:g} h {within:.3f},"
        f" per question {np.round((verdicts == questions.YES).mean(axis=0), 3).tolist()},"
        f" cluster-hours median {np.median(hours):.2f} (quartiles {np.quantile(hours, 0.25):.2f}–"
        f"{np.quantile(hours, 0.75):.2f})"
    )
    return within


def _pairs(cap: int) -> list[int]:
    """Looks after every crossover pair and at ``cap``: the schedule the rule's looks replace."""
    return sorted({*range(2, cap + 1, 2), cap})


def test_the_levers_of_a_one_night_budget():
    """``until=decided budget_hours=8`` on the default config, simulated (adjusted for
    acceptance, cheaper speed-only phases, restart CV 7 %, the study's effects): the three
    levers one at a time and together, each with its own ``max_repeats`` (the budget's at
    the full price of every phase, 4, or ``config.budget_repeats``'s, which prices the
    phases after the first testing look as speed-only, 11): looks after every repeat from 3
    (the first at 5.2 h, not 6.8), Pocock-type spending (α within reach of the looks a night
    holds), and the cheaper price.  Together they decide all six yes within the budget
    most often; and without a budget (``max_repeats`` 16) the rule's median cluster-hours
    against pairs with O'Brien–Fleming (docs/benchmarks.md)."""
    config = validate({**copy.deepcopy(DEFAULT), "until": "decided", "budget_hours": BUDGET_HOURS}, REPO)
    fits = config["max_repeats"]
    room_s = BUDGET_HOURS * 3600 / TIMINGS["time_scale"] - TIMINGS["baseline_s"]
    full_price = repeats_in_budget(room_s, 2, JOB_S, JOB_S, first_testing_repeats(2))
    assert (full_price, fits) == (4, 11)
    obf, pocock = sequential.OBRIEN_FLEMING, sequential.POCOCK
    schedules = {
        "pairs, O'Brien–Fleming, full price (max_repeats 4)": (full_price, obf, _pairs(full_price)),
        "every repeat, O'Brien–Fleming, full price (4)": (full_price, obf, None),
        "every repeat, Pocock, full price (4)": (full_price, pocock, None),
        f"every repeat, O'Brien–Fleming, speed-only price ({fits})": (fits, obf, None),
        f"pairs, Pocock, speed-only price ({fits})": (fits, pocock, _pairs(fits)),
        f"every repeat, Pocock, speed-only price ({fits}): the rule": (fits, pocock, None),
    }
    n, within = 2000, {}
    for name, (cap, method, points) in schedules.items():
        levels = sequential.look_alphas("AB", cap, method=method, points=points)
        verdicts, _ever, _repeats, hours = six_questions(
            5, n, cap, STUDY_EFFECTS, 0.07, adjusted=True, cheaper_speed=True, levels=levels
        )
        within[name] = _budget_table(f"budget {BUDGET_HOURS:g} h, {name}", verdicts, hours)
    rule = within.pop(f"every repeat, Pocock, speed-only price ({fits}): the rule")
    assert rule > max(within.values())
    for name, method, points in (
        ("pairs, O'Brien–Fleming", obf, _pairs(16)),
        ("every repeat, Pocock: the rule", pocock, None),
    ):
        levels = sequential.look_alphas("AB", 16, method=method, points=points)
        verdicts, _ever, _repeats, hours = six_questions(
            5, n, 16, STUDY_EFFECTS, 0.07, adjusted=True, cheaper_speed=True, levels=levels
        )
        decided = (verdicts != questions.UNDECIDED).all(axis=1)
        print(
            f"no budget, max_repeats 16, {name}: all six decided {decided.mean():.3f}, all yes {_power(verdicts):.3f};"
            f" cluster-hours median {np.median(hours):.2f} (quartiles {np.quantile(hours, 0.25):.2f}–"
            f"{np.quantile(hours, 0.75):.2f})"
        )


def test_a_budget_keeps_wrong_yes_at_five_per_cent_at_each_speed_questions_null():
    """The rule at the budget's ``max_repeats`` (7 for 8 h), adjusted for acceptance, cheaper
    speed-only phases, restart CV 7 %: at each speed question's null, wrong yes at most α in
    20,000 runs (95 % Wilson interval printed).  The budget stop only ends runs sooner, which
    takes looks away and never adds a yes, so the runs are simulated to ``max_repeats``."""
    config = validate({**copy.deepcopy(DEFAULT), "until": "decided", "budget_hours": BUDGET_HOURS}, REPO)
    n = 20_000
    verdicts, _ever, _repeats, _hours = six_questions(
        13, n, config["max_repeats"], NULL_EFFECTS, 0.07, adjusted=True, cheaper_speed=True
    )
    for column, question in enumerate(SIX):
        if question["metric"] in names.BETWEEN_RESTARTS:
            wrong = int((verdicts[:, column] == questions.YES).sum())
            low, high = proportion_confint(wrong, n, method="wilson")
            print(
                f"budget {BUDGET_HOURS:g} h (max_repeats {config['max_repeats']}), {question_words(question)} at its"
                f" null: wrong yes {wrong / n:.4f} (95 % Wilson {low:.4f}–{high:.4f}) of {n}"
            )
            assert low < questions.ALPHA and wrong / n <= questions.ALPHA + 0.005
