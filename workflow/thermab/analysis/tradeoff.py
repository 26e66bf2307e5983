"""The trade-off across load (figures/tradeoff.png): for each arm, the metrics a change
trades against one another drawn against the users (throughput, decode speed per stream,
head temperature, head CPU, energy per token), each level's mean of its phases with its
95 % interval, so one run shows at which load a change starts to cost speed.  A run of one
level draws its one point per arm."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from thermab import metric_names as names  # noqa: E402
from thermab.analysis.load_validity import is_short  # noqa: E402
from thermab.analysis.stats import describe, t_quantile  # noqa: E402

POINT_COLUMNS = ["metric", "arm", "users", "n", "mean", "ci_low", "ci_high", "short"]


def panels(config: dict) -> list[tuple[str, str, str]]:
    """(metric, its title, unit) of each panel, in order."""
    zone, cpu = names.zone_mean(config["head"], config["timeline_zone"]), names.cpu_median(config["head"])
    return [
        (names.OUTPUT_THROUGHPUT, names.OUTPUT_THROUGHPUT, "tok/s"),
        (names.PROBE_DECODE_SPEED, "decode speed per stream (probe)", "tok/s"),
        (zone, zone, "°C"),
        (cpu, cpu, "% of one core"),
        (names.CLUSTER_ENERGY_PER_TOKEN, "energy per token (cluster)", "J/token"),
    ]


def points(pooled: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Per metric, arm and users: the phases' n, mean and 95 % t interval of the mean (NaN
    for one phase), and whether a phase there had a short load.  Pure."""
    data = pooled[pooled["metric"].isin(metrics) & pooled["users"].notna()] if "users" in pooled else pooled.iloc[:0]
    rows = []
    for (metric, arm, users), group in data.groupby(["metric", "arm", "users"], sort=True):
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
                "users": int(users),
                "n": stats["n"],
                "mean": stats["mean"],
                "ci_low": stats["mean"] - half,
                "ci_high": stats["mean"] + half,
                "short": bool(is_short(group).any()) if "load_valid" in group else False,
            }
        )
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def tradeoff_png(pooled: pd.DataFrame, config: dict, colors: dict, path: Path) -> Path:
    shown = panels(config)
    data = points(pooled, [metric for metric, _title, _unit in shown])
    levels = sorted(data["users"].unique()) if len(data) else []
    fig, axes = plt.subplots(1, len(shown), figsize=(3.4 * len(shown), 3.6), layout="constrained")
    for ax, (metric, title, unit) in zip(axes, shown, strict=False):
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        ax.set_xlabel("users")
        mine = data[data["metric"] == metric]
        if mine.empty:
            ax.text(0.5, 0.5, "not measured in this run", transform=ax.transAxes, ha="center", fontsize=8)
            continue
        for arm in config["arms"]:
            line = mine[mine["arm"] == arm]
            if line.empty:
                continue
            color = colors.get(arm, "black")
            ax.errorbar(
                line["users"],
                line["mean"],
                yerr=[line["mean"] - line["ci_low"], line["ci_high"] - line["mean"]],
                color=color,
                marker="o",
                capsize=3,
                lw=1.3,
                label=config["arms"][arm]["label"],
            )
            short = line[line["short"]]
            ax.plot(short["users"], short["mean"], "o", mfc="white", color=color, ms=8)
        if levels and levels[-1] / levels[0] >= 10:
            ax.set_xscale("log")
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{config.get('cluster', '')}: each arm against users (mean of its phases, 95 % interval;"
        " hollow: a phase's load fell short)",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
