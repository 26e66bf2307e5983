"""The phase sequence of a run, as pure functions: baseline once, then for each repeat
every arm in ``order``, and in a run of levels (``load.users`` a list) every level of each,
ascending in odd repeats and the other way round in even ones (``load_levels.in_order``).
Phase ids are ``rep{rep}-{arm}``, and ``rep{rep}-{arm}-{slug}`` in a run of levels
(``rep1-A-u16``, ``rep1-A-r0.5-u4``; docs/design.md)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import yaml

from thermab import atomic, load_levels, metric_names as names
from thermab.config import (
    Config,
    default_questions,
    defaults as schema_defaults,
    first_testing_repeats,
    key_problems,
    level_bounds,
    maximum,
    order_problems,
    questions_problems,
    thaw,
    thresholds_problems,
    view,
)
from thermab.contracts import Decision, PhaseRecord
from thermab.errors import UserError
from thermab.layout import BASELINE, RunDir, phase_id
from thermab.load_levels import Level


class Phase(NamedTuple):
    rep: int
    arm: str
    level: Level | None = None  # the level, in a run of levels

    @property
    def id(self) -> str:
        return phase_id(self.rep, self.arm, None if self.level is None else self.level.slug)


def levels(load: Mapping) -> list[Level] | None:
    """The levels of ``load`` (the config's ``load``, its view's, or run.json: ``users`` and
    the shape keys) when its ``users`` is a list (even of one), in the list's order; else
    None: a single number keeps the phase ids and files of a run without levels."""
    load = thaw(load)  # a view's tuples and sections as the dict's lists and mappings
    return load_levels.parse(load) if isinstance(load["users"], list) else None


def level_order(every: list[Level] | None, rep: int) -> list[Level | None]:
    """The levels of repeat ``rep`` in the order they run (``load_levels.in_order``)."""
    return [None] if every is None else load_levels.in_order(every, rep)


def williams_orders(order: str) -> list[str]:
    """The rows of a Williams design for the arms of ``order`` (its first row ``order``):
    every arm in every position equally often and every arm after every other equally often
    (for an odd number of arms the design and its mirror, 2k rows).  For two arms: AB, BA."""
    k = len(order)
    first, low, high = [0], 1, k - 1  # the standard first row 0, 1, k−1, 2, k−2, …
    while len(first) < k:
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    rows = [[(j + shift) % k for j in first] for shift in range(k)]
    if k % 2:
        rows += [row[::-1] for row in rows]
    letter = {index: order[position] for position, index in enumerate(rows[0])}  # row 0 is ``order``
    return ["".join(letter[i] for i in row) for row in rows]


def pair_size(order: str) -> int:
    """Repeats per balanced block: 2 for two arms (AB then BA), the Williams rows otherwise."""
    return len(williams_orders(order))


def looks(order: str, max_repeats: int) -> list[int]:
    """The repeats after which the questions are tested: after every repeat from the first
    whose arm + position fit has ``MIN_DF`` residual df (3 repeats of two arms), and at
    ``max_repeats``.  A repeat past a balanced block leaves the arms' positions unbalanced
    by one; the fit's position term takes that up, and a look a repeat sooner is a
    decision a repeat sooner (docs/statistics.md, "Repeats until decided")."""
    first = first_testing_repeats(len(order))
    return list(range(first, max_repeats + 1)) or [max_repeats]


def look_of(order: str, max_repeats: int, rep: int) -> int:
    """The look that ends the block of repeat ``rep`` (the last look for a repeat past them)."""
    points = looks(order, max_repeats)
    return next((point for point in points if point >= rep), points[-1])


def look_before(order: str, max_repeats: int, rep: int) -> int | None:
    """The look whose decision opened the block of repeat ``rep``; None in the first block."""
    earlier = [point for point in looks(order, max_repeats) if point < rep]
    return earlier[-1] if earlier else None


def order_of_repeat(order: str, rep: int, crossover: bool = True) -> str:
    """The order of repeat ``rep`` (1-based): ``order`` itself, or in a crossover run
    (``until: decided``) the rows of its Williams design in turn (AB, BA, AB, …)."""
    if not crossover:
        return order
    rows = williams_orders(order)
    return rows[(rep - 1) % len(rows)]


def phases(order: str, repeats: int, crossover: bool = False, every: list[Level] | None = None) -> list[Phase]:
    """Every phase in the order it runs; ``every``: the levels (``levels``), or None."""
    return [
        Phase(rep, arm, level)
        for rep in range(1, repeats + 1)
        for arm in order_of_repeat(order, rep, crossover)
        for level in level_order(every, rep)
    ]


def job_phases(rep: int, arm: str, every: list[Level] | None = None) -> list[Phase]:
    """The phases one phase job runs, in order: one restart, then a window per level."""
    return [Phase(rep, arm, level) for level in level_order(every, rep)]


# A speed-only phase (``speed_only``) probes this many times ``load.probe_n`` from this share
# of its window: the probes' own spread (each draws its drafts) is much of probe decode
# speed's noise, and with no heat question open nothing asks them to wait for the heat-up
# ramp; probes the window's end cuts are not counted (analysis/metrics.py).
SPEED_ONLY_PROBES = 3
SPEED_ONLY_PROBE_AT = 0.1


def speed_only(config: Config, load_s: int) -> bool:
    """Whether a phase job of window ``load_s`` is speed-only: shorter than the run's
    ``timings.load_s``, which ``until: decided`` asks for only once every open question is
    one of speed or energy per token (analysis/phase_length.py)."""
    return int(load_s) < config.timings.load_s


def with_load_s(config: Config, load_s: int) -> Config:
    """``config`` for a phase job whose load window is ``load_s``: as its ``timings.load_s``,
    so that the load, its probe (``load.probe_at`` of it) and the progress line follow it;
    a speed-only job's probes as SPEED_ONLY_PROBES and SPEED_ONLY_PROBE_AT say."""
    changed = thaw(config)
    changed["timings"]["load_s"] = int(load_s)
    if speed_only(config, load_s) and config.load.probe:
        changed["load"]["probe_n"] = min(maximum("load", "probe_n"), SPEED_ONLY_PROBES * config.load.probe_n)
        changed["load"]["probe_at"] = SPEED_ONLY_PROBE_AT
    return view(changed)


def recorded_windows(
    run_dir: Path, order: str, repeats: int, crossover: bool = False, every: list[Level] | None = None
) -> dict[int, int]:
    """rep → the load window its phases were asked for, for the repeats of the first
    ``repeats`` with a phase.json (``PhaseRecord.window_asked_s``).  A phase.json that is not
    such a record is a UserError naming it."""
    run, windows = RunDir(run_dir), {}
    for phase in phases(order, repeats, crossover, every):
        path = run.phase(phase.id).phase_json
        if phase.rep in windows or not path.is_file():
            continue
        try:
            length = PhaseRecord.read(path).window_asked_s
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as error:
            raise UserError(f"{path}: not a phase record: {' '.join(str(error).split())[:160]}") from None
        if length is not None:
            windows[phase.rep] = length
    return windows


def block_window(
    run_dir: Path, order: str, max_repeats: int, rep: int, load_s: int, every: list[Level] | None = None
) -> int:
    """The load window of repeat ``rep`` of an ``until: decided`` run: the one its phases ran
    (a phase that ran keeps its own, or Snakemake would run it again for new params), else
    the one the look before its block decided (``contracts.Decision.load_s``), else
    ``load_s`` (the first block).  A phase.json or look.json that is none is a UserError
    naming it."""
    recorded = recorded_windows(run_dir, order, rep, crossover=True, every=every)
    if rep in recorded:
        return recorded[rep]
    opening = look_before(order, max_repeats, rep)
    decision = RunDir(run_dir).look(opening).decision if opening else None
    if decision is None or not decision.is_file():
        return load_s
    decided = Decision.read(decision).load_s
    return load_s if decided is None else decided


def previous(order: str, rep: int, arm: str, crossover: bool = False, every: list[Level] | None = None) -> str:
    """Id of the phase that must finish before the job ``rep{rep}-{arm}``: the last of the
    job before it (each job's phases finish together), the baseline for the first.

    Only earlier repeats are named, so raising ``repeats`` later never changes the chain
    of the phases that already ran."""
    sequence = phases(order, rep, crossover, every)
    index = sequence.index(job_phases(rep, arm, every)[0])
    return BASELINE if index == 0 else sequence[index - 1].id


# the analysis settings a plan falls back on when nothing says otherwise: the schema's
DEFAULT_ANALYSIS = schema_defaults("analysis")
# counted by the load as the tokens arrive (the gaps themselves are not kept): a new value
# takes effect in the phases run after it, never by analysing again
LOAD_TIME_ANALYSIS = ("stall_gap_s",)


def reanalysis(analysis: dict) -> dict:
    """The analysis settings that analysing a run again applies (the analyze and report
    rules' params): every one but those the load applied as it ran."""
    return {key: value for key, value in analysis.items() if key not in LOAD_TIME_ANALYSIS}


def run_plan(
    *,
    cluster: str,
    order: str,
    repeats: int,
    arms: dict,
    setting: str,
    head: str,
    hosts: list[str],
    analysis: dict | None = None,
    questions: list[dict] | None = None,
    **facts,
) -> dict:
    """The experiment plan of a run directory (``run.json``): what the analysis needs to
    read the run without its config.  ``facts`` add what the writer knows (trip point,
    max_tokens, load_s, where an import came from).  Without ``questions``, the study's
    default questions (config.default_questions)."""
    analysis = {**DEFAULT_ANALYSIS, **(analysis or {})}
    if questions is None:
        questions = default_questions(analysis["timeline_zone"])
    return {
        "cluster": cluster,
        "order": order,
        "repeats": repeats,
        "arms": arms,
        "reference_arm": next(iter(arms)),
        "setting": setting,
        "head": head,
        "hosts": hosts,
        **{key: analysis[key] for key in DEFAULT_ANALYSIS},
        "questions": questions,
        **facts,
    }


# run.json's keys that hold a config key's value, and that key: each is checked as the
# config's own would be (config.key_problems), so a plan from elsewhere means what a config does
CONFIG_KEYS = {
    "order": ("order",),
    "repeats": ("repeats",),
    "arms": ("arms",),
    "until": ("until",),
    "max_repeats": ("max_repeats",),
    "questions": ("questions",),
    "users": ("load", "users"),
    "max_tokens": ("load", "max_tokens"),
    "prompt_tokens": ("load", "prompt_tokens"),
    "load_s": ("timings", "load_s"),
    "min_load_s": ("timings", "min_load_s"),
    "cooldown_max_s": ("timings", "cooldown_max_s"),
    "probe_n": ("load", "probe_n"),  # checked apart: 0 stands for no probe
    "sample_intervals_s": ("monitor", "intervals"),
    "rate": ("load", "rate"),
    "burstiness": ("load", "burstiness"),
    "think_s": ("load", "think_s"),
    "wakeup_gaps_s": ("load", "wakeup_gaps_s"),
    "slo": ("load", "slo"),
    "idle_s": ("timings", "idle_s"),
    "budget_hours": ("budget_hours",),
    "time_scale": ("timings", "time_scale"),
    **{key: ("analysis", key) for key in DEFAULT_ANALYSIS},
}


def _as_plan_key(problem: str, key: str) -> str:
    """A config check's line, naming run.json's key where it names the config's."""
    config_key = ".".join(CONFIG_KEYS[key])
    return problem.replace(f"config key '{config_key}", f"key '{key}", 1)


def plan_problems(plan: dict) -> list[str]:
    """What is wrong with a run.json (``plan``) another tool or an older thermab may have
    written, each a line naming the key: its config keys by the config's checks, a
    question by the config's question checks (a level the run lacks named), the rest by
    type.  Keys an older run.json lacks are not asked for."""
    problems = [
        _as_plan_key(problem, key)
        for key in CONFIG_KEYS
        if key in plan and key != "probe_n"
        for problem in key_problems(CONFIG_KEYS[key], plan[key])
    ]
    if "users" in plan and not problems:  # its levels as the config's are checked (load_levels)
        problems += [
            _as_plan_key(p, "burstiness" if p.startswith("config key 'load.burstiness'") else "users")
            for p in load_levels.problems(plan, "load", level_bounds())
        ]
    if plan.get("probe_n", 0) != 0:  # 0: the run had no probe
        problems += [_as_plan_key(p, "probe_n") for p in key_problems(CONFIG_KEYS["probe_n"], plan["probe_n"])]
    trip = plan.get("trip_point_c")  # found at preflight, no config key's
    if trip is not None and not (isinstance(trip, (int, float)) and not isinstance(trip, bool) and math.isfinite(trip)):
        problems.append(f"key 'trip_point_c': {str(trip)[:40]!r} is not a finite number or null")
    for key, kind in (("cluster", str), ("setting", str), ("head", str), ("hosts", list), ("reference_arm", str)):
        if key in plan and not isinstance(plan[key], kind):
            problems.append(f"key '{key}': must be {'text' if kind is str else 'a list'}")
    problems += invocation_problems(plan)
    if problems:
        return problems
    arms = plan["arms"]
    if plan.get("reference_arm", next(iter(arms))) not in arms:
        problems.append(f"key 'reference_arm': {plan['reference_arm']!r} is not one of the arms ({', '.join(arms)})")
    if "order" in plan:
        problems += [p.replace("config key ", "key ", 1) for p in order_problems(plan["order"], arms)]
    problems += [_as_plan_key(p, "thresholds_c") for p in thresholds_problems(plan.get("thresholds_c", []))]
    hosts = [str(host) for host in plan.get("hosts", [])]
    questions = plan.get("questions", [])
    # what a plan another tool (or an earlier thermab) wrote lacks is what its questions name:
    # the levels, the wake-up gaps, an idle window
    named = {
        "users": sorted({u for q in questions for u in q.get("users", [])}) or 1,
        "wakeup_gaps_s": sorted({names.gap_of(q["metric"]) for q in questions} - {None}) or None,
        "idle_s": 1 if any(names.rest_host(q["metric"]) for q in questions) else 0,
    }
    load = {**named, **plan}
    problems += [_as_plan_key(p, "questions") for p in questions_problems(questions, hosts, load, load["idle_s"])]
    return problems


# How Snakemake was started on the run, so that the command that continues it
# (analysis.planning.decide_command) runs the same study: its --configfile files (absolute,
# as Snakemake holds them; none: the default config), its --cores and its --config entries
# (a budget or a load given on the command line must hold for the rest of the study too).
# workflow/rules/common.smk hands them to the jobs in this variable; preflight records them in
# run.json.
INVOCATION_ENV = "THERMAB_INVOCATION"

# the entries the command that continues a run sets itself
CONTINUATION_KEYS = ("until", "max_repeats", "repeats", "order")


def invocation(configfiles, cores: int | None, overrides: dict | None = None) -> dict:
    """run.json's ``configfiles``, ``cores`` and ``overrides`` (each --config entry as text
    that Snakemake reads back to the value it was given) of a run started with these."""
    return {
        "configfiles": [str(path) for path in configfiles],
        "cores": cores,
        "overrides": {str(key): override_text(value) for key, value in (overrides or {}).items()},
    }


def override_text(value) -> str:
    """A --config value as the text Snakemake parsed it from: a mapping or a list in YAML's
    flow style on one line, ``key=`` for None, anything else as itself (Snakemake strips
    quotes around a value, so a text it read as a string reads as that string again)."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=math.inf).rstrip("\n")
    return str(value)


def continuation_entries(overrides: Mapping[str, str] | None) -> list[str]:
    """The --config entries of the run's own invocation (run.json's ``overrides``, None where
    it has none) that the command continuing it repeats: all but the ones that command sets
    (``CONTINUATION_KEYS``)."""
    return [f"{key}={text}" for key, text in (overrides or {}).items() if key not in CONTINUATION_KEYS]


def _printable(text) -> bool:
    """One printable line without a backtick: it goes into a command in Markdown's backticks."""
    return isinstance(text, str) and text.isprintable() and "`" not in text


def invocation_problems(plan: dict) -> list[str]:
    """What is wrong with run.json's ``configfiles``, ``cores`` and ``overrides`` (a command
    is built of them)."""
    problems = []
    files = plan.get("configfiles", [])
    if not isinstance(files, list) or not all(_printable(path) for path in files):
        problems.append("key 'configfiles': must be a list of paths, each one printable line without a backtick")
    cores = plan.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        problems.append(f"key 'cores': {str(cores)[:40]!r} is not a whole number of at least 1")
    overrides = plan.get("overrides", {})
    if not isinstance(overrides, dict):
        problems.append("key 'overrides': must map config keys to their --config text")
    else:
        problems += [
            f"--config entry {str(key)[:40]!r} (run.json's overrides): must be one printable line without a backtick"
            for key, text in overrides.items()
            if not (re.fullmatch(r"[A-Za-z_](?:[\w-]*\w)?", str(key)) and _printable(text))
        ]
    return problems


def write_run_json(run_dir: Path, plan: dict) -> Path:
    """The one writer of ``run.json`` (preflight and the chart importer both call it)."""
    path = RunDir(run_dir).run_json
    atomic.write_text(path, json.dumps(plan, indent=2) + "\n")
    return path
