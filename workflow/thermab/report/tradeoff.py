"""figures/tradeoff.png: the trade-off across traffic (report/traffic.py's numbers) drawn, a
panel per metric (head temperature, head CPU, energy per token, latency, throughput, decode
speed per stream), each arm's mean at each level of load with its 95 % interval, the levels
in the run's order and a dotted line before each level at which a question's answer changes,
so one run shows under which traffic a change starts to cost.  A run of one level has no
trade-off across traffic to show: it draws, in one panel, each of those metrics' difference
to the reference in % of the reference mean with its 95 % interval, against ± 5 % and the
questions' margins.  Every value axis is held to scale (``scale``)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pandas as pd

from thermab.analysis import levels
from thermab.analysis.model import Plan
from thermab.headless import plt  # the Agg backend, literal text
from thermab.report import scale
from thermab.report.traffic import changed_levels, level_order, panels, points


def tradeoff_png(
    pooled: pd.DataFrame,
    config: Plan,
    colors: dict[str, str],
    path: Path,
    variance: pd.DataFrame | None = None,
    margins: dict[str, list[float]] | None = None,
    answers: pd.DataFrame | None = None,
) -> Path:
    """``margins``: metric → its questions' bounds as offsets from the reference (``scale``);
    ``answers``: questions.csv, for the levels at which an answer changes."""
    shown = panels(config)
    order = level_order(config)
    data = points(pooled, [metric for metric, _title, _unit in shown], order)
    present = [label for label in order if label in set(data[levels.LEVEL])]
    if len(present) <= 1 and variance is not None:
        return _one_level_png(variance, config, colors, path, margins or {})
    changed = changed_levels(answers, config)
    columns = 3
    rows = math.ceil(len(shown) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.6 * rows), layout="constrained", squeeze=False)
    ticks = [textwrap.fill(label, 12) for label in order]
    for ax, (metric, title, unit) in zip(axes.flat, shown, strict=False):
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(f"mean of the phases ({unit})")
        mine = data[data["metric"] == metric]
        if mine.empty:
            ax.text(0.5, 0.5, "not measured in this run", transform=ax.transAxes, ha="center", fontsize=8)
        for arm in config.arms:
            line = mine[mine["arm"] == arm]
            if line.empty:
                continue
            color = colors.get(arm, "black")
            ax.errorbar(
                line["position"],
                line["mean"],
                yerr=[line["mean"] - line["ci_low"], line["ci_high"] - line["mean"]],
                color=color,
                marker="o",
                capsize=3,
                lw=1.3,
                label=config.arms[arm].label,
            )
            short = line[line["short"]]
            ax.plot(short["position"], short["mean"], "o", mfc="white", color=color, ms=8)
        for label in changed:
            ax.axvline(order.index(label) - 0.5, color="#444444", ls=":", lw=1.2)
        if len(mine):
            reference = mine.loc[mine["arm"] == config.reference_arm, "mean"].mean()
            scale.hold(ax, pd.concat([mine["mean"], mine["ci_low"], mine["ci_high"]]).tolist(), reference)
        ax.set_xticks(range(len(order)), ticks, fontsize=7)
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8, loc="best")
    where = f"; dotted: an answer changes at {', '.join(changed)}" if changed else ""
    fig.suptitle(
        f"{config.cluster}: each arm at each level of traffic (mean of its phases, 95 % interval;"
        f" hollow: a phase's load fell short{where})",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def one_level_rows(variance: pd.DataFrame, config: Plan, margins: dict[str, list[float]]) -> pd.DataFrame:
    """Per panel metric and non-reference arm: the difference in % of the reference mean with
    its 95 % interval, and the questions' margins in the same %.  Pure."""
    rows = []
    for metric, title, _unit in panels(config):
        selected = variance[(variance["metric"] == metric) & variance["reference"].notna()]
        reference = variance.loc[(variance["metric"] == metric) & (variance["arm"] == config.reference_arm), "mean"]
        ref_mean = float(reference.iloc[0]) if len(reference) else math.nan
        percent = [100 * o / abs(ref_mean) for o in margins.get(metric, [])] if ref_mean else []
        for row in selected.itertuples(index=False):
            rows.append(
                {
                    "metric": title,
                    "arm": row.arm,
                    "diff_pct": row.diff_pct,
                    "low_pct": row.ci_low_pct,
                    "high_pct": row.ci_high_pct,
                    "margins_pct": percent,
                }
            )
    return pd.DataFrame(rows, columns=["metric", "arm", "diff_pct", "low_pct", "high_pct", "margins_pct"])


def _one_level_png(
    variance: pd.DataFrame, config: Plan, colors: dict[str, str], path: Path, margins: dict[str, list[float]]
) -> Path:
    rows = one_level_rows(variance, config, margins)
    titles = [title for _metric, title, _unit in panels(config)]
    fig, ax = plt.subplots(figsize=(9.5, 0.6 * len(titles) + 1.6), layout="constrained")
    arms = [a for a in config.arms if a in set(rows["arm"])]
    for k, arm in enumerate(arms):
        mine = rows[rows["arm"] == arm]
        y = [titles.index(m) + 0.15 * (k - (len(arms) - 1) / 2) for m in mine["metric"]]
        ax.errorbar(
            mine["diff_pct"],
            y,
            xerr=[mine["diff_pct"] - mine["low_pct"], mine["high_pct"] - mine["diff_pct"]],
            fmt="o",
            color=colors.get(arm, "black"),
            capsize=3,
            label=f"{config.arms[arm].label} − {config.arms[config.reference_arm].label}",
        )
    drawn = rows.drop_duplicates("metric")
    for metric, margins_pct in zip(drawn["metric"], drawn["margins_pct"], strict=True):
        for margin in margins_pct:
            i = titles.index(metric)
            ax.vlines(margin, i - 0.35, i + 0.35, color="#444444", ls="--", lw=1)
    ax.axvline(0, color="#888888", lw=1)
    values = pd.concat([rows["diff_pct"], rows["low_pct"], rows["high_pct"]]).tolist()
    every_margin = [m for ms in rows["margins_pct"] for m in ms]
    limits = scale.held_limits(values, 0.0, every_margin, at_least=scale.FLOOR_PCT)
    assert limits is not None  # held_limits gives None for an unknown reference alone, and 0 is known
    ax.set_xlim(*limits)
    ax.set_yticks(range(len(titles)), titles)
    ax.invert_yaxis()
    ax.set_xlabel("arm − reference, 95 % interval (% of the reference mean)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    one = levels.of_run(config)
    at = f" at {one[0].label}" if len(one) == 1 and one[0] is not None else ""
    ax.set_title(
        f"{config.cluster}: each metric's change{at}, one load level (dashed: the question's margin)",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
