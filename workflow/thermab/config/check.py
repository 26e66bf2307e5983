"""Validation: the schema, then the checks a schema cannot express (the other modules'
and those across keys, here); ``load`` reads, layers and validates config files."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson

from thermab import load_levels
from thermab.config.addresses import (
    _fed_twice,
    _host_problems,
    _reaches,
    _wall_meter_problems,
    endpoint_address,
    endpoint_problem,
    redact_url,
)
from thermab.config.patterns import _one_line, _regex
from thermab.config.problems import ConfigError, _raise, _short
from thermab.config.question_keys import _question_problems, _tune_problems, _wakeup_problems, fit_max_repeats_to_budget
from thermab.config.reader import read_layered
from thermab.config.schema import MAX_VALUES, _describe, _validator, _value_problems, level_bounds
from thermab.config.setting import _setting_problems

# load.extra_body as JSON: it is merged into every request (it travels in a file, not on a
# command line), so this bounds each request's body, not an argument
MAX_EXTRA_BODY = 2**20


def validate(raw: dict[str, Any], workdir: str | Path | None = None) -> dict[str, Any]:
    """Return a copy of ``raw`` with defaults filled in, or raise ConfigError.  ``workdir``
    (default: the current directory) is where relative paths such as simulated roots lie."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config: the top level must be a mapping of config keys, not a {type(raw).__name__}")
    problems: list[str] = []
    _value_problems(raw, [], problems, [MAX_VALUES])
    _raise(problems)
    config = copy.deepcopy(raw)
    errors = sorted(_validator().iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    _raise([_describe(e) for e in errors])
    _shortest_window(raw, config)
    _raise(_semantic_problems(config, Path(workdir or Path.cwd()).resolve()))
    fit_max_repeats_to_budget(config, "max_repeats" in raw)
    return config


def _shortest_window(raw: dict[str, Any], config: dict[str, Any]) -> None:
    """``timings.min_load_s`` left out is its default or ``timings.load_s``, whichever is
    shorter: a window no longer than the default asks for no shortening, and a config
    validated again as written holds no shortest window longer than the window (which
    ``_across_keys`` refuses with until: decided, the design that shortens windows)."""
    timings = config["timings"]
    if "min_load_s" not in (raw.get("timings") or {}):
        timings["min_load_s"] = min(timings["min_load_s"], timings["load_s"])


def order_problems(order: str, arms: dict[str, Any]) -> list[str]:
    """``order`` against ``arms``: every letter an arm, none twice."""
    problems = []
    unknown = sorted(set(order) - set(arms))
    if unknown:
        problems.append(
            f"config key 'order': arm(s) {', '.join(unknown)} not defined under 'arms' (defined: {', '.join(arms)})"
        )
    if len(set(order)) != len(order):
        problems.append(f"config key 'order': '{order}' names an arm twice")
    return problems


def _semantic_problems(config: dict[str, Any], workdir: Path) -> list[str]:
    problems: list[str] = []
    arms = config["arms"]
    problems += order_problems(config["order"], arms)
    _setting_problems(config, problems)
    _regex("monitor.process_pattern", config["monitor"]["process_pattern"], problems)
    _one_line("load.model", config["load"]["model"], problems)
    _one_line("analysis.timeline_zone", config["analysis"]["timeline_zone"], problems)
    safety, timings = config["safety"], config["timings"]
    cap = safety["max_load_minutes"]
    if cap is not None and timings["load_s"] > cap * 60:
        problems.append(
            f"config key 'timings.load_s': {timings['load_s']} s is longer than 'safety.max_load_minutes' ({cap} min)"
        )
    thermal_interval = config["monitor"]["intervals"]["thermal"]
    silence = safety["max_sensor_silence_s"]
    if silence is not None and silence < 2 * thermal_interval:
        problems.append(
            f"config key 'safety.max_sensor_silence_s': {silence} s is shorter than two thermal "
            f"sample intervals ('monitor.intervals.thermal' = {thermal_interval} s)"
        )
    problems += load_levels.problems(config["load"], bounds=level_bounds())
    _question_problems(config, problems)
    _tune_problems(config, problems)
    _across_keys(config, problems)
    problem = extra_body_problem(config["load"]["extra_body"])
    if problem:
        problems.append(f"config key 'load.extra_body': {problem}")
    _wakeup_problems(config, problems)
    idle_s = config["timings"]["idle_s"]
    if cap is not None and idle_s > cap * 60:
        problems.append(
            f"config key 'timings.idle_s': {idle_s} s of idle window outlasts 'safety.max_load_minutes' ({cap} min)"
        )
    if config["load"]["rate"] is not None and config["load"]["think_s"] is not None:
        problems.append(
            "config key 'load.think_s': a think time belongs to a loop of users, and 'load.rate' makes the "
            "load an open loop whose arrivals are drawn; set one of them"
        )
    served: dict[tuple[str, int], str] = {}  # each endpoint's address and port: the first cluster on it
    for name, cluster in config["clusters"].items():
        hosts = cluster["hosts"]
        if config["setting"]["method"] == "file":
            reached: dict[tuple[object, ...], str] = {}
            for host_name, host in hosts.items():
                first = reached.setdefault(_reaches(host, workdir), host_name)
                if first != host_name:
                    problems.append(
                        f"config key 'clusters.{name}.hosts.{host_name}': reaches the same files as "
                        f"host {first} (same address, container and root): the setting's file "
                        "would be patched twice, and the second copy of its original would be "
                        "the patched one"
                    )
        if cluster["head"] not in hosts:
            problems.append(
                f"config key 'clusters.{name}.head': '{_short(cluster['head'])}' is not one of its "
                f"hosts ({', '.join(hosts)})"
            )
        problem = endpoint_problem(cluster["endpoint"])
        if problem:
            problems.append(
                f"config key 'clusters.{name}.endpoint': {_short(redact_url(cluster['endpoint']))!r} {problem}"
            )
        elif (first := served.setdefault(endpoint_address(cluster["endpoint"]), name)) != name:
            address, port = endpoint_address(cluster["endpoint"])
            problems.append(
                f"config key 'clusters.{name}.endpoint': {address}:{port}, as cluster {first}'s: each run "
                "holds its endpoint, so the two clusters' runs cannot go on side by side; give each a port of its own"
            )
        for host_name, host in hosts.items():
            _host_problems(f"clusters.{name}.hosts.{host_name}", host, workdir, problems)
            _wall_meter_problems(f"clusters.{name}.hosts.{host_name}", host.get("wall_meters", []), hosts, problems)
        _fed_twice(f"clusters.{name}.hosts", hosts, problems)
    return problems


def extra_body_problem(extra_body: object) -> str | None:
    """Why ``extra_body`` cannot be merged into every request: not a JSON object, or larger
    than MAX_EXTRA_BODY written as JSON; None when it can."""
    if not isinstance(extra_body, dict):
        return f"must be a JSON object, not {type(extra_body).__name__}"
    try:
        size = len(json.dumps(extra_body, allow_nan=False).encode())
        orjson.dumps(extra_body)  # the load's encoder: no integer past 64 bits, no lone surrogate
    except (TypeError, ValueError, RecursionError) as error:
        return f"not JSON: {_short(str(error))}"
    return f"{size} bytes as JSON, more than {MAX_EXTRA_BODY}" if size > MAX_EXTRA_BODY else None


def _across_keys(config: dict[str, Any], problems: list[str]) -> None:
    """Keys that are each valid but contradict one another."""
    timings, intervals = config["timings"], config["monitor"]["intervals"]
    if config["until"] == "decided" and timings["min_load_s"] > timings["load_s"]:
        problems.append(
            f"config key 'timings.min_load_s': {timings['min_load_s']} s is longer than the load window"
            f" ('timings.load_s' = {timings['load_s']} s); until: decided shortens windows down to it, at most"
            " to the window itself"
        )
    # the shortest window a phase may run (until: decided shortens it for speed questions)
    key = "min_load_s" if config["until"] == "decided" and timings["min_load_s"] < timings["load_s"] else "load_s"
    for kind in ("thermal", "cpu"):  # the phase tables' samples: none would fall inside a load window
        if intervals[kind] >= timings[key]:
            problems.append(
                f"config key 'monitor.intervals.{kind}': {intervals[kind]} s is not shorter than the "
                f"load window ('timings.{key}' = {timings[key]} s)"
            )
    abort = config["safety"]["abort_at_c"]
    if abort is not None and timings["cooldown_below_c"] >= abort:
        problems.append(
            f"config key 'timings.cooldown_below_c': {timings['cooldown_below_c']} °C is not below "
            f"the interlock ('safety.abort_at_c' = {abort} °C): a cooldown would wait for a "
            "temperature that stops the run"
        )
    problems += thresholds_problems(config["analysis"]["thresholds_c"])


def thresholds_problems(thresholds: list[Any]) -> list[str]:
    """``analysis.thresholds_c``: each once, ascending (a threshold twice is a row twice)."""
    problems = []
    for index in range(1, len(thresholds)):
        if thresholds[index] <= thresholds[index - 1]:
            before = thresholds.index(thresholds[index]) if thresholds[index] in thresholds[:index] else index - 1
            problems.append(
                f"config key 'analysis.thresholds_c.{index}': {thresholds[index]} "
                + ("is given twice" if thresholds[before] == thresholds[index] else "is not above")
                + f" ('analysis.thresholds_c.{before}' = {thresholds[before]}); thresholds are listed "
                "once each, ascending"
            )
            break
    return problems


def load(paths: str | Path | list[str | Path], workdir: str | Path | None = None) -> dict[str, Any]:
    """Read, layer and validate config files (for use outside Snakemake); errors name the
    files."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    raw = read_layered(paths)
    try:
        return validate(raw, workdir)
    except ConfigError as error:
        raise ConfigError(f"{' + '.join(map(str, paths))}: {error}") from None
