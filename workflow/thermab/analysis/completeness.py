"""How complete each host's telemetry is inside the load windows: per host and source, the
samples expected at its interval, the samples got, and the largest gap.  Pure: frames in,
a frame out; summary.md shows it, so a hole is never silent.

- expected: Σ over windows of ⌊window_s / interval⌋;
- got: Σ over windows of the samples of the source's sensors inside the window (the median
  over its sensors, so one silent zone shows in the gap rather than the count);
- largest gap: the longest stretch of a window without a sample of some sensor of the
  source, the window's edges included (a sensor silent for a whole window gives its length).

A source is what the agent samples at one interval (``thermal`` zones, ``hwmon``
temperatures, ``rapl`` and ``hwmon_power`` watts, ...): the series of one tidy kind may come
from several, each judged at its own interval (the run's ``sources``, from
tidy/ingest.json; a run without them counts each kind as one source).  The source's
interval is the run's configured one where known, else the median spacing of its distinct
samples over the whole run (``measured_intervals``, which the summary prints as how often
each source was sampled)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import numpy as np
import pandas as pd

from thermab.analysis.metrics import CPU_SENSOR, each_window, window_rows
from thermab.analysis.model import Sources, Telemetry, as_telemetry
from thermab.contracts import COMPLETENESS_COLUMNS
from thermab.telemetry.server_metrics import EVENT_MEANS

COLUMNS = COMPLETENESS_COLUMNS
ALWAYS = ("thermal", "cpu")  # a host reports these unless the run says it has no zones


def _median_spacing(times: list[np.ndarray]) -> float:
    """Of the steps between distinct times: a sample given twice (equal times) is no interval."""
    steps = np.concatenate([np.diff(t) for t in times]) if times else np.array([])
    steps = steps[steps > 0]
    return float(np.median(steps)) if len(steps) else math.nan


def source_times(
    telemetry: Telemetry | pd.DataFrame, host: str, sources: Sources | None = None
) -> dict[str, list[np.ndarray]]:
    """The sample times of each series of ``host``, by the source it came from
    (``sources[host][kind][sensor]``, else its kind); the CPU source's threads come and go
    with the load, so its sum stands for it; the server's means of events (TTFT, inter-token
    latency) have no value where no event was observed, so its scrapes stand for it (a hole
    is a scrape missed, not an interval without a first token)."""
    telemetry = as_telemetry(telemetry)
    of_host = (sources or {}).get(host, {})
    found: dict[str, list[np.ndarray]] = {}
    for key, arrays in telemetry.series(host=host, columns=("t",)):
        if key["kind"] == "cpu" and key["sensor"] != CPU_SENSOR:
            continue
        if key["kind"] == "server" and key["sensor"] in EVENT_MEANS:
            continue
        source = of_host.get(key["kind"], {}).get(key["sensor"], key["kind"])
        found.setdefault(source, []).append(arrays["t"])
    return found


def measured_intervals(
    telemetry: Telemetry | pd.DataFrame, host: str, sources: Sources | None = None
) -> dict[str, float]:
    """How often each source of ``host`` was sampled: the median spacing of its distinct
    samples over the run; a source with fewer than two samples has none."""
    intervals = {source: _median_spacing(times) for source, times in source_times(telemetry, host, sources).items()}
    return {source: interval for source, interval in sorted(intervals.items()) if not math.isnan(interval)}


def _largest_gap(t: np.ndarray, start: float, end: float) -> float:
    return float(np.diff(np.concatenate([[start], t, [end]])).max())


def completeness(
    telemetry: Telemetry | pd.DataFrame,
    windows: pd.DataFrame,
    hosts: list[str],
    intervals_s: Mapping[str, float] | None = None,
    hosts_without_zones: Collection[str] = (),
    sources: Sources | None = None,
) -> pd.DataFrame:
    """One row per host and source: every source a host sent, plus thermal and cpu, which
    every host is expected to send (thermal not from ``hosts_without_zones``).
    ``telemetry``: a model.Telemetry or the tidy frame; ``intervals_s``: the configured
    interval per source; ``sources``: the source of each series (see module doc)."""
    telemetry = as_telemetry(telemetry)
    rows = []
    for host in hosts:
        by_source = source_times(telemetry, host, sources)
        expected_sources = {k for k in ALWAYS if not (k == "thermal" and host in hosts_without_zones)}
        for kind in sorted(set(by_source) | expected_sources):
            times = by_source.get(kind, [])
            interval = (intervals_s or {}).get(kind) or _median_spacing(times)
            cuts = [window_rows(t, windows) for t in times]
            expected = got = largest = 0.0
            for i, window in enumerate(each_window(windows)):
                if not math.isnan(interval) and interval > 0:
                    expected += math.floor(window.window_s / interval)
                # the median over sensors, so one silent zone shows in the gap, not the count
                counts = [stops[i] - starts[i] for starts, stops in cuts]
                got += float(np.median(counts)) if counts else 0.0
                gaps = [
                    _largest_gap(t[starts[i] : stops[i]], window.load_start, window.load_end)
                    for t, (starts, stops) in zip(times, cuts, strict=False)
                ]
                largest = max([largest] + (gaps or [window.load_end - window.load_start]))
            rows.append(
                (
                    host,
                    kind,
                    interval,
                    expected if not math.isnan(interval) else math.nan,
                    got,
                    largest if len(windows) else math.nan,
                )
            )
    return pd.DataFrame(rows, columns=COLUMNS)
