"""Wake-up after idle (docs/design.md, "Wake-up probes"): ``tables/wakeup.csv`` from the
requests of kind ``wakeup``, single requests each sent ``gap_s`` after the server's last
one ended, at the end of a phase's load.  Per arm and gap: the median time to first token
and the median first decode step (second token − first), each with its distribution-free
95 % interval (binomial order statistics; none for fewer than 6 probes, where no pair of
order statistics covers 95 %).  Pure functions over tidy/requests.parquet; plots.wakeup_png
draws the table."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats

from thermab import metric_names as names
from thermab.analysis.metrics import no_metrics
from thermab.load.shapes import WAKEUP

LEVEL = 0.95
COLUMNS = [
    "arm",
    "gap_s",
    "n",
    "ttft_s",
    "ttft_ci_low",
    "ttft_ci_high",
    "first_step_s",
    "first_step_ci_low",
    "first_step_ci_high",
]


def median_interval(values: ArrayLike) -> tuple[float, float, float]:
    """The median of ``values`` and the narrowest symmetric pair of order statistics
    (x₍ₖ₎, x₍ₙ₋ₖ₊₁₎) that covers the median with at least LEVEL (the sign test's
    interval); NaN bounds where even (x₍₁₎, x₍ₙ₎) covers less."""
    ordered = np.sort(np.asarray(values, dtype=float))
    ordered = ordered[np.isfinite(ordered)]
    n = len(ordered)
    if n == 0:
        return np.nan, np.nan, np.nan
    median = float(np.median(ordered))
    k = order_statistic(n)
    if k < 1:
        return median, np.nan, np.nan
    return median, float(ordered[k - 1]), float(ordered[n - k])


@functools.cache
def order_statistic(n: int) -> int:
    """The largest k with P(x₍ₖ₎ ≤ m ≤ x₍ₙ₋ₖ₊₁₎) = 1 − 2·P(Binom(n, ½) ≤ k − 1) ≥ LEVEL; 0: none."""
    k = int(stats.binom.ppf((1 - LEVEL) / 2, n, 0.5)) + 1  # at most one above it
    while k >= 1 and 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) < LEVEL:
        k -= 1
    return k


def wakeup_table(requests: pd.DataFrame | None) -> pd.DataFrame:
    """One row per arm and gap of the run's successful wake-up probes."""
    if requests is None or requests.empty or "gap_s" not in requests:
        return pd.DataFrame(columns=COLUMNS)
    probes = requests[(requests["kind"] == WAKEUP) & requests["ok"] & requests["gap_s"].notna()]
    rows = []
    for (arm, gap), group in probes.groupby(["arm", "gap_s"], sort=True):
        ttft = median_interval(group["t_first_token"] - group["t_start"])
        step = median_interval(group["first_step_s"]) if "first_step_s" in group else (np.nan,) * 3
        rows.append([arm, float(gap), len(group), *ttft, *step])  # type: ignore[arg-type]  # pandas-stubs: a key is Hashable
    return pd.DataFrame(rows, columns=COLUMNS).astype({"n": "int64"})


def phase_metrics(requests: pd.DataFrame | None) -> pd.DataFrame:
    """Per phase and gap, the median time to first token of its wake-up probes, in the long
    format of metrics.phase_metrics (metric ``metric_names.ttft_after(gap)``, in s): what a
    question naming a gap tests."""
    columns = ["order", "rep", "arm", "metric", "unit", "value"]
    if requests is None or requests.empty or "gap_s" not in requests:
        return no_metrics()
    probes = requests[(requests["kind"] == WAKEUP) & requests["ok"] & requests["gap_s"].notna()]
    ttft = (probes["t_first_token"] - probes["t_start"]).rename("value")
    medians = ttft.groupby([probes["order"], probes["rep"], probes["arm"], probes["gap_s"]]).median().reset_index()
    after = medians.assign(metric=[names.ttft_after(gap) for gap in medians["gap_s"]], unit="s")[columns]
    return pd.concat([after, penalty_metrics(requests)], ignore_index=True)


def penalty_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Per phase and gap, the wake-up penalty: the median TTFT of the probes after the gap
    less the median of the same phase's back-to-back probes (``gap_s`` empty, but the first,
    which opened the connection), and the same of the first decode step; in ms, metrics
    ``metric_names.wakeup_penalty``. A contrast inside one server start, so what each
    start draws (its step time moves every probe of the phase alike) cancels; a phase
    without back-to-back probes (a run from before them) has none."""
    wake = requests[(requests["kind"] == WAKEUP) & requests["ok"]].assign(
        ttft=requests["t_first_token"] - requests["t_start"],
        step=requests["first_step_s"] if "first_step_s" in requests else np.nan,
    )
    rows = []
    for (order, rep, arm), phase in wake.groupby(["order", "rep", "arm"], sort=False):
        unpaced = phase[phase["gap_s"].isna()].sort_values("t_start").iloc[1:]  # the first opened the connection
        if unpaced.empty:
            continue
        reference = unpaced[["ttft", "step"]].median()
        for gap, probes in phase[phase["gap_s"].notna()].groupby("gap_s"):
            penalty = (probes[["ttft", "step"]].median() - reference) * 1000  # ms: a wake-up is a few
            gap_s: float = gap  # type: ignore[assignment]  # pandas-stubs: a group's key is any scalar
            rows.append([order, rep, arm, names.wakeup_penalty(gap_s), "ms", penalty["ttft"]])
            rows.append([order, rep, arm, names.wakeup_penalty(gap_s, step=True), "ms", penalty["step"]])
    frame = pd.DataFrame(rows, columns=["order", "rep", "arm", "metric", "unit", "value"])
    return frame.dropna(subset=["value"]) if rows else no_metrics()
