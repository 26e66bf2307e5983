"""Figures of a run: ``render_figures(analysis)`` → RUN_DIR/figures/ (from the command
line: ``python -m thermab analyze RUN_DIR --figures``).

Always written: timeline.png/.svg (matplotlib), timeline.html (plotly, plotly.js inline so it
opens without network), cpu.png, throughput.png (the in-window throughput the verdicts test),
time_to_threshold.png.  The timeline has a power panel below the temperatures when the run
has power telemetry (the domains each host's total sums, see ``energy``), and a server panel
when the endpoint's ``/metrics`` was scraped (vLLM's running and waiting requests, beside the
configured users).  A figure whose data the run lacks (imported chart data has no CPU and no
requests) is still written and says so, so that a workflow can declare every file as an
output.  dose_response.png only for sweeps (more than two arms), wakeup.png only for a run
with wake-up probes (``layout.figures``).  questions.png: the forest plot of the declared
questions (per level in a run of levels).  tradeoff.png: each arm's metrics at each level of
traffic (report/tradeoff.py).  latency.png: each arm's latency percentiles.  Every value axis
names its unit in brackets; no legend lies over the axes' points.  A phase whose load fell
short of the configuration (``load_valid`` False) is drawn hollow and labelled "load short";
its load window on the timeline is hatched.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

from thermab import (
    layout,  # noqa: E402
    metric_names as names,  # noqa: E402
)
from thermab.analysis import levels  # noqa: E402
from thermab.analysis.load_validity import is_short  # noqa: E402
from thermab.analysis.model import Analysis, Plan, RunData, ordered_hosts  # noqa: E402
from thermab.analysis.questions import decisive_bounds  # noqa: E402
from thermab.headless import Axes, plt, ticker  # noqa: E402 (the Agg backend, literal text)
from thermab.layout import RunDir  # noqa: E402
from thermab.load import latency  # noqa: E402
from thermab.load.validity import bursts  # noqa: E402
from thermab.report import (  # noqa: E402
    scale,
    tradeoff,  # noqa: E402
    verdict,
)
from thermab.report.table_rows import tuple_rows
from thermab.telemetry.power import host_total_domains

ARM_COLORS = ["#e66101", "#5e3c99", "#1b9e77", "#2c7bb6", "#a6611a", "#d01c8b", "#666666"]
HEAD_ZONE_COLOR = "#b2182b"
OTHER_HOST_COLORS = ["#2166ac", "#4dac26", "#7b3294"]
# load windows are shaded and carry their own labels; run_start/run_end are the axis ends
UNLABELLED_EVENTS = {"load_start", "load_end", "run_start", "run_end"}
SHORT_LABEL = "load short"


class WindowRow(Protocol):
    """One load window of tables/windows.csv as the timeline draws it, ``short`` added."""

    @property
    def order(self) -> str: ...
    @property
    def rep(self) -> int: ...
    @property
    def arm(self) -> str: ...
    @property
    def load_start(self) -> float: ...
    @property
    def load_end(self) -> float: ...
    @property
    def short(self) -> bool: ...


def window_rows(windows: pd.DataFrame) -> Iterator[WindowRow]:
    """The load windows, each with ``short`` (its load fell short, ``is_short``)."""
    return tuple_rows(windows.assign(short=is_short(windows)))


class EventRow(Protocol):
    """One row of events.jsonl as the timeline marks it (``model.read_events``); ``detail`` is
    read where some event has one."""

    @property
    def t(self) -> float: ...
    @property
    def event(self) -> str: ...
    @property
    def arm(self) -> object: ...  # a phase's letter; NaN for an event of the whole run


# the events' rows
event_rows: Callable[[pd.DataFrame], Iterator[EventRow]] = tuple_rows


def render_figures(result: Analysis) -> list[Path]:
    """Render every figure of an analysed run (``run_analysis.compute``, or its numbers read
    back: ``run_analysis.read_numbers``); returns the paths written."""
    files = RunDir(result.run.path)
    files.figures.mkdir(parents=True, exist_ok=True)
    out = files.figure
    colors = {arm: ARM_COLORS[i % len(ARM_COLORS)] for i, arm in enumerate(result.run.plan.arms)}
    written = timeline_png(result.run, result.tables["windows"], colors, files.figures)
    written.append(timeline_html(result.run, result.tables["windows"], colors, out("timeline.html")))
    margins = scale.margin_offsets(result.tables.get("questions"), result.run.plan)
    written.append(cpu_png(result.tables["cpu"], result.run.plan, colors, out("cpu.png"), margins))
    written.append(
        throughput_png(result.tables["performance"], result.run.plan, colors, out("throughput.png"), margins)
    )
    written.append(time_to_threshold_png(result.tables, result.run.plan, colors, out("time_to_threshold.png")))
    if "questions" in result.tables:
        written.append(questions_png(result.tables["questions"], result.run.plan, colors, out("questions.png")))
    written.append(
        tradeoff.tradeoff_png(
            result.pooled,
            result.run.plan,
            colors,
            out("tradeoff.png"),
            result.tables["variance"],
            margins,
            result.tables.get("questions"),
        )
    )
    written.append(latency_png(result.tables["latency"], result.run.plan, colors, out("latency.png")))
    # layout.figures names them from run.json as the report rule does from the config: the
    # wake-up figure where the run made probes, a sweep's dose response
    plan = result.run.plan
    named = layout.figures(len(set(plan.order)), wakeup=bool(plan.wakeup_gaps_s))
    if set(layout.WAKEUP_FIGURES) <= set(named):
        written.append(wakeup_png(result.tables["wakeup"], plan, colors, out("wakeup.png")))
    if set(layout.SWEEP_FIGURES) <= set(named):
        written.append(dose_response_png(result.pooled, plan, result.best, out("dose_response.png")))
    return written


def _timeline_frames(run: RunData) -> tuple[float, pd.DataFrame, pd.DataFrame]:
    """(t0, head zones, timeline zone of each host) with t in minutes from run_start."""
    config = run.plan
    starts = run.events.loc[run.events["event"] == "run_start", "t"]
    t0 = starts.min() if len(starts) else run.telemetry.t_min
    thermal = run.telemetry.frame(kind="thermal").assign(minutes=lambda f: (f["t"] - t0) / 60)
    head = thermal[thermal["host"] == config.head]
    zone = thermal[thermal["sensor"] == config.timeline_zone]
    return t0, head, zone


def _power_lines(run: RunData, t0: float) -> list[tuple[str, str, pd.DataFrame]]:
    """(host, domain, samples with ``minutes``) of every domain a host's total sums, hosts in
    the run's order: what the power panel draws (empty without power telemetry)."""
    power = run.telemetry.frame(kind="power")
    lines = []
    for host in ordered_hosts(run.plan) + sorted(set(power["host"]) - set(ordered_hosts(run.plan))):
        own = power[power["host"] == host]
        for domain in host_total_domains(set(own["sensor"])):
            samples = own[own["sensor"] == domain].sort_values("t")
            lines.append((host, domain, samples.assign(minutes=(samples["t"] - t0) / 60)))
    return lines


def _server_lines(run: RunData, t0: float) -> list[tuple[str, pd.DataFrame]]:
    """(sensor, samples with ``minutes``) of the server's running and waiting requests: what
    the server panel draws (empty when /metrics was not scraped)."""
    server = run.telemetry.frame(kind="server")
    lines = []
    for sensor in SERVER_SENSORS:
        samples = server[server["sensor"] == sensor].sort_values("t")
        if len(samples):
            # scraped during the phases only: a gap between them is a break in the line
            spacing = samples["t"].diff()
            gap = spacing > SERVER_GAP_INTERVALS * spacing.median()
            # just after the last sample before a gap: a step line holds its value up to the break
            breaks = samples[gap].assign(t=samples["t"].shift()[gap] + 1e-3, value=np.nan)
            samples = pd.concat([samples, breaks]).sort_values("t", kind="stable")
            lines.append((sensor, samples.assign(minutes=(samples["t"] - t0) / 60)))
    return lines


SERVER_SENSORS = {"running": ("#1b7837", "-"), "waiting": ("#762a83", "--")}
SERVER_GAP_INTERVALS = 5  # a gap of more scrape intervals than this breaks the line


def _server_panel(
    ax: Axes,
    run: RunData,
    lines: list[tuple[str, pd.DataFrame]],
    windows: pd.DataFrame,
    colors: dict[str, str],
    t0: float,
) -> None:
    """The server's own running and waiting requests (its /metrics), load windows shaded."""
    for sensor, samples in lines:
        color, dash = SERVER_SENSORS[sensor]
        ax.step(
            samples["minutes"],
            samples["value"],
            where="post",
            color=color,
            ls=dash,
            lw=1.2,
            label=f"server {sensor} requests",
        )
    every = [level.users for level in levels.of_run(run.plan) if level is not None]
    for users in dict.fromkeys(every):  # the users (or an open loop's cap) of each level
        ax.axhline(users, ls=":", lw=1, color="#555555", label=f"{users} users")
    _finish_panel(ax, windows, colors, t0, "at the server (requests)")


def _finish_panel(ax: Axes, windows: pd.DataFrame, colors: dict[str, str], t0: float, ylabel: str) -> None:
    """A panel under the temperatures: load windows shaded in their arm's colour, from zero."""
    for window in window_rows(windows):
        ax.axvspan(
            (window.load_start - t0) / 60,
            (window.load_end - t0) / 60,
            color=colors.get(window.arm, "#999999"),
            alpha=0.13,
            lw=0,
        )
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.25)


def _host_color(run: RunData, host: str) -> str:
    if host == run.plan.head:
        return HEAD_ZONE_COLOR
    others = [h for h in ordered_hosts(run.plan) if h != run.plan.head]
    index = others.index(host) if host in others else len(others)
    return OTHER_HOST_COLORS[index % len(OTHER_HOST_COLORS)]


POWER_DASHES = ["-", "--", ":", "-."]


def _power_panel(
    ax: Axes,
    run: RunData,
    lines: list[tuple[str, str, pd.DataFrame]],
    windows: pd.DataFrame,
    colors: dict[str, str],
    t0: float,
) -> None:
    """Power of each host's total domains under the temperatures, load windows shaded."""
    styles: dict[str, int] = {}  # host → its domains drawn so far
    for host, domain, samples in lines:
        styles[host] = styles.get(host, -1) + 1
        ax.plot(
            samples["minutes"],
            samples["value"],
            color=_host_color(run, host),
            lw=1.2,
            ls=POWER_DASHES[styles[host] % len(POWER_DASHES)],
            label=f"{host} {domain} power",
        )
    _finish_panel(ax, windows, colors, t0, "power (W)")


def _last_t(run: RunData) -> float:
    """The last sample or event (events: a run without telemetry)."""
    return float(pd.Series([run.telemetry.t_max, run.events["t"].max()]).max())


def _arm_label(config: Plan, arm: str) -> str:
    """An arm's label; a letter the plan has no arm of (a run.json another tool wrote) as itself."""
    return config.arms[arm].label if arm in config.arms else arm


def _window_label(window: WindowRow, config: Plan) -> str:
    label = _arm_label(config, window.arm)
    short = f", {SHORT_LABEL}" if window.short else ""
    return f"{label} ({window.arm}, rep {window.rep}{short})"


def _reference_lines(config: Plan) -> list[tuple[float, str, str]]:
    lines = [(trip, f"trip point {trip:g} °C", "#67001f")] if (trip := config.trip_point_c) else []
    return lines + [(c, f"{c:g} °C", "#555555") for c in config.reference_lines_c]


def _labelled_events(run: RunData, t0: float, span_min: float) -> list[tuple[list[float], str]]:
    """Events to mark on the timeline as (minutes of each event, one label): events closer than
    1.5 % of the time span share a label, because their rotated texts would overlap."""
    events = run.events[~run.events["event"].isin(UNLABELLED_EVENTS)]
    groups: list[tuple[list[float], list[str]]] = []
    for event in event_rows(events):
        text = event.event if not isinstance(event.arm, str) else f"{event.event} {event.arm}"
        detail = getattr(event, "detail", None)  # a column only where some event has one
        if event.event == "note" and isinstance(detail, str):
            text = f"note: {detail}"
        minutes = (event.t - t0) / 60
        if groups and minutes - groups[-1][0][0] < 0.015 * span_min:
            groups[-1][0].append(minutes)
            groups[-1][1].append(text)
        else:
            groups.append(([minutes], [text]))
    return [(times, " / ".join(texts)) for times, texts in groups]


def timeline_png(run: RunData, windows: pd.DataFrame, colors: dict[str, str], out: Path) -> list[Path]:
    """timeline.png and timeline.svg."""
    config = run.plan
    t0, head, zone = _timeline_frames(run)
    power_lines = _power_lines(run, t0)
    server_lines = _server_lines(run, t0)
    # the panels under the temperatures, each drawn into its axes
    below: list[Callable[[Axes], None]] = []
    if power_lines:
        below.append(lambda panel: _power_panel(panel, run, power_lines, windows, colors, t0))
    if server_lines:
        below.append(lambda panel: _server_panel(panel, run, server_lines, windows, colors, t0))
    fig, axes = plt.subplots(
        1 + len(below),
        1,
        figsize=(14, 6.5 + 2.5 * len(below)),
        sharex=True,
        height_ratios=[3] + [1.3] * len(below),
        layout="constrained",
        squeeze=False,
    )
    ax = axes[0, 0]
    others = sorted(set(head["sensor"]) - {config.timeline_zone})
    for i, sensor in enumerate(others):
        samples = head[head["sensor"] == sensor]
        ax.plot(
            samples["minutes"],
            samples["value"],
            color="#9a9a9a",
            lw=0.7,
            alpha=0.8,
            label=f"{config.head} other zones ({', '.join(others)})" if i == 0 else None,
        )
    # a host without the zone gets no line, and no legend entry for a line that is not there
    hosts = [h for h in dict.fromkeys([config.head, *zone["host"].unique()]) if (zone["host"] == h).any()]
    for i, host in enumerate(hosts):
        samples = zone[zone["host"] == host]
        is_head = host == config.head
        ax.plot(
            samples["minutes"],
            samples["value"],
            lw=2.4 if is_head else 1.5,
            color=HEAD_ZONE_COLOR if is_head else OTHER_HOST_COLORS[(i - 1) % len(OTHER_HOST_COLORS)],
            label=f"{host} {config.timeline_zone}",
            zorder=3,
        )
    temperatures = pd.concat([head["value"], zone["value"]])
    lines = _reference_lines(config)
    if temperatures.empty:  # no thermal zone on any host: say so on an empty scale
        lines, low, high = [], 0.0, 100.0
        ax.text(
            0.5,
            0.5,
            "no thermal zones on any host: no temperatures in this run",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=13,
            color="#555555",
        )
    else:
        low = temperatures.min() - 3
        high = max([temperatures.max()] + [c for c, _, _ in lines]) + 4
    ax.set_ylim(low, high)
    for window in window_rows(windows):
        start, end = (window.load_start - t0) / 60, (window.load_end - t0) / 60
        ax.axvspan(
            start, end, color=colors.get(window.arm, "#999999"), alpha=0.13, lw=0, hatch="//" if window.short else None
        )
        ax.text(
            (start + end) / 2,
            high - 0.6,
            "load: " + _window_label(window, config),
            ha="center",
            va="top",
            fontsize=10,
            fontweight="bold",
            color=colors.get(window.arm, "#333333"),
        )
    for value, text, color in lines:
        ax.axhline(value, ls=":", lw=1.2, color=color)
        # below the line: the load-window labels sit at the top edge
        ax.annotate(
            text,
            (1, value),
            xycoords=("axes fraction", "data"),
            xytext=(-4, -2),
            textcoords="offset points",
            ha="right",
            va="top",
            fontsize=8,
            color=color,
        )
    span_min = (_last_t(run) - t0) / 60
    for times, text in _labelled_events(run, t0, span_min):
        for minutes in times:
            ax.axvline(minutes, color="#333333", lw=0.6, alpha=0.5, ls="--")
        ax.text(times[-1], low + 0.5, " " + text, rotation=90, va="bottom", ha="left", fontsize=7.5, color="#333333")
    ax.set_xlim(0, span_min)
    ax.set_ylabel("temperature (°C)")
    ax.set_title(_title(config, "thermal zones" + (" and power" if power_lines else "")))
    ax.grid(alpha=0.25)
    for draw, panel in zip(below, axes[1:, 0], strict=True):
        draw(panel)
    bottom = axes[-1, 0]
    bottom.set_xlabel("time from run_start (min)")
    handles = [h for axis in axes[:, 0] for h in axis.get_legend_handles_labels()[0]]
    bottom.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0, -0.1 if bottom is ax else -0.25),
        ncol=4,
        fontsize=8.5,
        frameon=False,
    )
    paths = [out / "timeline.png", out / "timeline.svg"]
    for path in paths:
        fig.savefig(path, dpi=130)
    plt.close(fig)
    return paths


def _title(config: Plan, what: str) -> str:
    arms = ", ".join(f"{spec.label} ({config.setting} {spec.value})" for spec in config.arms.values())
    return f"{config.cluster}: {what} — {arms}"


def _axes(row: int) -> tuple[str, str]:
    """The x and y axes of a subplot row, as plotly names them in layout references."""
    return ("x", "y") if row == 1 else (f"x{row}", f"y{row}")


def timeline_html(run: RunData, windows: pd.DataFrame, colors: dict[str, str], path: Path) -> Path:
    """The timeline as a self-contained interactive page (hover lists every zone at that time),
    with the power panel below it when the run has power telemetry."""
    config = run.plan
    t0, head, zone = _timeline_frames(run)
    power_lines = _power_lines(run, t0)
    server_lines = _server_lines(run, t0)
    power_row = 2 if power_lines else None
    server_row = (3 if power_lines else 2) if server_lines else None
    rows = 1 + bool(power_lines) + bool(server_lines)
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        row_heights=[0.72] + [0.28] * (rows - 1) if rows > 1 else None,
    )
    temps = {"row": 1, "col": 1}  # temperatures, their reference lines and the event marks
    for sensor, samples in head.groupby("sensor"):
        is_zone = sensor == config.timeline_zone
        fig.add_scatter(
            x=samples["minutes"],
            y=samples["value"],
            name=f"{config.head} {sensor}",
            line={"width": 3 if is_zone else 1, "color": HEAD_ZONE_COLOR if is_zone else "#a0a0a0"},
            hovertemplate="%{y:.1f} °C",
            **temps,
        )
    for i, (host, samples) in enumerate(zone[zone["host"] != config.head].groupby("host")):
        fig.add_scatter(
            x=samples["minutes"],
            y=samples["value"],
            name=f"{host} {config.timeline_zone}",
            line={"width": 2, "color": OTHER_HOST_COLORS[i % len(OTHER_HOST_COLORS)]},
            hovertemplate="%{y:.1f} °C",
            **temps,
        )
    styles: dict[str, int] = {}  # host → its domains drawn so far
    for host, domain, samples in power_lines:
        styles[host] = styles.get(host, -1) + 1
        fig.add_scatter(
            x=samples["minutes"],
            y=samples["value"],
            name=f"{host} {domain} power",
            line={
                "width": 1.5,
                "color": _host_color(run, host),
                "dash": ["solid", "dash", "dot", "dashdot"][styles[host] % 4],
            },
            hovertemplate="%{y:.1f} W",
            row=power_row,
            col=1,
        )
    for sensor, samples in server_lines:
        color, dash = SERVER_SENSORS[sensor]
        fig.add_scatter(
            x=samples["minutes"],
            y=samples["value"],
            name=f"server {sensor} requests",
            line={"width": 1.5, "color": color, "shape": "hv", "dash": "solid" if dash == "-" else "dash"},
            hovertemplate="%{y:.0f}",
            row=server_row,
            col=1,
        )
    # The bands, lines and their labels go into the layout at once: plotly's add_vrect,
    # add_hline and add_vline go over every axis of the figure at each call, which took most
    # of the page's time.
    shapes, notes = [], []
    for window in window_rows(windows):
        x0, x1 = (window.load_start - t0) / 60, (window.load_end - t0) / 60
        for row in filter(None, (1, power_row, server_row)):
            x, y = _axes(row)
            shapes.append(
                {
                    "type": "rect",
                    "xref": x,
                    "yref": f"{y} domain",
                    "x0": x0,
                    "x1": x1,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": colors.get(window.arm, "#999999"),
                    "opacity": 0.13,
                    "line": {"width": 0},
                }
            )
        notes.append(
            {
                "text": "load: " + _window_label(window, config),
                "xref": "x",
                "yref": "y domain",
                "x": (x0 + x1) / 2,
                "y": 1,
                "xanchor": "center",
                "yanchor": "top",
                "showarrow": False,
            }
        )
    for value, text, color in _reference_lines(config):
        across = {"xref": "x domain", "yref": "y"}  # the whole width, at a temperature
        line = {"type": "line", "x0": 0, "x1": 1, "y0": value, "y1": value, "line": {"color": color, "dash": "dot"}}
        shapes.append({**line, **across})
        notes.append(
            {"text": text, **across, "x": 1, "y": value, "xanchor": "right", "yanchor": "top", "showarrow": False}
        )
    for times, text in _labelled_events(run, t0, (_last_t(run) - t0) / 60):
        for minutes in times:
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "y domain",
                    "x0": minutes,
                    "x1": minutes,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "#777777", "dash": "dash", "width": 1},
                }
            )
        notes.append(
            {
                "text": text,
                "xref": "x",
                "yref": "y domain",
                "x": times[-1],
                "y": 0,
                "xanchor": "left",
                "yanchor": "bottom",
                "textangle": -90,
                "font": {"size": 10},
                "showarrow": False,
            }
        )
    fig.update_layout(shapes=shapes, annotations=notes)
    fig.update_layout(
        title=_title(config, "thermal zones" + (" and power" if power_lines else "")),
        hovermode="x unified",
        template="plotly_white",
        height=650 + 200 * (rows - 1),
    )
    fig.update_xaxes(title_text="time from run_start (min)", row=rows, col=1)
    fig.update_yaxes(title_text="temperature (°C)", **temps)
    if power_lines:
        fig.update_yaxes(title_text="power (W)", rangemode="tozero", row=power_row, col=1)
    if server_lines:
        fig.update_yaxes(title_text="at the server (requests)", rangemode="tozero", row=server_row, col=1)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def _placeholder(path: Path, title: str, message: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.axis("off")
    ax.set_title(title)
    # wrapped here: matplotlib's own wrap=True parses mathtext whatever text.parse_math says
    ax.text(0.5, 0.5, textwrap.fill(message, 75), ha="center", va="center", fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _arm_axis(ax: Axes, config: Plan, arms: list[str]) -> None:
    ax.set_xticks(range(len(arms)), [f"{config.arms[a].label}\n({a})" for a in arms])
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.grid(axis="y", alpha=0.3)


def _per_phase_points(
    ax: Axes,
    frame: pd.DataFrame,
    column: str,
    config: Plan,
    colors: dict[str, str],
    bar: tuple[str, str] | None = None,
    margins: tuple[Sequence[float], str] = ((), ""),
) -> None:
    """One point per phase at its arm, spread by repeat, with an optional bar (``bar``: the
    columns of its low and high ends) and the arm mean as a line, so that restart variance is
    visible next to the arm difference.  A phase whose load fell short is a hollow point
    labelled so.  The value axis is held to the reference mean ± the question's ``margins``
    (offsets, unit) and ± 5 % (``scale``)."""
    arms = [a for a in config.arms if a in set(frame["arm"])]
    frame = frame.assign(short=is_short(frame))
    for x, arm in enumerate(arms):
        rows = frame[frame["arm"] == arm].dropna(subset=[column])
        offsets = np.linspace(-0.15, 0.15, len(rows)) if len(rows) > 1 else [0.0]
        for offset, row in zip(offsets, rows.itertuples(index=False), strict=False):
            value = getattr(row, column)
            errors = None
            if bar is not None:
                low, high = bar
                errors = [[value - getattr(row, low)], [getattr(row, high) - value]]
            ax.errorbar(
                x + offset,
                value,
                yerr=errors,
                fmt="o",
                color=colors[arm],
                capsize=3,
                ms=6,
                mfc="white" if row.short else colors[arm],
            )
            ax.annotate(
                f"{row.order} rep{row.rep}{_level(frame, row)}" + (f", {SHORT_LABEL}" if row.short else ""),
                (x + offset, value),
                xytext=(6, 0),
                textcoords="offset points",
                fontsize=7,
                va="center",
            )
        if len(rows):
            ax.hlines(rows[column].mean(), x - 0.3, x + 0.3, color=colors[arm], lw=1.5, alpha=0.7)
    _arm_axis(ax, config, arms)
    shown = pd.concat([frame[c] for c in (column, *(bar or ()))])
    reference = frame.loc[frame["arm"] == config.reference_arm, column].mean()
    scale.hold(ax, shown.tolist(), reference, *margins)


def _level(frame: pd.DataFrame, row: object) -> str:
    """`` 16 users`` after a window's name in a run of levels: its level's label (docs/design.md,
    "Levels of load")."""
    many = levels.LEVEL in frame and frame[levels.LEVEL].nunique() > 1
    return f" {getattr(row, levels.LEVEL)}" if many else ""


def cpu_png(
    cpu: pd.DataFrame,
    config: Plan,
    colors: dict[str, str],
    path: Path,
    margins: dict[str, list[float]] | None = None,
) -> Path:
    """vLLM CPU median per phase (bars: 5th–95th percentile of the samples), one panel per host."""
    if cpu.empty:
        return _placeholder(path, "vLLM CPU", "no CPU data in this run")
    hosts = [h for h in ordered_hosts(config) if h in set(cpu["host"])]
    fig, axes = plt.subplots(1, len(hosts), figsize=(5 * len(hosts), 4.5), squeeze=False, layout="constrained")
    for ax, host in zip(axes[0], hosts, strict=False):
        offsets = (margins or {}).get(names.cpu_median(host), [])
        _per_phase_points(
            ax,
            cpu[cpu["host"] == host],
            "median_pct",
            config,
            colors,
            ("p5_pct", "p95_pct"),
            (offsets, "% of one core"),
        )
        ax.set_title(f"{host}: vLLM CPU sum, median (p5–p95)")
        ax.set_ylabel("vLLM CPU (% of one core)")
    fig.suptitle(_title(config, "CPU under load"), fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def throughput_png(
    perf: pd.DataFrame,
    config: Plan,
    colors: dict[str, str],
    path: Path,
    margins: dict[str, list[float]] | None = None,
) -> Path:
    """Output throughput and probe decode speed per phase: the throughput the verdicts test
    (the tokens generated inside the window, ``output_tok_s_in_window``, ± its standard error
    within the window), its margin lines about the reference arm's mean of the same numbers."""
    if perf["requests_completed"].isna().all():
        return _placeholder(path, "throughput", "no request data in this run")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), layout="constrained")
    margins = margins or {}
    in_window = perf["output_tok_s_in_window"]
    perf = perf.assign(se_low=in_window - perf["output_tok_s_se"], se_high=in_window + perf["output_tok_s_se"])
    _per_phase_points(
        axes[0],
        perf,
        "output_tok_s_in_window",
        config,
        colors,
        ("se_low", "se_high"),
        margins=(margins.get(names.OUTPUT_THROUGHPUT, []), "tok/s"),
    )
    axes[0].set_title("output throughput: tokens generated in the window\n(bar: ± its standard error)", fontsize=10)
    axes[0].set_ylabel("output throughput (tok/s)")
    probe_margins = (margins.get(names.PROBE_DECODE_SPEED, []), "tok/s")
    _per_phase_points(axes[1], perf, "probe_tok_s_median", config, colors, margins=probe_margins)
    arms = [a for a in config.arms if a in set(perf["arm"])]  # the x positions _per_phase_points gave them
    for x, arm in enumerate(arms):
        rows = perf[perf["arm"] == arm]
        if rows["probe_tok_s_median"].isna().all():
            arrived = bursts(pd.concat([rows["probe_arrivals_min"], rows["probe_arrivals_max"]]))
            axes[1].text(
                x,
                0.5,
                f"not measurable:\ntokens arrived\nin {arrived}" if arrived else "not measured",
                transform=axes[1].get_xaxis_transform(),
                ha="center",
                va="center",
                color="#555555",
            )
    axes[1].set_title("single-stream probe decode speed (median)\nonly where measurable", fontsize=10)
    axes[1].set_ylabel("decode speed (tok/s)")
    fig.suptitle(_title(config, "speed under load"), fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def time_to_threshold_png(tables: dict[str, pd.DataFrame], config: Plan, colors: dict[str, str], path: Path) -> Path:
    """Minutes from load start to each threshold on the head's timeline zone, one series per
    phase; thresholds a phase never reached are open triangles at the window's end."""
    head, zone = config.head, config.timeline_zone
    th = tables["thresholds"]
    th = th[(th["host"] == head) & (th["sensor"] == zone)]
    if th.empty:
        return _placeholder(path, "time to threshold", f"no {head} {zone} samples in a load window")
    window_min = tables["windows"]["window_s"].max() / 60
    thresholds = list(config.thresholds_c)
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    # a phase; a level's window in a run of levels
    keys = ["order", "rep", "arm"] + [levels.LEVEL] * (levels.LEVEL in th)
    phases = list(th.groupby(keys, sort=False, dropna=False))
    spread = np.linspace(-0.2, 0.2, len(phases)) if len(phases) > 1 else [0.0]
    peaks = tables["zones"].set_index(keys + ["host", "sensor"])["max_c"]
    for offset, (key, rows) in zip(spread, phases, strict=False):
        phase = rows.iloc[0]
        x = rows["threshold_c"].map(thresholds.index) + offset
        color = colors.get(phase.arm, "#333333")
        peak = peaks.get((*key, head, zone), math.nan)
        reached = rows["reached_s"].notna()
        short = is_short(rows).any()
        ax.plot(
            x[reached],
            rows["reached_s"][reached] / 60,
            "o--" if short else "o-",
            color=color,
            mfc="white" if short else color,
            label=f"{config.arms[phase.arm].label} ({phase.order} rep{phase.rep}{_level(th, phase)}"
            f"{', ' + SHORT_LABEL if short else ''}), peak {peak:.1f} °C",
        )
        ax.plot(x[~reached], [window_min] * int((~reached).sum()), "v", mfc="none", color=color, ms=10)
    ax.plot([], [], "v", mfc="none", color="#333333", ms=10, label="not reached within the load window")
    ax.set_xticks(range(len(thresholds)), [f"{c:g} °C" for c in thresholds])
    ax.set_xlim(-0.5, len(thresholds) - 0.5)
    ax.set_ylim(0, window_min * 1.08)
    ax.set_xlabel(f"threshold on {head} {zone} (°C)")
    ax.set_ylabel("first sample at or above,\nafter load start (min)")
    ax.set_title(_title(config, "time to threshold"), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: it covers no point
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def dose_response_png(pooled: pd.DataFrame, config: Plan, best: dict[str, Any] | None, path: Path) -> Path:
    """Setting value → head zone mean, head CPU, throughput and stall gaps (one point per
    phase, line through the arm means), naming the best setting (``stats.best_setting``)."""
    head, zone = config.head, config.timeline_zone
    values = {arm: spec.value for arm, spec in config.arms.items()}
    numeric = pd.to_numeric(pd.Series(values), errors="coerce")
    # a sweep over a numeric setting is read on its own scale; anything else in arm order
    positions = numeric if numeric.notna().all() else pd.Series(range(len(values)), index=list(values), dtype=float)
    panels = [
        (names.zone_mean(head, zone), "°C"),
        (names.cpu_median(head), "% of one core"),
        (names.OUTPUT_THROUGHPUT, "tok/s"),
        (names.STALL_GAPS, "gaps per phase"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), layout="constrained")
    for ax, (metric, unit) in zip(axes.flat, panels, strict=False):
        data = pooled[pooled["metric"] == metric].assign(x=lambda f: f["arm"].map(positions))
        ax.set_title(metric, fontsize=10)
        ax.set_ylabel(f"per phase ({unit})")
        if data.empty:
            ax.text(0.5, 0.5, "not measured in this run", transform=ax.transAxes, ha="center")
            continue
        short = is_short(data)
        ax.plot(data["x"][~short], data["value"][~short], "o", color="#777777", alpha=0.6)
        ax.plot(
            data["x"][short],
            data["value"][short],
            "o",
            color="#777777",
            mfc="white",
            label=SHORT_LABEL if short.any() else None,
        )
        means = data.groupby("x")["value"].mean()
        ax.plot(means.index, means.values, "-", color=HEAD_ZONE_COLOR, lw=1.5)
        if best is not None:
            ax.axvline(positions[best["arm"]], color="#1b9e77", ls="--", lw=1.2)
        ax.grid(alpha=0.3)
        if short.any():
            ax.legend(fontsize=8, loc="best")
        if numeric.notna().all() and (numeric > 0).all() and numeric.max() / numeric.min() >= 10:
            log_scale(ax, "x")
        if not numeric.notna().all():
            ax.set_xticks(positions.values, [config.arms[a].label for a in positions.index])
        ax.set_xlabel(f"{config.setting} (its value in each arm)")
    named = (
        "no temperature data"
        if best is None
        else f"lowest {head} {zone} without extra stalls or throughput loss beyond variance: "
        f"{config.setting} = {best['value']} ({best['label']})"
    )
    fig.suptitle(f"{_title(config, 'dose response')}\n{named}", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


VERDICT_MARKERS = {"yes": "o", "no": "X", "undecided": "s"}


def questions_png(answers: pd.DataFrame, config: Plan, colors: dict[str, str], path: Path) -> Path:
    """A forest plot of the declared questions: one panel per question, titled with its
    verdict line's label, in its metric's unit as the verdict line gives it (CPU in cores,
    stall gaps per phase) on the x axis; each arm's estimate with the interval its test uses,
    zero dotted and the margin (the bound the interval must clear) dashed; the verdict and
    the phases per arm beside it."""
    asked = config.questions
    if answers.empty or not asked:
        return _placeholder(path, "Questions", "no question declared")
    # a question's rows: one per arm, and per level in a run of levels
    every_level = levels.LEVEL in answers and answers[levels.LEVEL].nunique() > 1
    fig, axes = plt.subplots(len(asked), 1, figsize=(8, 0.9 + 0.85 * len(answers)), squeeze=False)
    for (ax,), question in zip(axes, asked, strict=False):
        rows = levels.rows_of(answers, question)
        if rows.empty:
            ax.axis("off")
            continue
        unit = str(rows["unit"].dropna().iloc[0]) if "unit" in rows and rows["unit"].notna().any() else ""
        factor, shown = verdict.RESTATED.get(unit, (1.0, unit))[:2]
        for y, row in enumerate(verdict.answer_rows(rows)):
            color = colors.get(row.arm, "black")
            if pd.notna(row.ci_low):
                ax.hlines(y, row.ci_low * factor, row.ci_high * factor, color=color, lw=2.5)
            if pd.notna(row.estimate):
                ax.plot(row.estimate * factor, y, VERDICT_MARKERS.get(row.verdict, "s"), color=color, ms=8)
            ax.annotate(
                f"{row.verdict.upper()} ({row.phases_per_arm} phase{'' if row.phases_per_arm == 1 else 's'} per arm)",
                (1.01, y),
                xycoords=("axes fraction", "data"),
                fontsize=8,
                va="center",
            )
        ax.axvline(0, color="grey", ls=":", lw=1)
        margin = rows["margin"].dropna()
        for bound in decisive_bounds(question, float(margin.iloc[0]) if len(margin) else 0.0):
            if bound:
                ax.axvline(bound * factor, color="black", ls="--", lw=1)
        ax.set_yticks(
            range(len(rows)),
            [
                f"{_arm_label(config, a)} vs {_arm_label(config, r)}" + (f" at {u}" if every_level else "")
                for a, r, u in zip(rows["arm"], rows["reference"], rows.get(levels.LEVEL, rows["arm"]), strict=False)
            ],
        )
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_title(verdict.label(rows.iloc[0]), fontsize=9, loc="left")
        ax.set_xlabel(f"arm − reference ({shown})" if shown else "arm − reference", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    level = answers["level"].dropna()
    fig.suptitle(
        f"Declared questions: arm − reference with its {level.iloc[0] * 100:.0f} % interval"
        if len(level)
        else "Declared questions",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


WAKEUP_PANELS = (("ttft_s", "time to first token"), ("first_step_s", "first decode step"))


def log_scale(ax: Axes, which: str) -> None:
    """``ax``'s ``which`` axis (x or y) logarithmic, its ticks labelled in plain numbers
    (``0.001``, ``120``): the default labels are mathtext, which headless draws as written, and
    a span within a decade has no decade to label."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


LEVEL_MARKERS, LEVEL_DASHES = ("o", "s", "^", "D", "v"), ("-", "--", ":", "-.")  # the lines of a run of levels


def wakeup_png(table: pd.DataFrame, config: Plan, colors: dict[str, str], path: Path) -> Path:
    """tables/wakeup.csv drawn: each arm's median latency (ms) against the idle gap before it
    (s), both axes logarithmic, with its interval, in a run of levels a line per arm and level
    (each level its own dash and marker: the probes after its windows); drawn for a run with
    wake-up probes (``layout.figures``), its panels say so where they measured nothing."""
    fig, axes = plt.subplots(1, len(WAKEUP_PANELS), figsize=(4.2 * len(WAKEUP_PANELS), 3.6), layout="constrained")
    many = levels.LEVEL in table and table[levels.LEVEL].nunique() > 1
    every = [level.label for level in levels.of_run(config) if level is not None] if many else [None]
    for ax, (column, title) in zip(axes, WAKEUP_PANELS, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("idle gap before the request (s)")
        ax.set_ylabel("median latency (ms)")
        if table.empty or table[column].isna().all():
            ax.text(0.5, 0.5, "no wake-up probes in this run", transform=ax.transAxes, ha="center", fontsize=8)
            continue
        for arm, (k, label) in ((arm, pair) for arm in config.arms for pair in enumerate(every)):
            line = table[(table["arm"] == arm) & table[column].notna()]
            line = (line if label is None else line[line[levels.LEVEL] == label]).sort_values("gap_s")
            if line.empty:
                continue
            median, low, high = (line[c] * 1000 for c in (column, f"{column[:-2]}_ci_low", f"{column[:-2]}_ci_high"))
            ax.errorbar(
                line["gap_s"],
                median,
                yerr=[(median - low).fillna(0), (high - median).fillna(0)],
                color=colors.get(arm, "black"),
                marker=LEVEL_MARKERS[k % len(LEVEL_MARKERS)],
                ls=LEVEL_DASHES[k % len(LEVEL_DASHES)],
                capsize=3,
                lw=1.3,
                label=config.arms[arm].label + ("" if label is None else f" after {label}"),
            )
        log_scale(ax, "x")
        log_scale(ax, "y")
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # below the panels: a run of levels has a line per arm and level
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize=7 if many else 8)
    fig.suptitle(
        f"{config.cluster}: latency after idle (median of the wake-up probes, 95 % interval where n ≥ 6)",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_png(table: pd.DataFrame, config: Plan, colors: dict[str, str], path: Path) -> Path:
    """tables/latency.csv drawn: a panel per latency (TTFT, TPOT, ITL, E2EL), each arm's
    (in a run of levels each arm's and level's) p50, p90 and p99 in ms: the mean of its
    phases' percentiles, the bar from the lowest phase's to the highest's; a run without
    latency data gets panels that say so."""
    percentiles = list(latency.PERCENTILES)
    fig, axes = plt.subplots(
        1, len(latency.LATENCIES), figsize=(3.6 * len(latency.LATENCIES), 3.6), layout="constrained"
    )
    many = levels.LEVEL in table and table[levels.LEVEL].nunique() > 1
    every = list(pd.unique(table[levels.LEVEL])) if many else [None]
    for ax, name in zip(axes, latency.LATENCIES, strict=True):
        columns = [f"{latency.stat_word(p)}_{name}_ms" for p in percentiles]
        ax.set_title(names.LATENCY_NAMES[name], fontsize=9)
        ax.set_xlabel("percentile over the requests" if name != "itl" else "percentile over the gaps")
        ax.set_ylabel(f"{names.LATENCY_NAMES[name]} (ms)")
        ax.set_xticks(range(len(percentiles)), [f"p{p}" for p in percentiles])
        ax.set_xlim(-0.4, len(percentiles) - 0.6)
        drawn = False
        for arm in config.arms:
            for k, label in enumerate(every):
                rows = table[table["arm"] == arm]
                rows = rows if label is None else rows[rows[levels.LEVEL] == label]
                values = rows[columns].astype("float64")
                if values.isna().all().all():
                    continue
                mean, low, high = values.mean(), values.min(), values.max()
                ax.errorbar(
                    range(len(percentiles)),
                    mean,
                    yerr=[mean - low, high - mean],
                    color=colors.get(arm, "black"),
                    marker=LEVEL_MARKERS[k % len(LEVEL_MARKERS)],
                    ls=LEVEL_DASHES[k % len(LEVEL_DASHES)],
                    capsize=3,
                    lw=1.3,
                    label=config.arms[arm].label + ("" if label is None else f" at {label}"),
                )
                drawn = True
        if drawn:
            ax.grid(alpha=0.3)
        else:
            ax.text(0.5, 0.5, "not measured in this run", transform=ax.transAxes, ha="center", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        if not handles:
            handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize=8)
    fig.suptitle(
        f"{config.cluster}: latency percentiles per arm (mean of the phases, bar: lowest to highest phase)",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
