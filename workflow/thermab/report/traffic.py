"""The trade-off across traffic as numbers (pure functions; report/tradeoff.py draws them):
for each arm, the metrics a change trades against one another (head temperature, head CPU,
energy per token, latency (the load's median time to first token), throughput, with
``load.slo`` the goodput beside it, decode speed per stream) at each level of load,
whatever its shape (``load_levels``), each level's mean of its phases with its 95 %
interval, the levels in the run's order (ascending by users,
levels of equal users in the list's order); and the levels at which a question's answer
changes from the level before.  summary.md's table of a run of levels is ``table``."""

from __future__ import annotations

import math
from collections.abc import Hashable

import pandas as pd

from thermab import metric_names as names
from thermab.analysis import levels
from thermab.analysis.load_validity import is_short
from thermab.analysis.model import Plan
from thermab.analysis.stats import describe, t_quantile
from thermab.report.units import DIGITS, SHORT_UNIT, fmt

POINT_COLUMNS = ["metric", "arm", levels.USERS, levels.LEVEL, "position", "n", "mean", "ci_low", "ci_high", "short"]
TTFT_DIGITS = 3  # a time to first token in seconds: milliseconds matter


def panels(config: Plan) -> list[tuple[str, str, str]]:
    """(metric, its title, unit) of each panel, in order: what a change costs or saves
    (heat, CPU, energy, latency), then what the load got (throughput, decode speed)."""
    zone, cpu = names.zone_mean(config.head, config.timeline_zone), names.cpu_median(config.head)
    return [
        (zone, zone, "°C"),
        (cpu, cpu, "% of one core"),
        (names.CLUSTER_ENERGY_PER_TOKEN, "energy per token (cluster)", "J/token"),
        (names.TTFT_MEDIAN, "latency: TTFT median (load)", "s"),
        (names.OUTPUT_THROUGHPUT, names.OUTPUT_THROUGHPUT, "tok/s"),
        *([(names.GOODPUT, "goodput: requests meeting load.slo", "%")] if config.slo else []),
        (names.PROBE_DECODE_SPEED, "decode speed per stream (probe)", "tok/s"),
    ]


def level_order(config: Plan) -> list[str]:
    """The labels of a run's levels in the run's order ([] for a plan without users)."""
    return [level.label for level in levels.of_run(config) if level is not None]


def points(pooled: pd.DataFrame, metrics: list[str], order: list[str]) -> pd.DataFrame:
    """Per metric, arm and level (``order``: the levels' labels in the run's order, its
    ``position`` there): the phases' n, mean and 95 % t interval of the mean (NaN for one
    phase), and whether a phase there had a short load.  Pure."""
    if levels.LEVEL not in pooled:
        return pd.DataFrame(columns=POINT_COLUMNS)
    data = pooled[pooled["metric"].isin(metrics) & pooled[levels.LEVEL].notna()]
    rank: dict[Hashable, int] = {label: position for position, label in enumerate(order)}
    rows = []
    for (metric, arm, label), group in data.groupby(["metric", "arm", levels.LEVEL], sort=False):
        stats = describe(group["value"])
        half = (
            t_quantile(0.975, stats["n"] - 1) * stats["sd"] / math.sqrt(stats["n"])
            if stats["n"] >= 2 and not math.isnan(stats["sd"])
            else math.nan
        )
        rows.append(
            {
                "metric": metric,
                "arm": arm,
                levels.USERS: int(group[levels.USERS].iloc[0]),
                levels.LEVEL: label,
                "position": rank.get(label, len(rank)),
                "n": stats["n"],
                "mean": stats["mean"],
                "ci_low": stats["mean"] - half,
                "ci_high": stats["mean"] + half,
                "short": bool(is_short(group).any()) if "load_valid" in group else False,
            }
        )
    frame = pd.DataFrame(rows, columns=POINT_COLUMNS)
    return frame.sort_values(["metric", "arm", "position"], kind="stable", ignore_index=True)


def changed_levels(answers: pd.DataFrame | None, config: Plan) -> list[str]:
    """The labels of the levels at which any question's answer changes from the level
    before it, in the run's order."""
    if answers is None:
        return []
    order = level_order(config)
    changes = levels.answer_changes(answers, config.questions, order)
    named = {label for cell in changes["changes_at"].dropna() for label in cell.split(", ")}
    return [label for label in order if label in named]


def table(pooled: pd.DataFrame, config: Plan) -> pd.DataFrame:
    """The trade-off as summary.md shows it: a row per level (in the run's order) and arm,
    a column per panel's metric, each its mean ± the half width of its 95 % interval (none
    for one phase; ``†``: a phase's load fell short there; ``–``: not measured).  Pure."""
    shown = panels(config)
    order = level_order(config)
    data = points(pooled, [metric for metric, _title, _unit in shown], order)
    labels = {arm: spec.label for arm, spec in config.arms.items()}
    rows = []
    for label in order:
        for arm in config.arms:
            mine = data[(data[levels.LEVEL] == label) & (data["arm"] == arm)].set_index("metric")
            if mine.empty:
                continue
            row = {"level": label, "arm": labels[arm]}
            for metric, title, unit in shown:
                digits = TTFT_DIGITS if metric == names.TTFT_MEDIAN else None
                if metric not in mine.index or pd.isna(mine["mean"][metric]):
                    row[title] = "–"
                    continue
                mean, high = mine["mean"][metric], mine["ci_high"][metric]
                digits = DIGITS.get(unit, 2) if digits is None else digits
                text = fmt(mean, "", digits)
                if pd.notna(high):  # the interval's half width, in the mean's digits
                    text += f" ± {fmt(high - mean, '', digits)}"
                row[title] = f"{text} {SHORT_UNIT.get(unit, unit)}" + (" †" if mine["short"][metric] else "")
            rows.append(row)
    return pd.DataFrame(rows, columns=["level", "arm", *(title for _metric, title, _unit in shown)])
