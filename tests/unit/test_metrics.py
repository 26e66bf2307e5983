"""Per-phase metrics on small hand-made frames whose answers can be checked by eye."""

import logging
import math

import numpy as np
import pandas as pd
import pytest

from thermab import metric_names as names
from thermab.analysis import metrics


def events(*rows):
    return pd.DataFrame([dict(zip(("t", "event", "order", "rep", "arm"), row, strict=False)) for row in rows])


def window(start=1000.0, end=2800.0, order="AB", rep=1, arm="A"):
    return pd.DataFrame([(order, rep, arm, start, end, end - start)], columns=metrics.WINDOW_COLUMNS)


def thermal(times, values, host="head", sensor="TSOC", kind="thermal"):
    return pd.DataFrame({"t": times, "host": host, "kind": kind, "sensor": sensor, "value": values})


def test_window_is_last_load_start_and_first_load_end_after_it():
    ev = events(
        (100, "load_start", "AB", 1, "A"),
        (150, "abort", "AB", 1, "A"),
        (400, "load_start", "AB", 1, "A"),
        (700, "load_end", "AB", 1, "A"),
        (900, "load_end", "AB", 1, "A"),
        (1000, "load_start", "AB", 1, "B"),
        (1300, "load_end", "AB", 1, "B"),
    )
    windows = metrics.load_windows(ev)
    assert windows[["arm", "load_start", "load_end", "window_s"]].values.tolist() == [
        ["A", 400, 700, 300],
        ["B", 1000, 1300, 300],
    ]


def test_phase_without_load_end_is_skipped_with_a_warning(caplog):
    ev = events(
        (100, "load_start", "AB", 1, "A"),
        (400, "load_end", "AB", 1, "A"),
        (500, "load_start", "AB", 1, "B"),
        (450, "load_end", "AB", 1, "B"),
    )
    with caplog.at_level(logging.WARNING, logger="thermab.analysis.metrics"):
        windows = metrics.load_windows(ev)
    assert windows["arm"].tolist() == ["A"]
    assert "rep1-B" in caplog.text and "no load_end" in caplog.text


def test_no_events_give_no_windows():
    assert metrics.load_windows(pd.DataFrame()).columns.tolist() == metrics.WINDOW_COLUMNS


def test_window_is_half_open():
    tel = thermal([990, 1000, 1500, 2800], [99, 80, 82, 99])
    zones = metrics.zone_stats(tel, window())
    assert zones[["mean_c", "max_c", "n"]].values.tolist() == [[81.0, 82.0, 2]]


def test_time_to_threshold_first_sample_and_count():
    tel = thermal([1000, 1015, 1030, 1045, 1060], [80, 86, 84, 91, 85])
    th = metrics.time_to_threshold(tel, window(), [85, 90, 95])
    assert th.columns.tolist() == metrics.THRESHOLD_COLUMNS
    rows = th.set_index("threshold_c")
    assert rows.loc[85.0, "reached_s"] == 15 and rows.loc[85.0, "samples_at_or_above"] == 3
    assert rows.loc[90.0, "reached_s"] == 45 and rows.loc[90.0, "samples_at_or_above"] == 1
    assert math.isnan(rows.loc[95.0, "reached_s"]) and rows.loc[95.0, "samples_at_or_above"] == 0


def test_time_to_threshold_ignores_samples_outside_the_window():
    tel = thermal([990, 1000, 2800], [95, 80, 96])
    th = metrics.time_to_threshold(tel, window(), [90])
    assert math.isnan(th["reached_s"].iloc[0]) and th["samples_at_or_above"].iloc[0] == 0


def test_cpu_median_and_percentiles():
    values = np.arange(101, dtype=float)  # 0..100: median 50, p5 5, p95 95
    tel = thermal(1000 + 6 * np.arange(101), values, sensor="vllm_cpu_pct", kind="cpu")
    other = thermal([1000], [999.0], sensor="cpu5", kind="freq")
    cpu = metrics.cpu_stats(pd.concat([tel, other]), window(end=1000 + 6 * 101))
    assert cpu.columns.tolist() == metrics.CPU_COLUMNS
    assert cpu[["median_pct", "p5_pct", "p95_pct", "n"]].values.tolist() == [[50.0, 5.0, 95.0, 101]]


def requests_frame(n_load=386, start=1000.0, window_s=1800.0):
    t_end = start + (np.arange(n_load) + 0.5) * window_s / n_load
    load = pd.DataFrame(
        {
            "kind": "load",
            "t_start": t_end - 20,
            "t_first_token": t_end - 19,
            "t_end": t_end,
            "completion_tokens": 400,
            "ok": True,
            "error": "",
            "stall_gaps": 0,
            "max_gap_s": 0.2,
        }
    )
    # probes decode 256 tokens: 255 tokens after the first in 255/18, 255/17, 255/20 s
    decode_s = np.array([255 / 18, 255 / 17, 255 / 20])
    probes = pd.DataFrame(
        {
            "kind": "probe",
            "t_start": [2000.0] * 3,
            "t_first_token": [2001.0] * 3,
            "t_end": 2001 + decode_s,
            "completion_tokens": 256,
            "ok": True,
            "error": "",
            "stall_gaps": [0, 2, 0],
            "max_gap_s": [0.1, 1.4, 0.1],
            "token_arrivals": 256,
            "token_span_s": decode_s,
        }
    )
    frame = pd.concat([load, probes], ignore_index=True)
    frame = frame.assign(order="AB", rep=1, arm="A", user=0, tag="t", prompt_tokens=1400, cached_tokens=0)
    # the nullable dtypes the load generator writes
    return frame.astype(
        {
            "order": "string",
            "arm": "string",
            "kind": "string",
            "completion_tokens": "Int64",
            "prompt_tokens": "Int64",
            "cached_tokens": "Int64",
            "error": "string",
        }
    )


def test_throughput_as_in_the_study():
    perf = metrics.performance(requests_frame(), window())
    assert perf.columns.tolist() == metrics.PERFORMANCE_COLUMNS
    row = perf.iloc[0]
    assert row["requests_completed"] == 386 and row["output_tokens"] == 386 * 400
    assert row["output_tok_s"] == pytest.approx(85.8, abs=0.05)
    assert row["probe_tok_s_median"] == pytest.approx(18.0) and row["probe_n"] == 3 and row["probe_ok"] == 3
    assert row["probe_arrivals_min"] == row["probe_arrivals_max"] == 256
    assert row["stall_gaps"] == 2 and row["max_gap_s"] == 1.4 and row["errors"] == 0


def test_the_in_window_throughput_has_its_batch_means_standard_error():
    """Requests of 1 s each, one a second: 10 tokens each, a steady rate; then the same
    with 20 tokens each in the window's first half, whose parts' rates are 20, 20, 20, 10,
    10, 10 tok/s: sd 5.48, over √6."""
    starts = np.arange(0.0, 60.0)
    for tokens, expected in ((10, 0.0), (np.where(starts < 30, 20, 10), 5 * math.sqrt(6 / 5) / math.sqrt(6))):
        phase = pd.DataFrame(
            {"kind": "load", "t_start": starts, "t_first_token": starts, "t_end": starts + 1, "ok": True}
        ).assign(completion_tokens=tokens)
        window = metrics.LoadWindow("AB", 1, "A", load_start=0.0, load_end=60.0, window_s=60.0)
        assert metrics.in_window_se(phase, window) == pytest.approx(expected, abs=1e-9)


def test_requests_outside_the_window_other_phases_and_failures_are_not_counted():
    extra = requests_frame(n_load=3).iloc[:3].copy()
    aborted = extra.assign(t_end=[500.0, 600.0, 700.0])  # same phase, earlier aborted attempt
    other_arm = extra.assign(arm="B")
    failed = extra.assign(ok=False, error="timeout", t_end=[np.nan, np.nan, 3000.0])
    perf = metrics.performance(pd.concat([requests_frame(), aborted, other_arm, failed]), window())
    row = perf.iloc[0]
    assert row["requests_completed"] == 386
    assert row["errors"] == 2  # the third failure ended after the window


def test_probe_decode_speed_excludes_the_first_token():
    probes = pd.DataFrame(
        {
            "t_first_token": [0.0, 0.0, 0.0, 0.0],
            "t_end": [10.0, 0.0, 5.0, 5.0],
            "completion_tokens": pd.array([201, 50, 1, None], dtype="Int64"),
            "token_arrivals": pd.array([201, 50, 1, 20], dtype="Int64"),
            "token_span_s": [10.0, 0.0, 0.0, 5.0],
        }
    )
    speed = metrics.probe_decode_speed(probes)
    assert speed.iloc[0] == 20.0 and speed.iloc[1:].isna().all()


def test_probe_decode_speed_only_where_the_arrivals_measured_it():
    """Eight arrivals spanning 80 % of t_end − t_first_token is the least that gives a rate;
    tokens in two bursts, a span that leaves most of the decode time unexplained, or no
    arrival columns at all (an older run) give none."""
    probes = pd.DataFrame(
        {
            "t_first_token": 0.0,
            "t_end": [10.0, 10.0, 10.0, 0.002, 10.0],
            "completion_tokens": pd.array([201] * 5, dtype="Int64"),
            "token_arrivals": pd.array([8, 7, 100, 2, None], dtype="Int64"),
            "token_span_s": [8.0, 9.9, 7.9, 0.001, 10.0],
        }
    )
    speed = metrics.probe_decode_speed(probes)
    assert speed.iloc[0] == 20.0 and speed.iloc[1:].isna().all()
    assert metrics.probe_decode_speed(probes.drop(columns=["token_arrivals", "token_span_s"])).isna().all()


def test_bursty_probes_have_no_speed_but_say_how_they_arrived():
    frame = requests_frame().copy()
    probes = frame["kind"] == "probe"
    frame.loc[probes, "t_end"] = 2001.003
    frame.loc[probes, "token_arrivals"] = [1, 2, 2]
    row = metrics.performance(frame, window()).iloc[0]
    assert math.isnan(row["probe_tok_s_median"]) and row["probe_n"] == 0 and row["probe_ok"] == 3
    assert (row["probe_arrivals_min"], row["probe_arrivals_max"]) == (1, 2)


def with_chunks(frame, chunks, usage_source="usage"):
    """``frame`` with its probes' token chunks (in the probes' order) and usage source."""
    probes = frame["kind"] == "probe"
    frame = frame.assign(token_chunks=pd.array([pd.NA] * len(frame), dtype="Int64"), usage_source=usage_source)
    frame.loc[probes, "token_chunks"] = chunks
    return frame.astype({"usage_source": "string"})


# 255 tokens after the first in 170, 102 and 85 steps: 1.5, 2.5 and 3.0 tokens a step, for the
# probes of decode speed 18, 17 and 20 tok/s
CHUNKS = [171, 103, 86]


def probe_row(frame):
    return metrics.performance(frame, window()).iloc[0]


def test_the_probes_tokens_per_step_are_the_median_probe_s_own():
    """The probe of the median speed (18 tok/s) made 1.5 tokens a step: its value, not the
    median of the three values (2.5), which is another probe's."""
    row = probe_row(with_chunks(requests_frame(), CHUNKS))
    assert row["probe_tok_s_median"] == pytest.approx(18.0)
    assert row["probe_tokens_per_step"] == pytest.approx(1.5)


def test_for_an_even_count_the_two_middle_probes_by_speed_are_averaged():
    """The fastest probe's tokens came in two bursts: no speed, so it is none of the middle
    ones; the two measured (17 and 18 tok/s) are the middle, their 2.5 and 1.5 averaged."""
    frame = with_chunks(requests_frame(), CHUNKS)
    fastest = frame.index[frame["kind"] == "probe"][2]
    frame.loc[fastest, "token_arrivals"] = 2
    row = probe_row(frame)
    assert row["probe_n"] == 2 and row["probe_tok_s_median"] == pytest.approx(17.5)
    assert row["probe_tokens_per_step"] == pytest.approx(2.0)


def test_without_counted_chunks_or_with_tokens_counted_as_chunks_there_is_none():
    assert math.isnan(probe_row(requests_frame())["probe_tokens_per_step"])  # recorded before token_chunks
    assert math.isnan(probe_row(with_chunks(requests_frame(), [1, 103, 86]))["probe_tokens_per_step"])
    assert math.isnan(probe_row(with_chunks(requests_frame(), [pd.NA, 103, 86]))["probe_tokens_per_step"])
    # a server without usage: completion_tokens is the chunk count, the ratio 1 whatever was drafted
    chunked = with_chunks(requests_frame(), [256, 256, 256], usage_source="chunks")
    assert math.isnan(probe_row(chunked)["probe_tokens_per_step"])
    # a probe without a value beside the median one leaves the median's value alone
    assert probe_row(with_chunks(requests_frame(), [171, 1, pd.NA]))["probe_tokens_per_step"] == pytest.approx(1.5)


def test_the_probes_tokens_per_step_are_a_per_phase_metric_of_their_own():
    perf = metrics.performance(with_chunks(requests_frame(), CHUNKS), window())
    empty = pd.DataFrame(columns=metrics.ZONE_COLUMNS)
    long = metrics.phase_metrics(empty, pd.DataFrame(columns=metrics.CPU_COLUMNS), perf, [], "TSOC")
    row = long.set_index("metric").loc[names.PROBE_ACCEPTANCE_LENGTH]
    assert (row["unit"], row["value"]) == ("tokens/step", pytest.approx(1.5))
    without = metrics.performance(requests_frame(), window())
    long = metrics.phase_metrics(empty, pd.DataFrame(columns=metrics.CPU_COLUMNS), without, [], "TSOC")
    assert names.PROBE_ACCEPTANCE_LENGTH not in set(long["metric"])  # not measured: no row, never a zero


@pytest.mark.parametrize("requests", [None, pd.DataFrame()])
def test_performance_without_requests_is_nan_not_zero(requests):
    perf = metrics.performance(requests, window())
    assert perf["window_s"].tolist() == [1800.0]
    assert perf[["requests_completed", "output_tok_s", "probe_tok_s_median"]].isna().all().all()


def test_phase_metrics_long_format():
    zones = pd.DataFrame(
        [
            ("AB", 1, "A", "head", "TSOC", 89.6, 95.0, 60),
            ("AB", 1, "A", "worker", "TSOC", 77.2, 80.0, 60),
            ("AB", 1, "A", "head", "TS0P", 69.0, 75.0, 60),
        ],
        columns=metrics.ZONE_COLUMNS,
    )
    cpu = pd.DataFrame([("AB", 1, "A", "head", 398.0, 390.0, 402.0, 300)], columns=metrics.CPU_COLUMNS)
    perf = metrics.performance(None, window())
    long = metrics.phase_metrics(zones, cpu, perf, ["head", "worker"], "TSOC")
    assert long.columns.tolist() == metrics.PHASE_METRIC_COLUMNS
    assert dict(zip(long["metric"], long["value"], strict=False)) == {
        "head TSOC mean": 89.6,
        "head vLLM CPU median": 398.0,
        "worker TSOC mean": 77.2,
    }
