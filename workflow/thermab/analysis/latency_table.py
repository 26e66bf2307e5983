"""Latency per phase as ``vllm bench serve`` reports it (``tables/latency.csv``), and its
percentiles and goodput as per-phase metrics that questions may name.

TTFT, TPOT and E2EL come from the tidy requests (exact, the window's ok load requests), ITL
from each window's sketch in its ``latency.json`` (the load wrote it; its gaps are in no
table); goodput from the requests and the run's ``load.slo``. The definitions are
``thermab.load.latency``'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

from thermab import metric_names as names
from thermab.analysis.metrics import PHASE_KEYS, each_window, long, no_metrics, phase_rows
from thermab.contracts import WindowKey
from thermab.errors import UserError
from thermab.load import latency, sketch

STATS = ["mean", *(latency.stat_word(p) for p in latency.PERCENTILES)]
LATENCY_COLUMNS = [f"{stat}_{name}_ms" for name in latency.LATENCIES for stat in STATS]
COLUMNS = PHASE_KEYS + ["completed", "failed", *LATENCY_COLUMNS, "goodput_pct", "goodput_tok_s"]


def sketches(
    reports: Mapping[WindowKey, Mapping[str, Any]], requests: pd.DataFrame | None
) -> dict[tuple[str, int, str], dict[int, int]]:
    """The ITL sketch's bins of each window, by (order, rep, arm), from the latency.json
    reports (``model.read_latency``) of the level the requests are at (a run of levels has
    one report per level of each phase). A sketch of another accuracy or a malformed one is a
    UserError naming the window."""
    if requests is None or requests.empty:
        return {}
    levels = set(requests["load_level"].dropna()) if "load_level" in requests else set()
    bins: dict[tuple[str, int, str], dict[int, int]] = {}
    for (order, rep, arm, _users, level), report in reports.items():
        if levels and level is not None and level not in levels:
            continue
        keys, counts = report.get("itl_keys"), report.get("itl_counts")
        if report.get("relative_accuracy") != sketch.RELATIVE_ACCURACY or not _bins_ok(keys, counts):
            raise UserError(
                f"phases/rep{rep}-{arm}: latency.json's ITL sketch is not thermab's "
                f"(relative accuracy {sketch.RELATIVE_ACCURACY}, itl_keys and itl_counts lists of whole numbers)"
            )
        bins[(order, rep, arm)] = sketch.merged([(keys, counts)])
    return bins


def _whole_numbers(values: object) -> TypeGuard[list[int]]:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _bins_ok(keys: object, counts: object) -> bool:
    return _whole_numbers(keys) and _whole_numbers(counts) and len(keys) == len(counts) and all(c >= 0 for c in counts)


def latency_table(
    requests: pd.DataFrame | None,
    windows: pd.DataFrame,
    bins: Mapping[tuple[str, int, str], dict[int, int]],
    slo: Mapping[str, float] | None,
) -> pd.DataFrame:
    """One row per load window: its ok load requests' count (``completed``), its failed
    ones, mean, median, p90 and p99 of TTFT, TPOT, ITL and E2EL in ms, and against an SLO
    the share of good requests (``goodput_pct``) and their output tok/s. NaN where nothing
    was measured (ITL: where the window has no sketch)."""
    rows: list[dict[str, object]] = []
    phases = phase_rows(requests) if requests is not None and len(requests) else {}
    if requests is not None and phases:  # every request's latencies once, as arrays; each window takes its rows of them
        every = latency.request_latencies(requests)
        t_start, t_end = (requests[c].to_numpy("float64", na_value=np.nan) for c in ("t_start", "t_end"))
        load = (requests["kind"] == "load").to_numpy()
        ok = requests["ok"].to_numpy(bool, na_value=False)
    for window in each_window(windows):
        key = (window.order, window.rep, window.arm)
        row = {"order": window.order, "rep": window.rep, "arm": window.arm}
        if key in phases:
            positions = phases[key]
            positions = positions[load[positions]]
            positions = positions[
                latency.in_window(t_start[positions], t_end[positions], window.load_start, window.load_end)
            ]
            good = positions[ok[positions]]
            summary = latency.summary(latency.select(every, good), bins.get(key, {}), window.window_s, slo)
            if key not in bins:
                summary.update({f"{stat}_itl_ms": None for stat in STATS})
            row.update(summary, failed=len(positions) - len(good))
        rows.append(row)
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return table.astype({c: "float64" for c in COLUMNS if c not in PHASE_KEYS})


def phase_metrics(table: pd.DataFrame) -> pd.DataFrame:
    """The percentiles of each latency (``metric_names.latency``, in ms) and the goodput
    (in %, where the run has an SLO) of each phase, in the long format of
    ``metrics.phase_metrics``."""
    parts = [
        long(table, f"{latency.stat_word(p)}_{name}_ms", names.latency(p, name), "ms")
        for name in latency.LATENCIES
        for p in latency.PERCENTILES
    ]
    parts.append(long(table, "goodput_pct", names.GOODPUT, "%"))
    values = pd.concat([no_metrics(), *parts], ignore_index=True)
    return values.dropna(subset=["value"]).reset_index(drop=True)
