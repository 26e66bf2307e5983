"""Per-phase metrics: pure functions from the tidy frames to the tables of docs/design.md.

Every function takes DataFrames (events, telemetry, requests, load windows) and returns a
DataFrame with fixed columns, empty but well-formed when there is nothing to measure, so
that the analysis of a partial or imported run never fails on a missing piece.
"""

import logging

import numpy as np
import pandas as pd

from thermab.load import validity

log = logging.getLogger(__name__)

PHASE_KEYS = ["order", "rep", "arm"]
WINDOW_COLUMNS = PHASE_KEYS + ["load_start", "load_end", "window_s"]
THRESHOLD_COLUMNS = PHASE_KEYS + ["host", "sensor", "threshold_c", "reached_s", "samples_at_or_above"]
ZONE_COLUMNS = PHASE_KEYS + ["host", "sensor", "mean_c", "max_c", "n"]
CPU_COLUMNS = PHASE_KEYS + ["host", "median_pct", "p5_pct", "p95_pct", "n"]
# docs/design.md's columns first; the rest are additions (see performance()).
PERFORMANCE_COLUMNS = PHASE_KEYS + [
    "requests_completed", "output_tokens", "window_s", "output_tok_s", "probe_tok_s_median",
    "probe_n", "stall_gaps", "max_gap_s", "errors", "probe_ok", "probe_arrivals_min", "probe_arrivals_max",
]
PHASE_METRIC_COLUMNS = PHASE_KEYS + ["metric", "unit", "value"]
CPU_SENSOR = "vllm_cpu_pct"


def load_windows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per phase with its load window ``[load_start, load_end)``, in time order.

    A phase that failed and was retried logs a second ``load_start`` under the same keys; the
    retry is the measurement, so the window opens at the last ``load_start`` and closes at the
    first ``load_end`` after it.  A phase that never logged that ``load_end`` is skipped.
    """
    if events.empty or "event" not in events:
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    starts = events[events["event"] == "load_start"]
    ends = events[events["event"] == "load_end"]
    rows = []
    for (order, rep, arm), phase in starts.groupby(PHASE_KEYS, sort=False):
        start = phase["t"].max()
        after = ends[(ends["order"] == order) & (ends["rep"] == rep) & (ends["arm"] == arm)
                     & (ends["t"] > start)]
        if after.empty:
            log.warning("phase %s rep%d-%s: load_start at t=%.1f has no load_end after it; skipped",
                        order, rep, arm, start)
            continue
        end = after["t"].min()
        rows.append((order, int(rep), arm, start, end, end - start))
    windows = pd.DataFrame(rows, columns=WINDOW_COLUMNS)
    return windows.sort_values("load_start", ignore_index=True)


def window_samples(telemetry: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Telemetry rows inside each load window, tagged with the phase keys, the window's
    position (``phase``, for time-ordered output) and ``t_rel`` = t − load_start."""
    parts = []
    for phase, window in enumerate(windows.itertuples(index=False)):
        inside = telemetry[(telemetry["t"] >= window.load_start) & (telemetry["t"] < window.load_end)]
        parts.append(inside.assign(phase=phase, order=window.order, rep=window.rep, arm=window.arm,
                                   t_rel=inside["t"] - window.load_start))
    if not parts:  # keep the telemetry dtypes so that the aggregations still apply
        return telemetry.iloc[:0].assign(phase=0, order="", rep=0, arm="", t_rel=0.0)
    return pd.concat(parts, ignore_index=True)


def _grouped(samples: pd.DataFrame, by: list[str]):
    """Group window samples so that results come out in time order of the phases."""
    return samples.groupby(["phase"] + PHASE_KEYS + by, sort=True)


def _finish(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return frame.reset_index().reindex(columns=columns)


def zone_stats(telemetry: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Mean, max and sample count of every thermal zone of every host per load window."""
    samples = window_samples(telemetry[telemetry["kind"] == "thermal"], windows)
    stats = _grouped(samples, ["host", "sensor"])["value"].agg(mean_c="mean", max_c="max", n="count")
    return _finish(stats, ZONE_COLUMNS)


def time_to_threshold(telemetry: pd.DataFrame, windows: pd.DataFrame, thresholds_c) -> pd.DataFrame:
    """Seconds from load_start to the first sample at or above each threshold (NaN when
    never), and how many samples were, so that a single grazing sample is visible."""
    samples = window_samples(telemetry[telemetry["kind"] == "thermal"], windows)
    rows = []
    for (_, order, rep, arm, host, sensor), zone in _grouped(samples, ["host", "sensor"]):
        for threshold in thresholds_c:
            above = zone["t_rel"][zone["value"] >= threshold]
            rows.append((order, rep, arm, host, sensor, float(threshold),
                         above.min() if len(above) else np.nan, len(above)))
    return pd.DataFrame(rows, columns=THRESHOLD_COLUMNS)


def cpu_stats(telemetry: pd.DataFrame, windows: pd.DataFrame, sensor: str = CPU_SENSOR) -> pd.DataFrame:
    """Median and 5th/95th percentiles of the vLLM CPU sum (% of one core) per host and window."""
    selected = telemetry[(telemetry["kind"] == "cpu") & (telemetry["sensor"] == sensor)]
    values = _grouped(window_samples(selected, windows), ["host"])["value"]
    stats = values.agg(median_pct="median", n="count")
    stats["p5_pct"] = values.quantile(0.05)
    stats["p95_pct"] = values.quantile(0.95)
    return _finish(stats, CPU_COLUMNS)


def probe_decode_speed(requests: pd.DataFrame) -> pd.Series:
    """Decode speed of each request in tok/s, NaN where it was not measurable: the load
    stage's rule (``load.validity.decode_speed``), so validity.json and the tables agree."""
    return validity.decode_speed(requests)


def performance(requests: pd.DataFrame | None, windows: pd.DataFrame) -> pd.DataFrame:
    """Throughput, probe decode speed, stalls and errors per load window.

    A request belongs to the window of its phase when it ends inside it (a failed request
    without ``t_end``: when it started inside it), so the requests of an aborted attempt of
    the same phase are not counted.  ``stall_gaps`` sums the per-request count of inter-token
    gaps of at least run.json ``stall_gap_s`` and ``max_gap_s`` is the largest gap, over the
    ok requests of the window (load and probe); both are NaN when the load generator did not
    record them.  ``probe_tok_s_median`` is the median over the probes whose decode speed was
    measurable, ``probe_n`` their number, ``probe_ok`` the ok probes of the window and
    ``probe_arrivals_min``/``_max`` the range of their token arrivals (how many bursts the
    tokens came in; NaN when not recorded).  Without request data every measured column is
    NaN, never zero.
    """
    rows = []
    for window in windows.itertuples(index=False):
        row = dict.fromkeys(PERFORMANCE_COLUMNS, np.nan)
        row.update(order=window.order, rep=window.rep, arm=window.arm, window_s=window.window_s)
        if requests is not None and not requests.empty:
            row.update(_window_requests(requests, window))
        rows.append(row)
    return pd.DataFrame(rows, columns=PERFORMANCE_COLUMNS)


def _window_requests(requests: pd.DataFrame, window) -> dict:
    phase = requests[(requests["order"] == window.order) & (requests["rep"] == window.rep)
                     & (requests["arm"] == window.arm)]
    t = phase["t_end"].fillna(phase["t_start"])
    phase = phase[(t >= window.load_start) & (t < window.load_end)]
    ok = phase[phase["ok"].astype(bool)]
    load = ok[ok["kind"] == "load"]
    ok_probes = ok[ok["kind"] == "probe"]
    probes = probe_decode_speed(ok_probes).dropna()
    arrivals = (ok_probes["token_arrivals"].astype("float64") if "token_arrivals" in ok_probes
                else pd.Series(dtype="float64"))  # runs recorded before the column existed
    output_tokens = int(load["completion_tokens"].sum())
    return {
        "requests_completed": len(load),
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / window.window_s,
        "probe_tok_s_median": probes.median() if len(probes) else np.nan,
        "probe_n": len(probes),
        "stall_gaps": ok["stall_gaps"].sum(min_count=1) if "stall_gaps" in ok else np.nan,
        "max_gap_s": ok["max_gap_s"].max() if "max_gap_s" in ok else np.nan,
        "errors": len(phase) - len(ok),
        "probe_ok": len(ok_probes),
        "probe_arrivals_min": arrivals.min(),
        "probe_arrivals_max": arrivals.max(),
    }


def phase_metrics(zones: pd.DataFrame, cpu: pd.DataFrame, perf: pd.DataFrame,
                  hosts: list[str], zone: str) -> pd.DataFrame:
    """The per-phase values the arm comparison works on, long format
    (order, rep, arm, metric, unit, value): the timeline zone's mean and the vLLM CPU median
    of every host (in the order of ``hosts``), throughput, probe speed and stall gaps."""
    parts = []
    for host in hosts:
        zone_mean = zones[(zones["host"] == host) & (zones["sensor"] == zone)]
        parts.append(_long(zone_mean, "mean_c", f"{host} {zone} mean", "°C"))
        parts.append(_long(cpu[cpu["host"] == host], "median_pct", f"{host} vLLM CPU median", "% of one core"))
    parts.append(_long(perf, "output_tok_s", "output throughput", "tok/s"))
    parts.append(_long(perf, "probe_tok_s_median", "probe decode speed", "tok/s"))
    parts.append(_long(perf, "stall_gaps", "stall gaps", "gaps"))
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"]).reset_index(drop=True)


def _long(table: pd.DataFrame, column: str, metric: str, unit: str) -> pd.DataFrame:
    values = table[PHASE_KEYS].assign(metric=metric, unit=unit, value=table[column].astype(float))
    return values.reindex(columns=PHASE_METRIC_COLUMNS)
