"""Latency as ``vllm bench serve`` defines it, per request and per phase: the one owner of
TTFT, TPOT, ITL, E2EL and goodput (docs/design.md, "Latency as the field measures it").

Per request, from the streamed chunks' arrival times (``stream.StreamReader``):

- TTFT: the first token chunk's arrival − the request's start;
- E2EL: the last token chunk's arrival − the start (the bench stops its clock at the last
  token, not at ``[DONE]``), i.e. TTFT + ``token_span_s``;
- TPOT: (E2EL − TTFT) / (output tokens − 1), for requests of more than one token;
- ITL: every gap between two token chunks.

A week's gaps do not fit in memory as floats: each request keeps them as a sketch's bins
(``load/sketch.py``, DDSketch), which pool exactly. The mean ITL is exact: a request's gaps
sum to its token span.

Pure: the locustfile, the load runner and the analysis all read their figures here."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from thermab import metric_names as names
from thermab.load.sketch import RELATIVE_ACCURACY, merged, quantile_s

PERCENTILES = names.LATENCY_PERCENTILES  # besides the mean; the bench's median is p50
LATENCIES = tuple(names.LATENCY_NAMES)
SLO_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}  # load.slo → the latency it bounds


def in_window(t_start, t_end, start: float, end: float) -> np.ndarray:
    """Whether each request belongs to the window ``[start, end)``: it ended inside it (one
    without an end: it started inside it), the rule of every per-phase figure."""
    t_start, t_end = (np.asarray(t, dtype="float64") for t in (t_start, t_end))
    t = np.where(np.isnan(t_end), t_start, t_end)
    return (t >= start) & (t < end)


def request_latencies(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per request, as arrays: TTFT, TPOT and E2EL in seconds, the output tokens and the
    token span (NaN where not measurable: no first token, no token span recorded, TPOT of
    a one-token reply). ``select`` takes rows of them."""
    t_start = requests["t_start"].to_numpy("float64", na_value=np.nan)
    ttft = requests["t_first_token"].to_numpy("float64", na_value=np.nan) - t_start
    span = (
        requests["token_span_s"].to_numpy("float64", na_value=np.nan)
        if "token_span_s" in requests
        else np.full(len(requests), np.nan)
    )
    tokens = requests["completion_tokens"].to_numpy("float64", na_value=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(tokens > 1, span / (tokens - 1), np.nan)
    return {"ttft": ttft, "tpot": tpot, "e2el": ttft + span, "tokens": tokens, "span": span}


def select(latencies: dict[str, np.ndarray], rows) -> dict[str, np.ndarray]:
    """The latencies of ``rows`` (positions or a mask)."""
    return {name: values[rows] for name, values in latencies.items()}


def good(latencies: dict[str, np.ndarray], slo: Mapping[str, float]) -> np.ndarray:
    """Whether each request meets every declared SLO (``load.slo``: ttft_ms, tpot_ms,
    e2el_ms), as ``vllm bench serve --goodput`` judges it: at or under each bound, a
    one-token reply's TPOT counted as 0, an unmeasured latency as missed."""
    meets = np.ones(len(latencies["tokens"]), dtype=bool)
    for key, latency in SLO_KEYS.items():
        if slo.get(key) is None:
            continue
        values = latencies[latency]
        if latency == "tpot":
            values = np.where(latencies["tokens"] <= 1, 0.0, values)
        meets &= values * 1000 <= slo[key]
    return meets


def _stats_ms(values: np.ndarray, name: str) -> dict:
    values = values[~np.isnan(values)]
    found = np.percentile(values, PERCENTILES) * 1000 if len(values) else [None] * len(PERCENTILES)
    stats = {f"mean_{name}_ms": float(np.mean(values)) * 1000 if len(values) else None}
    stats.update({f"{stat_word(p)}_{name}_ms": _ms(v) for p, v in zip(PERCENTILES, found, strict=True)})
    return stats


def _ms(value) -> float | None:
    return None if value is None else float(value)


def stat_word(p: int) -> str:
    """The bench's word for a percentile in its keys: median for 50, else pNN."""
    return "median" if p == 50 else f"p{p}"


def _itl_ms(bins: dict[int, int], span_s: float) -> dict:
    n = sum(bins.values())
    stats = {"mean_itl_ms": span_s / n * 1000 if n else None}
    for p in PERCENTILES:
        stats[f"{stat_word(p)}_itl_ms"] = quantile_s(bins, p / 100) * 1000 if n else None
    return stats


def summary(
    latencies: dict[str, np.ndarray], bins: dict[int, int], window_s: float, slo: Mapping[str, float] | None = None
) -> dict:
    """``vllm bench serve``'s result keys of the ok requests of one kind in one window (their
    ``request_latencies``): ``completed``, ``total_output_tokens``, ``mean_``/``median_``/
    ``p90_``/``p99_`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms`` and ``e2el_ms``, with ``bins``
    their gaps' sketch; with an SLO also ``request_goodput`` (good requests/s),
    ``goodput_pct`` and ``goodput_tok_s`` (their share and their output tokens/s). Values in
    ms; None where nothing was measured (JSON has no NaN)."""
    result = {"completed": len(latencies["tokens"]), "total_output_tokens": int(np.nansum(latencies["tokens"]))}
    for name in ("ttft", "tpot"):
        result.update(_stats_ms(latencies[name], name))
    result.update(_itl_ms(bins, float(np.nansum(latencies["span"]))))
    result.update(_stats_ms(latencies["e2el"], "e2el"))
    if slo:
        result.update(goodput(latencies, slo, window_s))
    return result


def goodput(latencies: dict[str, np.ndarray], slo: Mapping[str, float], window_s: float) -> dict:
    """The good requests per second, their share in % and their output tokens per second."""
    meets = good(latencies, slo)
    seconds = window_s if window_s and window_s > 0 else math.nan
    return {
        "request_goodput": _finite(meets.sum() / seconds),
        "goodput_pct": _finite(100.0 * meets.mean()) if len(meets) else None,
        "goodput_tok_s": _finite(float(np.nansum(latencies["tokens"][meets])) / seconds),
    }


def _finite(value) -> float | None:
    return float(value) if math.isfinite(value) else None


RECORD_TIMES = ["t_start", "t_first_token", "t_end", "token_span_s", "completion_tokens"]


def window_report(records: list[dict], start: float, end: float, slo: dict | None = None) -> dict:
    """A phase's ``latency.json`` from the locustfile's raw records (they alone carry each
    request's ITL sketch): ``summary`` of the ok load requests of ``[start, end)`` with
    ``failed`` (the load's failed requests there), ``duration`` (the window's s), the SLO
    and the sketch's relative accuracy and bins (``itl_keys``, ``itl_counts``: what pools
    with other phases), and the same of the probes under ``probes``."""
    frame = pd.DataFrame.from_records(records, columns=[*RECORD_TIMES, "kind", "ok", "itl_keys", "itl_counts"])
    frame[RECORD_TIMES] = frame[RECORD_TIMES].astype("float64")
    window_s = end - start
    inside = in_window(frame["t_start"], frame["t_end"], start, end)
    ok = frame["ok"].fillna(False).astype(bool).to_numpy()

    def of(kind, slo=None):
        chosen = frame[inside & ok & (frame["kind"] == kind).to_numpy()]
        bins = merged(zip(chosen["itl_keys"].dropna(), chosen["itl_counts"].dropna(), strict=True))
        report = summary(request_latencies(chosen), bins, window_s, slo)
        return {**report, "itl_keys": list(bins), "itl_counts": list(bins.values())}

    failed = int((inside & ~ok & (frame["kind"] == "load").to_numpy()).sum())
    return {
        "duration": _finite(window_s),
        "failed": failed,
        "slo": slo,
        "relative_accuracy": RELATIVE_ACCURACY,
        **of("load", slo),
        "probes": of("probe"),
    }
