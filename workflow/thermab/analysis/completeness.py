"""How complete each host's telemetry is inside the load windows: per host and source, the
samples expected at its interval, the samples got, and the largest gap.  Pure: frames in,
a frame out; summary.md shows it, so a hole is never silent.

- expected: Σ over windows of ⌊window_s / interval⌋;
- got: Σ over windows of the samples of the source's sensors inside the window (the median
  over its sensors, so one silent zone shows in the gap rather than the count);
- largest gap: the longest stretch of a window without a sample of some sensor of the
  source, the window's edges included (a sensor silent for a whole window gives its length).

The source's interval is the run's configured one where known, else the median spacing of
its samples over the whole run."""

from __future__ import annotations

import math

import pandas as pd

from thermab.analysis.metrics import CPU_SENSOR

COLUMNS = ["host", "source", "interval_s", "expected", "got", "largest_gap_s"]
ALWAYS = ("thermal", "cpu")  # a host reports these unless the run says it has no zones


def _sensors(own: pd.DataFrame, kind: str) -> pd.DataFrame:
    rows = own[own["kind"] == kind]
    # the CPU source's threads come and go with the load: its sum is the measure
    return rows[rows["sensor"] == CPU_SENSOR] if kind == "cpu" else rows


def _median_spacing(rows: pd.DataFrame) -> float:
    steps = rows.sort_values("t").groupby("sensor")["t"].diff().dropna()
    return float(steps.median()) if len(steps) else math.nan


def _window_counts(rows: pd.DataFrame, start: float, end: float, sensors: list[str]) -> tuple[float, float]:
    """(median samples per sensor, largest gap) inside one window."""
    inside = rows[(rows["t"] >= start) & (rows["t"] < end)]
    counts, gaps = [], []
    for sensor in sensors:
        times = sorted(inside.loc[inside["sensor"] == sensor, "t"])
        counts.append(len(times))
        edges = [start] + times + [end]
        gaps.append(max(b - a for a, b in zip(edges, edges[1:])))
    if not sensors:
        return 0.0, end - start
    return float(pd.Series(counts).median()), max(gaps)


def completeness(telemetry: pd.DataFrame, windows: pd.DataFrame, hosts: list[str],
                 intervals_s: dict[str, float] | None = None,
                 hosts_without_zones: list[str] = ()) -> pd.DataFrame:
    """One row per host and source (``kind`` of the tidy telemetry): every source a host
    sent, plus thermal and cpu, which every host is expected to send (thermal not from
    ``hosts_without_zones``).  ``intervals_s``: the configured interval per source."""
    rows = []
    for host in hosts:
        own = telemetry[telemetry["host"] == host]
        kinds = sorted(set(own["kind"]) | {k for k in ALWAYS if not (k == "thermal" and host in hosts_without_zones)})
        for kind in kinds:
            samples = _sensors(own, kind)
            interval = (intervals_s or {}).get(kind) or _median_spacing(samples)
            sensors = sorted(samples["sensor"].unique())
            expected = got = 0.0
            largest = 0.0
            for window in windows.itertuples(index=False):
                if not math.isnan(interval) and interval > 0:
                    expected += math.floor(window.window_s / interval)
                count, gap = _window_counts(samples, window.load_start, window.load_end, sensors)
                got += count
                largest = max(largest, gap)
            rows.append((host, kind, interval, expected if not math.isnan(interval) else math.nan, got,
                         largest if len(windows) else math.nan))
    return pd.DataFrame(rows, columns=COLUMNS)
