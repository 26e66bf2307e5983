"""The declared questions (analysis/questions.py answers them), the budget, the tune's
range and constraints, and the wake-up gaps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from thermab import load_levels, metric_names as names
from thermab.config.problems import _short
from thermab.config.schema import maximum
from thermab.config.setting import literal_number


def default_questions(zone: str = "TSOC") -> list[dict[str, Any]]:
    """The spin-wait study's questions: cooler and less CPU, no real loss of speed or energy."""
    return [
        {"metric": names.zone_mean("head", zone), "kind": "lower"},
        {"metric": names.cpu_median("head"), "kind": "lower"},
        {"metric": names.OUTPUT_THROUGHPUT, "kind": "non_inferior", "better": "higher", "margin_pct": 5},
        {"metric": names.PROBE_DECODE_SPEED, "kind": "non_inferior", "better": "higher", "margin_pct": 6},
        {"metric": names.CLUSTER_ENERGY_PER_TOKEN, "kind": "lower"},
        {"metric": names.STALL_GAPS, "kind": "non_inferior", "better": "lower", "margin": 0.5},
    ]


def question_hosts(config: dict[str, Any]) -> list[str]:
    return ["head"] + sorted({name for cluster in config["clusters"].values() for name in cluster["hosts"]} - {"head"})


def known_metric(config: dict[str, Any], metric: str) -> bool:
    """A metric variance.csv can have: a run metric, or a host's CPU or zone mean (any zone
    name: zones are found at preflight; one other than the timeline zone has no data), the
    TTFT after one of the wake-up gaps (``load.wakeup_gaps_s``), a latency percentile
    (``p99 ITL``), with ``load.slo`` the goodput, or with an idle window
    (``timings.idle_s``) a host's zone mean, vLLM CPU median or power at rest."""
    gap = names.gap_of(metric)
    if gap is not None:
        return gap in (config["load"]["wakeup_gaps_s"] or [])
    if names.rest_host(metric) is not None:
        return bool(config["timings"]["idle_s"]) and names.rest_host(metric) in question_hosts(config)
    if metric == names.GOODPUT:
        return bool(config["load"]["slo"])
    return (
        metric in names.RUN_METRICS
        or metric in names.LATENCY_METRICS
        or names.host_of(metric) in question_hosts(config)
    )


def question_words(question: Mapping[str, Any]) -> str:
    """A question in words, for its errors and its row of questions.csv."""
    margin = (
        f"{question['margin_pct']:g} %"
        if "margin_pct" in question
        else f"{question['margin']:g}"
        if "margin" in question
        else "?"
    )
    if question["kind"] == "non_inferior":
        return f"{question['metric']} no worse than {margin} ({question.get('better', '?')} is better)"
    if question["kind"] == "equivalent":
        return f"{question['metric']} equivalent within ± {margin}"
    return f"{question['metric']} {question['kind']}" + (
        f" by at least {question['by']:g}" if question.get("by") else ""
    )


def _question_problems(config: dict[str, Any], problems: list[str]) -> None:
    config.setdefault("questions", default_questions(config["analysis"]["timeline_zone"]))
    for index, question in enumerate(config["questions"]):
        _one_question_problems(config, f"questions.{index}", question, problems)
    if config["until"] == "decided":
        if not config["questions"]:
            problems.append("config key 'until': 'decided' needs at least one question under 'questions'")
        if config["max_repeats"] < max(2, config["repeats"]):
            problems.append(
                f"config key 'max_repeats': {config['max_repeats']} is below 'repeats' "
                f"({config['repeats']}) or one crossover pair (2)"
            )
    _covariate_problems(config, problems)
    _budget_problems(config, problems)


def _covariate_problems(config: dict[str, Any], problems: list[str]) -> None:
    """``analysis.covariates``: per-phase metrics of the run that no question asks about and
    that are not themselves adjusted (an effect adjusted for a metric the arm moves through
    it would hide that effect)."""
    asked = {question["metric"] for question in config["questions"]}
    for index, metric in enumerate(config["analysis"]["covariates"]):
        key = f"config key 'analysis.covariates.{index}'"
        if not known_metric(config, metric):
            problems.append(
                f"{key}: {_short(metric)!r} is no per-phase metric of tables/variance.csv"
                f" (e.g. {names.ACCEPTANCE_LENGTH!r})"
            )
        elif metric in asked or metric in names.ADJUSTED:
            problems.append(
                f"{key}: {_short(metric)!r} is itself a question's or an adjusted metric, not a covariate"
                " the setting leaves alone"
            )


MIN_DF = 3  # a look whose fit has fewer residual df does not test (analysis/sequential.py)


def residual_df(arms: int, repeats: int) -> int:
    """Residual df of ``value ~ arm + position`` over ``repeats`` repeats of every arm."""
    return arms * repeats - arms - 1


def first_testing_repeats(arms: int) -> int:
    """The repeats of the first look of ``until: decided`` that tests: the fewest whose fit
    has MIN_DF residual df (3 for two arms)."""
    return max(1, math.ceil((MIN_DF + arms + 1) / arms))


def _phases_per_repeat(config: dict[str, Any]) -> int:
    """Load phases in one repeat: one per arm of ``order`` at every level of ``load.users``."""
    users = config["load"]["users"]
    return len(config["order"]) * len(users if isinstance(users, list) else [users])


def phase_job_s(load_s: float, cooldown_max_s: float, window_s: float | None = None) -> float:
    """The most a phase job of load window ``window_s`` costs (None: the run's ``load_s``):
    the full window waits out the heat cooldown (``cooldown_max_s`` at its longest); a
    shorter one is speed-only (analysis/phase_length.py), which waits for no heat cooldown."""
    if window_s is None or window_s >= load_s:
        return load_s + cooldown_max_s
    return window_s


def repeats_in_budget(room_s: float, phases: int, full_job_s: float, speed_job_s: float, first_look: int) -> int:
    """The most repeats of ``phases`` phase jobs that fit in ``room_s`` (what is left after
    the baseline): up to the first testing look (``first_look`` repeats) at the full job's
    price, and after it at the speed-only job's, which is how a run goes on once that look
    decided its heat questions.  A run whose heat questions stay open pays the full price,
    and the budget stop prices each look at the jobs the run measured
    (``analysis.planning.job_price``), so it may stop sooner: fewer looks lose power, never
    error control, and the looks' α stays laid out over these repeats."""
    full, speed = phases * full_job_s, phases * speed_job_s
    if room_s < first_look * full:
        return max(0, math.floor(room_s / full + 1e-9))
    return first_look + math.floor((room_s - first_look * full) / speed + 1e-9)


def _budget_problems(config: dict[str, Any], problems: list[str]) -> None:
    """``budget_hours``: only with ``until: decided``, and at least one pair of phases (one
    of each arm, at every level) with the baseline, at the config's timings."""
    budget = config["budget_hours"]
    if budget is None:  # not finite, or not above 0: the finiteness check and the schema name it
        return
    if config["until"] != "decided":
        problems.append("config key 'budget_hours': a budget stops only `until: decided` runs; set until: decided")
        return
    timings, phases = config["timings"], _phases_per_repeat(config)
    pair_s = timings["baseline_s"] + phases * timings["load_s"]
    pair_h = pair_s * timings["time_scale"] / 3600
    if budget < pair_h:
        problems.append(
            f"config key 'budget_hours': {budget:g} h is less than one pair of phases at the config's timings"
            f" (baseline {timings['baseline_s']:g} s + {phases} × load {timings['load_s']} s,"
            f" × time_scale {timings['time_scale']:g} = {pair_h:.3g} h)"
        )


def budget_repeats(config: dict[str, Any]) -> int | None:
    """The most repeats ``budget_hours`` fits at the config's own timings (None: no budget):
    after the baseline, each phase job at its most (``phase_job_s``), at every level of the
    load, the repeats after the first testing look at the speed-only price
    (``repeats_in_budget``)."""
    budget = config["budget_hours"]
    if budget is None or config["until"] != "decided":
        return None
    timings = config["timings"]
    room_s = budget * 3600 / timings["time_scale"] - timings["baseline_s"]
    return repeats_in_budget(
        room_s,
        _phases_per_repeat(config),
        phase_job_s(timings["load_s"], timings["cooldown_max_s"]),
        phase_job_s(timings["load_s"], timings["cooldown_max_s"], timings["min_load_s"]),
        first_testing_repeats(len(config["order"])),
    )


def fit_max_repeats_to_budget(config: dict[str, Any], max_repeats_given: bool = True) -> None:
    """``max_repeats`` to what the budget fits (``budget_repeats``): lowered where the config
    gives more, and where it gives none the budget's own (up to the schema's bound), never
    below ``repeats`` or one crossover pair.  A budget is the cap its user chose, and the
    looks' α is laid out over ``max_repeats`` (analysis/sequential.py): a cap below what the
    budget reaches would end the run with hours left and questions open, one above it would
    leave the last looks' α unspent.  Fixed from the config alone, before any phase ran, so
    the spending stays pre-specified (docs/planning.md)."""
    fits = budget_repeats(config)
    if fits is None:
        return
    cap = min(config["max_repeats"], fits) if max_repeats_given else min(fits, int(maximum("max_repeats") or fits))
    config["max_repeats"] = max(2, config["repeats"], cap)


def questions_problems(
    questions: list[dict[str, Any]], hosts: list[str], load: dict[str, Any], idle_s: float = 0
) -> list[str]:
    """The checks of ``questions`` a config makes, for a run of ``hosts`` at the levels of
    ``load`` (``users`` and the shape keys) with its wake-up gaps (``wakeup_gaps_s``) and
    idle window (``idle_s``): for questions another tool wrote (run.json), already schema-valid."""
    config = {
        "clusters": {"": {"hosts": dict.fromkeys(hosts)}},
        "load": {"wakeup_gaps_s": None, "slo": None, **load},
        "timings": {"idle_s": idle_s},
    }
    problems: list[str] = []
    for index, question in enumerate(questions):
        _one_question_problems(config, f"questions.{index}", question, problems)
    return problems


def _one_question_problems(config: dict[str, Any], where: str, question: dict[str, Any], problems: list[str]) -> None:
    """A question's own checks (``where``: its key, questions.N or tune.constraints.N)."""

    def key(field: str | None = None) -> str:
        return f"config key '{where}{'.' + field if field else ''}' ({_short(question['metric'])} {question['kind']})"

    margins = [name for name in ("margin", "margin_pct") if name in question]
    if not known_metric(config, question["metric"]):
        problems.append(
            f"{key('metric')}: unknown metric (one of: {', '.join(names.RUN_METRICS)}, 'HOST ZONE mean', "
            f"'HOST vLLM CPU median', 'p50|p90|p99 TTFT|TPOT|ITL|E2EL', 'goodput' with load.slo; "
            f"HOST one of {', '.join(map(_short, question_hosts(config)))})"
        )
    if len(margins) > 1:
        problems.append(f"{key('margin_pct')}: give margin or margin_pct, not both")
    for name in margins + ["by"] * ("by" in question):
        if question[name] < 0:
            problems.append(f"{key(name)}: {question[name]} is negative")
    if "margin_pct" in question and question["margin_pct"] >= 100:
        problems.append(f"{key('margin_pct')}: {question['margin_pct']} is 100 % or more, which any answer passes")
    if question["kind"] in ("non_inferior", "equivalent"):
        if not margins:
            problems.append(f"{key()}: needs margin or margin_pct")
        if "by" in question:
            problems.append(f"{key('by')}: 'by' belongs to lower/higher; this kind has a margin")
    else:
        for name in margins:
            problems.append(f"{key(name)}: a margin belongs to non_inferior/equivalent; lower/higher take 'by'")
    if not load_levels.problems(config["load"]):  # levels that are none are named on their own
        for name, problem in load_levels.question_problems(question, load_levels.parse(config["load"])):
            problems.append(f"{key(name)}: {problem}")
    if (question["kind"] == "non_inferior") != ("better" in question):
        problems.append(
            f"{key('better')}: (lower or higher) is "
            + ("required" if question["kind"] == "non_inferior" else "for non_inferior only")
        )


def _tune_problems(config: dict[str, Any], problems: list[str]) -> None:
    """``tune`` (docs/tune.md): a range that holds values, a metric that exists, one cluster.
    The budget's floor (the phases one decision needs) is checked by thermab.tune.racing, which
    owns the looks' arithmetic with analysis.sequential."""
    tune = config.get("tune")
    if tune is None:
        return
    low, high = tune["min"], tune["max"]
    if high <= low:
        problems.append(
            f"config key 'tune.max': {high:g} is not above 'tune.min' ({low:g}): the range holds no value to try"
        )
    if tune["scale"] == "log" and low <= 0:
        problems.append(
            f"config key 'tune.min': {low:g} with scale log: a log scale needs a range above zero "
            "(min > 0), or scale linear"
        )
    if not known_metric(config, tune["objective"]):
        problems.append(
            f"config key 'tune.objective': {_short(tune['objective'])!r} is no metric of "
            f"tables/variance.csv (one of: {', '.join(names.RUN_METRICS)}, 'HOST ZONE mean', "
            f"'HOST vLLM CPU median')"
        )
    for index, question in enumerate(tune["constraints"]):
        _one_question_problems(config, f"tune.constraints.{index}", question, problems)
    if len(config["clusters"]) != 1:
        problems.append(
            f"config key 'tune': a tune searches one cluster, and the config has "
            f"{len(config['clusters'])} ({', '.join(map(_short, config['clusters']))})"
        )
    if literal_number(next(iter(config["arms"].values()))["value"]) is None:
        problems.append(
            "config key 'tune': the reference arm's value is not a finite number, so no number can be tried against it"
        )


def _wakeup_problems(config: dict[str, Any], problems: list[str]) -> None:
    """The wake-up gaps ascend, and their idle time fits in a phase: at most its load's."""
    gaps, n, load_s = config["load"]["wakeup_gaps_s"], config["load"]["wakeup_n"], config["timings"]["load_s"]
    if not gaps:
        return
    if any(later <= earlier for earlier, later in zip(gaps, gaps[1:], strict=False)):
        problems.append(f"config key 'load.wakeup_gaps_s': {gaps} is not strictly ascending")
    elif n * sum(gaps) > load_s:
        problems.append(
            f"config key 'load.wakeup_gaps_s': {n} probes ('load.wakeup_n') after each gap idle the server "
            f"{n * sum(gaps):g} s, longer than the phase's load ('timings.load_s' = {load_s} s)"
        )
