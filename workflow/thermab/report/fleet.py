"""The fleet report: the same study on several clusters, side by side.

Reads only each cluster's ``run.json`` and ``tables/variance.csv`` (the per-arm means and
verdicts of the analysis), so every cluster keeps its own report and this one compares:
head zone mean, head vLLM CPU, output throughput, the cluster's energy per output token
(where it has power telemetry), and each comparison's verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd  # noqa: E402

from thermab import metric_names as names  # noqa: E402
from thermab.analysis import energy  # noqa: E402
from thermab.analysis.model import Plan, read_plan  # noqa: E402
from thermab.headless import plt  # noqa: E402 (the Agg backend, literal text)
from thermab.layout import RunDir  # noqa: E402
from thermab.markup import md_text  # noqa: E402
from thermab.report.summary import markdown_table  # noqa: E402
from thermab.report.units import DIGITS, fmt  # noqa: E402

COLUMNS = ["cluster", "arm", "label", "n", "metric", "unit", "mean", "diff_pct", "finding", "verdict"]


def metrics_of(run: Plan) -> list[str]:
    head, zone = run.head, run.timeline_zone
    return [names.zone_mean(head, zone), names.cpu_median(head), names.OUTPUT_THROUGHPUT, energy.METRIC]


def fleet_table(run_dirs: dict[str, Path], analysis: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per cluster, arm and headline metric (metric names lose the head's host
        name, which differs between clusters).  ``analysis``: the settings the runs were analysed
    with, in place of run.json's (their metric names carry the timeline zone)."""
    frames = []
    for cluster, run_dir in run_dirs.items():
        run = read_plan(RunDir(run_dir).run_json, analysis)
        variance = pd.read_csv(RunDir(run_dir).table("variance"))
        wanted = metrics_of(run)
        rows = variance[variance["metric"].isin(wanted)].copy()
        rows["metric"] = rows["metric"].replace(
            {wanted[0]: names.zone_mean("head", run.timeline_zone), wanted[1]: names.cpu_median("head")}
        )
        # a run of levels: a row per cluster and level
        many = "load_level" in rows and rows["load_level"].nunique() > 1
        rows.insert(0, "cluster", [f"{cluster} at {label}" for label in rows["load_level"]] if many else cluster)
        frames.append(rows.reindex(columns=COLUMNS))
    return pd.concat(frames, ignore_index=True)


def fleet_markdown(table: pd.DataFrame, order: str) -> str:
    wide = table.pivot_table(index=["cluster", "arm", "label"], columns="metric", values="mean", aggfunc="first")
    rounded = wide.round(1)
    if energy.METRIC in wide:  # J/token needs three decimals; the Markdown table prints two
        rounded[energy.METRIC] = wide[energy.METRIC].map(lambda v: fmt(v, "", DIGITS["J/token"]))
    wide = rounded.reset_index()
    lines = [
        f"# thermab fleet report — order {md_text(order)}, {table['cluster'].nunique()} clusters",
        "",
        "Per-arm means over each cluster's phases (n = phases per arm; units: °C, % of one core, tok/s,"
        " J/token; a cluster without power telemetry has no energy per token).",
        "",
        markdown_table(wide),
        "",
        "## Verdicts per cluster",
        "",
    ]
    for cluster, rows in table.groupby("cluster", sort=False):
        lines.append(f"### {md_text(cluster)}")
        lines += [
            f"- {md_text(verdict)}" for verdict in rows["verdict"].dropna() if not verdict.startswith("reference")
        ]
        lines.append("")
    return "\n".join(lines)


def fleet_figure(table: pd.DataFrame, out_png: Path) -> None:
    metrics = list(dict.fromkeys(table["metric"]))
    figure, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    clusters = list(dict.fromkeys(table["cluster"]))
    arms = list(dict.fromkeys(table["label"]))
    width = 0.8 / max(len(arms), 1)
    for axis, metric in zip(axes[0], metrics, strict=False):
        rows = table[table["metric"] == metric]
        for index, label in enumerate(arms):
            values = [rows[(rows["cluster"] == c) & (rows["label"] == label)]["mean"].mean() for c in clusters]
            axis.bar([i + index * width for i in range(len(clusters))], values, width, label=label)
        axis.set_xticks([i + width * (len(arms) - 1) / 2 for i in range(len(clusters))], clusters)
        axis.set_title(f"{metric} ({rows['unit'].iloc[0]})", fontsize=10)
        axis.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out_png, dpi=120)
    plt.close(figure)


def write_fleet(
    run_dirs: dict[str, Path],
    order: str,
    out_csv: Path,
    out_md: Path,
    out_png: Path,
    analysis: dict[str, Any] | None = None,
) -> None:
    table = fleet_table(run_dirs, analysis)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_csv, index=False)
    out_md.write_text(fleet_markdown(table, order))
    fleet_figure(table, out_png)
