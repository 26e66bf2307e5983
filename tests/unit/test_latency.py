"""Latency as vllm bench serve defines it (load/latency.py): per request, per window, the
ITL sketch's accuracy and exact pooling, goodput against an SLO."""

import copy
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from support.paths import REPO as ROOT
from thermab import metric_names as names
from thermab.analysis import latency_table as analysis_latency
from thermab.config import ConfigError, known_metric, validate
from thermab.errors import UserError
from thermab.load import latency, sketch
from thermab.load.stream import StreamReader

RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def streamed(times, start=100.0, tokens=None):
    """One request's record, its token chunks arriving at ``start + t`` for each t of ``times``."""
    reader = StreamReader(stall_gap_s=1.0)
    reader.t_start = start
    content = json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]})
    for t in times:
        reader.line(f"data: {content}\n".encode(), start + t)
    if tokens is not None:
        usage = json.dumps({"choices": [], "usage": {"completion_tokens": tokens, "prompt_tokens": 3}})
        reader.line(f"data: {usage}\n".encode(), start + times[-1] + 0.5)
    reader.line(b"data: [DONE]\n", start + times[-1] + 0.5)
    reader.t_end = start + times[-1] + 0.5  # after [DONE]: E2EL stops at the last token, not here
    return reader.record("load", 1, "tag")


def test_a_request_s_latencies_are_the_bench_s():
    record = streamed([0.2, 0.25, 0.35, 0.45], tokens=4)
    frame = pd.DataFrame([record])
    got = {name: values[0] for name, values in latency.request_latencies(frame).items()}
    assert got["ttft"] == pytest.approx(0.2)
    assert got["e2el"] == pytest.approx(0.45)  # the last token chunk, not the stream's end
    assert got["tpot"] == pytest.approx((0.45 - 0.2) / 3)
    assert sum(record["itl_counts"]) == 3  # every gap between token chunks, in the sketch


def test_a_one_token_reply_has_no_tpot_and_counts_as_zero_for_goodput():
    frame = pd.DataFrame([streamed([0.2], tokens=1)])
    got = latency.request_latencies(frame)
    assert np.isnan(got["tpot"][0])
    assert latency.good(got, {"tpot_ms": 1}).tolist() == [True]


def test_itl_quantiles_are_within_the_sketch_s_accuracy_and_pool_exactly():
    rng = np.random.default_rng(3)
    gaps = rng.lognormal(np.log(0.03), 0.6, 5000)
    bins = [sketch.gap_key(g) for g in gaps]
    half = len(gaps) // 2
    first = sketch.merged([(bins[:half], [1] * half)])
    second = sketch.merged([(bins[half:], [1] * (len(gaps) - half))])
    pooled = sketch.merged([(list(first), list(first.values())), (list(second), list(second.values()))])
    assert pooled == sketch.merged([(bins, [1] * len(gaps))])  # phases pool exactly
    for q in (0.5, 0.9, 0.99):
        exact = np.quantile(gaps, q, method="lower")
        assert sketch.quantile_s(pooled, q) == pytest.approx(exact, rel=sketch.RELATIVE_ACCURACY)


def test_a_gap_below_the_clock_s_resolution_has_a_bin():
    assert sketch.gap_key(0.0) == sketch.gap_key(sketch.MIN_GAP_S)


def test_a_window_report_has_the_bench_s_keys_and_the_probes_apart():
    load = [streamed([0.1 * k, 0.1 * k + 0.05, 0.1 * k + 0.15], start=100 + k, tokens=3) for k in range(1, 6)]
    probe = {**streamed([0.5, 0.6], start=103, tokens=2), "kind": "probe"}
    late = streamed([0.1, 0.2], start=200, tokens=2)  # ends after the window: not counted
    failed = {**streamed([0.1], start=101, tokens=1), "ok": False, "error": "cut"}
    report = latency.window_report([*load, probe, late, failed], 100.0, 110.0, {"ttft_ms": 350})
    assert report["completed"] == 5 and report["failed"] == 1 and report["duration"] == 10.0
    for name in latency.LATENCIES:
        assert {f"{stat}_{name}_ms" for stat in ("mean", "median", "p90", "p99")} <= report.keys()
    ttfts = [100 * k for k in range(1, 6)]
    assert report["median_ttft_ms"] == pytest.approx(np.median(ttfts))
    assert report["p99_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99))
    assert report["mean_itl_ms"] == pytest.approx(75.0)  # gaps of 50 and 100 ms, exact
    assert report["p99_itl_ms"] == pytest.approx(100.0, rel=sketch.RELATIVE_ACCURACY)
    assert report["mean_tpot_ms"] == pytest.approx(75.0)
    assert report["goodput_pct"] == pytest.approx(60.0)  # TTFT 100, 200, 300 ms of 100…500 meet 350 ms
    assert report["request_goodput"] == pytest.approx(0.3)
    assert report["goodput_tok_s"] == pytest.approx(0.9)
    assert report["probes"]["completed"] == 1 and report["probes"]["median_ttft_ms"] == pytest.approx(500.0)
    assert "goodput_pct" not in report["probes"]
    json.dumps(report, allow_nan=False)  # the file's text: no NaN


def test_an_empty_window_reports_nothing_measured():
    report = latency.window_report([], 0.0, 10.0)
    assert report["completed"] == 0 and report["p99_itl_ms"] is None and report["median_ttft_ms"] is None
    json.dumps(report, allow_nan=False)


def phase_frame(arm, ttfts_s, start):
    """One phase's tidy requests: load requests of 3 tokens, 50 ms apart, with TTFT ``ttfts_s``."""
    rows = [
        {
            "order": "AB",
            "rep": 1,
            "arm": arm,
            "load_level": "4 users",
            "kind": "load",
            "ok": True,
            "t_start": start + k,
            "t_first_token": start + k + ttft,
            "t_end": start + k + ttft + 0.2,
            "token_span_s": 0.1,
            "completion_tokens": 3,
        }
        for k, ttft in enumerate(ttfts_s)
    ]
    return pd.DataFrame(rows)


def test_the_latency_table_and_its_metrics_name_units_and_goodput():
    requests = pd.concat([phase_frame("A", [0.1, 0.2, 0.3, 0.4], 0), phase_frame("B", [0.1, 0.1, 0.1, 0.5], 100)])
    windows = pd.DataFrame(
        {"order": ["AB", "AB"], "rep": [1, 1], "arm": ["A", "B"], "load_start": [0, 100], "load_end": [10, 110]}
    ).assign(window_s=10.0)
    key = sketch.gap_key(0.05)
    reports = {
        ("AB", 1, "A", 4, "4 users"): {"relative_accuracy": 0.01, "itl_keys": [key], "itl_counts": [8]},
        ("AB", 1, "A", 16, "16 users"): {"relative_accuracy": 0.01, "itl_keys": [key + 50], "itl_counts": [8]},
    }
    bins = analysis_latency.sketches(reports, requests)  # the level's report, not another level's
    table = analysis_latency.latency_table(requests, windows, bins, {"ttft_ms": 250}).set_index("arm")
    assert table.at["A", "completed"] == 4 and table.at["A", "median_ttft_ms"] == pytest.approx(250.0)
    assert table.at["A", "p99_itl_ms"] == pytest.approx(50.0, rel=0.01)
    assert np.isnan(table.at["B", "p99_itl_ms"])  # no sketch: not measured, not zero
    assert table.at["A", "goodput_pct"] == 50.0 and table.at["B", "goodput_pct"] == 75.0
    values = analysis_latency.phase_metrics(table.reset_index()).set_index(["arm", "metric"])
    assert values.at[("A", "p50 TTFT"), "unit"] == "ms" and values.at[("B", "goodput"), "unit"] == "%"
    assert values.at[("B", "p99 TTFT"), "value"] == pytest.approx(np.percentile([100, 100, 100, 500], 99))
    assert ("B", "p99 ITL") not in values.index
    with pytest.raises(UserError, match="latency.json's ITL sketch"):
        analysis_latency.sketches({("AB", 1, "A", 4, "4 users"): {"relative_accuracy": 0.02}}, requests)


def test_questions_may_name_latency_percentiles_and_goodput_with_an_slo():
    asked = [{"metric": "p99 ITL", "kind": "non_inferior", "better": "lower", "margin_pct": 10}]
    raw = {**copy.deepcopy(RAW), "questions": asked}
    validated = validate(raw, ROOT)
    assert known_metric(validated, "p50 TTFT") and not known_metric(validated, names.GOODPUT)
    with pytest.raises(ConfigError, match=r"questions.0.metric' \(goodput lower\): unknown metric"):
        validate({**raw, "questions": [{"metric": "goodput", "kind": "lower"}]}, ROOT)
    with_slo = copy.deepcopy(raw)
    with_slo["load"] = {**with_slo.get("load", {}), "slo": {"ttft_ms": 500, "tpot_ms": 50}}
    assert known_metric(validate(with_slo, ROOT), names.GOODPUT)
    with_slo["load"]["slo"] = {"ttft_ms": 0}
    with pytest.raises(ConfigError, match="load.slo.ttft_ms"):
        validate(with_slo, ROOT)


def test_the_latency_figure_draws_each_arm_and_says_where_nothing_was_measured(tmp_path):
    from support.synthetic_run import plan_view
    from thermab.report import plots

    config = plan_view(cluster="c", arms={"A": {"label": "stock", "value": "1"}, "B": {"label": "x", "value": "0"}})
    table = pd.DataFrame(
        [{"arm": arm, **{c: 10.0 + k for k, c in enumerate(analysis_latency.LATENCY_COLUMNS)}} for arm in "AB"]
    )
    colors = {"A": "#e66101", "B": "#5e3c99"}
    assert plots.latency_png(table, config, colors, tmp_path / "l.png").stat().st_size > 1000
    empty = pd.DataFrame(columns=["arm", *analysis_latency.LATENCY_COLUMNS])
    assert plots.latency_png(empty, config, colors, tmp_path / "none.png").stat().st_size > 1000


def test_the_load_command_takes_its_slo_as_the_config_key_would():
    import argparse

    from thermab.load.runner import _slo

    assert _slo("ttft_ms=500,tpot_ms=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    for bad, said in (("ttft_ms=0", "load.slo.ttft_ms"), ("itl_ms=5", "none of ttft_ms"), ("e2el_ms=nan", "decimal")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            _slo(bad)
