"""Per-phase metrics: pure functions from the tidy frames to the tables of docs/design.md.

Every function takes DataFrames (events, requests, load windows) and the telemetry, as the
tidy frame or as a model.Telemetry read from the file, and returns a DataFrame with fixed
columns, empty but well-formed when there is nothing to measure, so that the analysis of a
partial or imported run never fails on a missing piece.
"""

import logging
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import pandas as pd

from thermab import metric_names as names
from thermab.analysis.model import Telemetry, as_telemetry
from thermab.load import validity

log = logging.getLogger(__name__)

PHASE_KEYS = ["order", "rep", "arm"]
WINDOW_COLUMNS = PHASE_KEYS + ["load_start", "load_end", "window_s"]
THRESHOLD_COLUMNS = PHASE_KEYS + ["host", "sensor", "threshold_c", "reached_s", "samples_at_or_above"]
ZONE_COLUMNS = PHASE_KEYS + ["host", "sensor", "mean_c", "max_c", "n"]
CPU_COLUMNS = PHASE_KEYS + ["host", "median_pct", "p5_pct", "p95_pct", "n"]
# docs/design.md's columns first; the rest are additions (see performance()).
PERFORMANCE_COLUMNS = PHASE_KEYS + [
    "requests_completed",
    "output_tokens",
    "window_s",
    "output_tok_s",
    "probe_tok_s_median",
    "probe_n",
    "stall_gaps",
    "max_gap_s",
    "errors",
    "probe_ok",
    "probe_arrivals_min",
    "probe_arrivals_max",
    "output_tok_s_in_window",
    "output_tok_s_se",
    "ttft_median_s",
    "probe_tokens_per_step",
]
BATCHES = 6  # equal parts of a window whose rates give its throughput's standard error
PHASE_METRIC_COLUMNS = PHASE_KEYS + ["metric", "unit", "value"]
# what performance() reads of tidy/requests.parquet (stall_gaps and max_gap_s where recorded)
REQUEST_COLUMNS = [
    "t_start",
    "t_first_token",
    "t_end",
    "kind",
    "ok",
    "completion_tokens",
    "stall_gaps",
    "max_gap_s",
    "token_arrivals",
    "token_span_s",
    "token_chunks",
    "usage_source",
]
CPU_SENSOR = "vllm_cpu_pct"


class Span(Protocol):
    """A stretch ``[load_start, load_end)`` of a run's time: a load window, a part of one, or
    a row of a frame of windows."""

    @property
    def load_start(self) -> float: ...

    @property
    def load_end(self) -> float: ...


class LoadWindow(NamedTuple):
    """One load window, a row of ``load_windows``."""

    order: str
    rep: int
    arm: str
    load_start: float
    load_end: float
    window_s: float


def each_window(windows: pd.DataFrame) -> list[LoadWindow]:
    """The rows of a frame of load windows (``WINDOW_COLUMNS``; other columns left out), in its order."""
    columns = (windows[column].tolist() for column in WINDOW_COLUMNS)
    return [
        LoadWindow(str(order), int(rep), str(arm), start, end, length)  # the times as the frame holds them
        for order, rep, arm, start, end, length in zip(*columns, strict=True)
    ]


def load_windows(events: pd.DataFrame, start_event: str = "load_start", end_event: str = "load_end") -> pd.DataFrame:
    """One row per phase with its load window ``[load_start, load_end)``, in time order (or
    the window between two other marks, e.g. the idle window's: its bounds in the same columns).

    A phase that failed and was retried logs a second ``load_start`` under the same keys; the
    retry is the measurement, so the window opens at the last ``load_start`` and closes at the
    first ``load_end`` after it.  A phase that never logged that ``load_end`` is skipped.
    """
    if events.empty or "event" not in events:
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    starts = events[events["event"] == start_event]
    ends = events[events["event"] == end_event]
    rows = []
    for (order, rep, arm), phase in starts.groupby(PHASE_KEYS, sort=False):
        start = phase["t"].max()
        after = ends[(ends["order"] == order) & (ends["rep"] == rep) & (ends["arm"] == arm) & (ends["t"] > start)]
        if after.empty:
            log.warning(
                "phase %s rep%d-%s: %s at t=%.1f has no %s after it; skipped",
                order,
                rep,
                arm,
                start_event,
                start,
                end_event,
            )
            continue
        end = after["t"].min()
        rep_number = int(rep)  # type: ignore[call-overload]  # pandas-stubs: a group's key is any Hashable
        rows.append((order, rep_number, arm, start, end, end - start))
    windows = pd.DataFrame(rows, columns=WINDOW_COLUMNS)
    return windows.sort_values("load_start", ignore_index=True)


def phase_rows(requests: pd.DataFrame) -> dict[Hashable, np.ndarray]:
    """The positions of each phase's rows, by (order, rep, arm): found once, not by comparing
    every row with every window."""
    return {key: np.asarray(rows) for key, rows in requests.groupby(PHASE_KEYS, sort=False).indices.items()}


def window_rows(t: np.ndarray, windows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For samples at times ``t`` (sorted), the positions of each window's first sample and
    of the first sample after it: the window [load_start, load_end) holds t[start:stop]."""
    starts = np.searchsorted(t, windows["load_start"].to_numpy("float64"), side="left")
    stops = np.searchsorted(t, windows["load_end"].to_numpy("float64"), side="left")
    return starts, np.maximum(stops, starts)


def series_in_windows(
    telemetry: Telemetry | pd.DataFrame,
    windows: pd.DataFrame,
    *,
    kind: str | None = None,
    sensor: str | None = None,
    host: str | None = None,
) -> Iterator[tuple[dict[str, str], pd.DataFrame]]:
    """Each series of ``telemetry`` (a model.Telemetry or the tidy frame) that matches
    ``kind``, ``sensor`` and ``host`` (those given) with its samples inside the load windows: ({host,
    kind, sensor}, frame of phase, t, t_rel, value), phase = the window's position in
    ``windows`` and t_rel = t − load_start; in window order, then time order.

    Windows are cut by binary search in the series' sorted times, so a table reads only its
    series, and keeps of them only what is inside the windows, one series at a time."""
    telemetry = as_telemetry(telemetry)
    load_start = windows["load_start"].to_numpy("float64")
    for key, arrays in telemetry.series(kind, sensor, host):
        starts, stops = window_rows(arrays["t"], windows)
        phase = np.repeat(np.arange(len(windows)), stops - starts)
        rows = (
            np.concatenate([np.arange(a, b) for a, b in zip(starts, stops, strict=False)])
            if len(windows)
            else np.array([], int)
        )
        t = arrays["t"][rows]
        yield (
            key,
            pd.DataFrame({"phase": phase, "t": t, "t_rel": t - load_start[phase], "value": arrays["value"][rows]}),
        )


def per_window(
    telemetry: Telemetry | pd.DataFrame,
    windows: pd.DataFrame,
    by: list[str],
    aggregate: Callable[[pd.DataFrame], pd.DataFrame],
    columns: list[str],
    **selection: str | None,
) -> pd.DataFrame:
    """``aggregate(samples)`` of each selected series inside the windows (samples as of
    ``series_in_windows``; it returns rows with a ``phase`` column), tagged with the phase
    keys and the series keys ``by``, in the order of a groupby over (phase, *by): windows in
    time order, then series.  Only windows where a series has samples get rows."""
    parts = []
    for key, samples in series_in_windows(telemetry, windows, **selection):
        if len(samples):
            parts.append(aggregate(samples).assign(**{k: key[k] for k in by}))
    if not parts:
        return pd.DataFrame(columns=columns)
    # series come in (host, kind, sensor) order, so a stable sort by phase orders by (phase, *by)
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.iloc[np.argsort(rows["phase"].to_numpy(), kind="stable")].reset_index(drop=True)
    keys = windows[PHASE_KEYS].iloc[rows["phase"]].reset_index(drop=True)
    return pd.concat([keys, rows.drop(columns="phase")], axis=1).reindex(columns=columns)


def zone_stats(telemetry: Telemetry | pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Mean, max and sample count of every thermal zone of every host per load window."""

    def aggregate(samples: pd.DataFrame) -> pd.DataFrame:
        stats = samples.groupby("phase")["value"].agg(max_c="max", n="count")
        stats.insert(0, "mean_c", exact_means(samples))
        return stats.reset_index()

    return per_window(telemetry, windows, ["host", "sensor"], aggregate, ZONE_COLUMNS, kind="thermal")


def exact_means(samples: pd.DataFrame) -> pd.Series:
    """Mean of ``value`` per ``phase`` (samples sorted by phase; NaN skipped) from the correctly
    rounded sum (math.fsum): the same digits whatever the order of the samples, whereas
    pandas' group means differ in the last digit between its kernels (compensated
    summation, or a plain sum where the groups are sorted, as of pandas 3.1)."""
    phase, values = samples["phase"].to_numpy(), samples["value"].to_numpy("float64")
    means = []
    for chunk in np.split(values, np.flatnonzero(np.diff(phase)) + 1):
        chunk = chunk[~np.isnan(chunk)]
        means.append(math.fsum(chunk.tolist()) / len(chunk) if len(chunk) else np.nan)
    return pd.Series(means, index=pd.unique(phase) if len(phase) else [], dtype="float64")


def time_to_threshold(
    telemetry: Telemetry | pd.DataFrame, windows: pd.DataFrame, thresholds_c: Sequence[float]
) -> pd.DataFrame:
    """Seconds from load_start to the first sample at or above each threshold (NaN when
    never), and how many samples were, so that a single grazing sample is visible."""
    thresholds = np.asarray(thresholds_c, dtype="float64")

    def aggregate(samples: pd.DataFrame) -> pd.DataFrame:
        phase, t_rel, value = (samples[c].to_numpy() for c in ("phase", "t_rel", "value"))
        phases = np.unique(phase)  # the windows with samples, each with a row per threshold
        reached, count = [], []
        for threshold in thresholds:
            above = value >= threshold
            first = pd.Series(t_rel[above]).groupby(phase[above]).min()
            reached.append(first.reindex(phases).to_numpy("float64"))
            count.append(np.bincount(phase[above], minlength=phases.max() + 1)[phases])
        shape = (len(phases), 0)  # no thresholds asked: no rows
        return pd.DataFrame(
            {
                "phase": np.repeat(phases, len(thresholds)),
                "threshold_c": np.tile(thresholds, len(phases)),
                "reached_s": (np.column_stack(reached) if reached else np.zeros(shape)).ravel(),
                "samples_at_or_above": (np.column_stack(count) if count else np.zeros(shape, int)).ravel(),
            }
        )

    return per_window(telemetry, windows, ["host", "sensor"], aggregate, THRESHOLD_COLUMNS, kind="thermal")


def cpu_stats(telemetry: Telemetry | pd.DataFrame, windows: pd.DataFrame, sensor: str = CPU_SENSOR) -> pd.DataFrame:
    """Median and 5th/95th percentiles of the vLLM CPU sum (% of one core) per host and window."""

    def aggregate(samples: pd.DataFrame) -> pd.DataFrame:
        values = samples.groupby("phase")["value"]
        stats = values.agg(median_pct="median", n="count")
        stats["p5_pct"] = values.quantile(0.05)
        stats["p95_pct"] = values.quantile(0.95)
        return stats.reset_index()

    return per_window(telemetry, windows, ["host"], aggregate, CPU_COLUMNS, kind="cpu", sensor=sensor)


def probe_decode_speed(requests: pd.DataFrame) -> pd.Series:
    """Decode speed of each request in tok/s, NaN where it was not measurable: the load
    stage's rule (``load.validity.decode_speed``), so validity.json and the tables agree."""
    return validity.decode_speed(requests)


def request_tokens_per_step(requests: pd.DataFrame) -> pd.Series:
    """Each request's own tokens per decode step, (completion_tokens − 1) / (token_chunks − 1):
    the server streams one chunk per engine step per request, the first carrying the
    prefill's token, so the chunks after it count the decode steps and the tokens after it
    what those steps yielded (under speculative decoding, one plus the drafts accepted).
    NaN where the chunks were not counted (records without ``token_chunks``), fewer
    than two came, or ``usage_source`` is "chunks" (the tokens were then counted as chunks:
    the ratio would be 1 whatever the steps yielded)."""
    if "token_chunks" not in requests:
        return pd.Series(np.nan, index=requests.index, dtype="float64")
    steps = requests["token_chunks"].astype("float64") - 1  # nullable Int64: NA → NaN
    tokens = requests["completion_tokens"].astype("float64")
    counted = ~requests["usage_source"].isin(["chunks"]) if "usage_source" in requests else True
    return ((tokens - 1) / steps).where((steps >= 1) & counted)


def at_median_probe(speeds: pd.Series, values: pd.Series) -> float:
    """``values`` of the probe whose decode speed is the median of ``speeds`` (NaN where not
    measurable, left out), for an even count the mean of the two middle probes' values, the
    middle by decode speed; NaN where no probe was measurable or a middle probe has no value.

    The probe whose speed ``probe_tok_s_median`` is, not a median of the values on their own:
    a probe's decode speed is its tokens per step over the step time, so the value that goes
    with the median speed is that probe's own; a median taken apart may come from another
    probe, whose luck with its drafts the median speed does not carry."""
    speed = speeds.to_numpy("float64", na_value=np.nan)
    value = values.to_numpy("float64", na_value=np.nan)
    measured = ~np.isnan(speed)
    ranked = value[measured][np.argsort(speed[measured], kind="stable")]
    if not len(ranked):
        return np.nan
    middle = (len(ranked) - 1) // 2
    return float(np.mean(ranked[middle : len(ranked) - middle]))


def performance(requests: pd.DataFrame | None, windows: pd.DataFrame) -> pd.DataFrame:
    """Throughput, probe decode speed, stalls and errors per load window.

    A request belongs to the window of its phase when it ends inside it (a failed request
    without ``t_end``: when it started inside it), so the requests of an aborted attempt of
    the same phase are not counted.  ``stall_gaps`` sums the per-request count of inter-token
    gaps of at least run.json ``stall_gap_s`` and ``max_gap_s`` is the largest gap, over the
    ok requests of the window (load and probe); both are NaN when the load generator did not
    record them.  ``ttft_median_s`` is the median time to first token (``t_first_token -
    t_start``) of the window's ok load requests: the latency of the load's own requests, from
    when each left (an open loop's wait for a slot of its cap comes before that).
    ``probe_tok_s_median`` is the median over the probes whose decode speed was
    measurable, ``probe_n`` their number, ``probe_ok`` the ok probes of the window and
    ``probe_arrivals_min``/``_max`` the range of their token arrivals (how many bursts the
    tokens came in; NaN when not recorded).  ``probe_tokens_per_step`` is the tokens per
    decode step of the probe(s) behind ``probe_tok_s_median`` (``at_median_probe`` of
    ``request_tokens_per_step``): what the probes' drafts yielded, the covariate of their
    decode speed.  Without request data every measured column is NaN, never zero.

    Two throughputs: ``output_tok_s``, the tokens of the load requests that *ended* in the
    window (the study's figure, for its tables), and ``output_tok_s_in_window``, each load
    request's share of its tokens generated inside the window (``tokens_in_window``'s
    count), which the verdicts use: it leaves out neither the requests still in flight at
    load_end nor the part of the first requests generated before load_start, so it does not
    move by whole requests from phase to phase (docs/design.md, "Throughput in the window").
    ``output_tok_s_se`` is that throughput's standard error within its window
    (``in_window_se``).
    """
    if requests is None or requests.empty:
        requests, phases = None, {}
    else:
        phases = phase_rows(requests)
        # the columns used, not the tags and texts that every selection would copy
        requests = requests[[c for c in REQUEST_COLUMNS if c in requests]]
    rows = []
    for window in each_window(windows):
        row: dict[str, object] = dict.fromkeys(PERFORMANCE_COLUMNS, np.nan)
        row.update(order=window.order, rep=window.rep, arm=window.arm, window_s=window.window_s)
        if requests is not None:
            positions = phases.get((window.order, window.rep, window.arm), np.array([], dtype=int))
            row.update(_window_requests(requests.iloc[positions], window))
            row["output_tok_s_in_window"] = in_window_tok_s(requests.iloc[positions], window)
            row["output_tok_s_se"] = in_window_se(requests.iloc[positions], window)
        rows.append(row)
    return pd.DataFrame(rows, columns=PERFORMANCE_COLUMNS)


def _window_requests(phase: pd.DataFrame, window: LoadWindow) -> dict[str, float]:
    """The figures of one window from the requests of its phase (order, rep, arm)."""
    t = phase["t_end"].fillna(phase["t_start"])
    phase = phase[(t >= window.load_start) & (t < window.load_end)]
    ok = phase[phase["ok"].astype(bool)]
    load = ok[ok["kind"] == "load"]
    ok_probes = ok[ok["kind"] == "probe"]
    speeds = probe_decode_speed(ok_probes)
    probes = speeds.dropna()
    arrivals = (
        ok_probes["token_arrivals"].astype("float64") if "token_arrivals" in ok_probes else pd.Series(dtype="float64")
    )  # runs recorded before the column existed
    output_tokens = int(load["completion_tokens"].sum())
    ttft = (load["t_first_token"] - load["t_start"]).dropna() if "t_first_token" in load else load["t_start"].iloc[:0]
    return {
        "requests_completed": len(load),
        "ttft_median_s": ttft.median() if len(ttft) else np.nan,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / window.window_s,
        "probe_tok_s_median": probes.median() if len(probes) else np.nan,
        "probe_n": len(probes),
        "probe_tokens_per_step": at_median_probe(speeds, request_tokens_per_step(ok_probes)),
        "stall_gaps": ok["stall_gaps"].sum(min_count=1) if "stall_gaps" in ok else np.nan,
        "max_gap_s": ok["max_gap_s"].max() if "max_gap_s" in ok else np.nan,
        "errors": len(phase) - len(ok),
        "probe_ok": len(ok_probes),
        "probe_arrivals_min": arrivals.min(),
        "probe_arrivals_max": arrivals.max(),
    }


def tokens_in_window(requests: pd.DataFrame | None, window: Span) -> float:
    """Output tokens generated inside ``window`` (load_start, load_end) by ``requests`` (one
    phase's): each ok request's ``completion_tokens`` times the share of its span from first
    token (``t_start`` where none was recorded) to ``t_end`` inside the window; a request
    whose tokens came at one instant counts wholly where that instant falls.  NaN without
    request data, never zero. (J/token and the throughput of the verdicts both count so.)"""
    if requests is None or requests.empty:
        return np.nan
    ok = requests[requests["ok"].astype(bool) & requests["t_end"].notna()]
    first = (ok["t_first_token"] if "t_first_token" in ok else ok["t_start"]).fillna(ok["t_start"]).to_numpy(float)
    last = ok["t_end"].to_numpy(float)
    tokens = ok["completion_tokens"].to_numpy(float)
    overlap = np.minimum(last, window.load_end) - np.maximum(first, window.load_start)
    span = last - first
    instant = (last >= window.load_start) & (last < window.load_end)
    share = np.where(span > 0, np.clip(overlap / np.where(span > 0, span, 1.0), 0.0, 1.0), instant)
    return float(np.sum(tokens * share))


def in_window_tok_s(phase: pd.DataFrame, window: LoadWindow) -> float:
    """Output tok/s of the load requests of one phase, counted inside the window."""
    if not window.window_s > 0:
        return np.nan
    return tokens_in_window(phase[phase["kind"] == "load"], window) / window.window_s


def in_window_se(phase: pd.DataFrame, window: LoadWindow, batches: int = BATCHES) -> float:
    """The standard error of one phase's in-window throughput (``in_window_tok_s``), by batch
    means: the window cut into ``batches`` equal parts, the sd of the parts' rates over
    √batches.  NaN without a window or request data."""
    if not window.window_s > 0:
        return np.nan
    load = phase[phase["kind"] == "load"]
    edges = np.linspace(window.load_start, window.load_end, batches + 1)
    part_s = window.window_s / batches
    rates = [
        tokens_in_window(load, window._replace(load_start=start, load_end=end, window_s=part_s)) / part_s
        for start, end in zip(edges[:-1], edges[1:], strict=True)
    ]
    return float(np.std(rates, ddof=1) / math.sqrt(batches))


def phase_metrics(
    zones: pd.DataFrame, cpu: pd.DataFrame, perf: pd.DataFrame, hosts: list[str], zone: str
) -> pd.DataFrame:
    """The per-phase values the arm comparison works on, long format
    (order, rep, arm, metric, unit, value): the timeline zone's mean and the vLLM CPU median
    of every host (in the order of ``hosts``), throughput (counted in the window), probe
    speed with the probes' own tokens per step, and stall gaps."""
    parts = []
    for host in hosts:
        zone_mean = zones[(zones["host"] == host) & (zones["sensor"] == zone)]
        parts.append(long(zone_mean, "mean_c", names.zone_mean(host, zone), "°C"))
        parts.append(long(cpu[cpu["host"] == host], "median_pct", names.cpu_median(host), "% of one core"))
    parts.append(long(perf, "output_tok_s_in_window", names.OUTPUT_THROUGHPUT, "tok/s"))
    parts.append(long(perf, "probe_tok_s_median", names.PROBE_DECODE_SPEED, "tok/s"))
    parts.append(long(perf, "probe_tokens_per_step", names.PROBE_ACCEPTANCE_LENGTH, "tokens/step"))
    parts.append(long(perf, "ttft_median_s", names.TTFT_MEDIAN, "s"))
    parts.append(long(perf, "stall_gaps", names.STALL_GAPS, "gaps"))
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"]).reset_index(drop=True)


def no_metrics() -> pd.DataFrame:
    """The long format of ``phase_metrics`` without a row, typed as one with rows is."""
    types = {"rep": "int64", "value": "float64"}
    return pd.DataFrame({column: pd.Series(dtype=types.get(column, "object")) for column in PHASE_METRIC_COLUMNS})


def long(table: pd.DataFrame, column: str, metric: str, unit: str) -> pd.DataFrame:
    """``table``'s ``column`` as one metric in the long format of ``phase_metrics``."""
    values = table[PHASE_KEYS].assign(metric=metric, unit=unit, value=table[column].astype(float))
    return values.reindex(columns=PHASE_METRIC_COLUMNS)
