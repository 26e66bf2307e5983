"""The completeness table: samples expected, got and the largest gap per host and source."""

import math

import numpy as np
import pandas as pd
import pytest

from thermab.analysis.completeness import completeness, measured_intervals
from thermab.report.summary import _sampling, completeness_section
from thermab.telemetry import ingest

WINDOWS = pd.DataFrame(
    {
        "order": ["AB", "AB"],
        "rep": [1, 1],
        "arm": ["A", "B"],
        "load_start": [100.0, 300.0],
        "load_end": [160.0, 360.0],
        "window_s": [60.0, 60.0],
    }
)


def series(host, kind, sensor, times):
    return pd.DataFrame(
        {"t": np.asarray(times, dtype=float), "host": host, "kind": kind, "sensor": sensor, "value": 50.0}
    )


def telemetry():
    every_second = np.arange(0, 400, 1.0)
    silent_tsoc = every_second[(every_second < 120) | (every_second >= 150)]  # 30 s hole in window A
    return pd.concat(
        [
            series("head", "thermal", "TSOC", silent_tsoc),
            series("head", "thermal", "TS0P", every_second),
            series("head", "cpu", "vllm_cpu_pct", np.arange(0, 400, 2.0)),
            series("head", "cpu", "thread x 1 cpu0", [101.0]),  # threads come and go: not counted
            series("worker", "cpu", "vllm_cpu_pct", np.arange(0, 400, 2.0)),
        ],
        ignore_index=True,
    )


def test_expected_got_and_largest_gap():
    table = completeness(telemetry(), WINDOWS, ["head", "worker"], {"thermal": 1, "cpu": 2}).set_index(
        ["host", "source"]
    )
    assert table.loc[("head", "thermal"), "expected"] == 120
    assert table.loc[("head", "thermal"), "got"] == pytest.approx((60 - 30 + 60 + 60 + 60) / 2), "median of sensors"
    assert table.loc[("head", "thermal"), "largest_gap_s"] == pytest.approx(31.0), "the silent zone's hole"
    assert table.loc[("head", "cpu"), "expected"] == 60 and table.loc[("head", "cpu"), "got"] == 60
    assert table.loc[("head", "cpu"), "largest_gap_s"] == pytest.approx(2.0)
    assert table.loc[("worker", "thermal"), "got"] == 0, "a host expected to report zones that sent none"
    assert table.loc[("worker", "thermal"), "largest_gap_s"] == 60.0


def test_a_host_without_zones_is_not_expected_to_send_them_and_intervals_are_inferred():
    table = completeness(telemetry(), WINDOWS, ["head", "worker"], None, ["worker"])
    assert ("worker", "thermal") not in set(zip(table["host"], table["source"], strict=False))
    head_cpu = table[(table["host"] == "head") & (table["source"] == "cpu")].iloc[0]
    assert head_cpu["interval_s"] == 2.0 and head_cpu["expected"] == 60


def test_the_summary_section_flags_holes():
    text = completeness_section(completeness(telemetry(), WINDOWS, ["head", "worker"], {"thermal": 1, "cpu": 2}))
    assert "| worker | thermal | 1.0 s | 120 | 0 | 60.0 s | no samples |" in text
    assert "| head | thermal | 1.0 s | 120 | 105 | 31.0 s | gap of 31 intervals |" in text


def test_no_windows_no_expectations():
    table = completeness(telemetry(), WINDOWS.iloc[:0], ["head"], {"thermal": 1})
    assert (table["expected"] == 0).all() and table["largest_gap_s"].map(math.isnan).all()


def test_intervals_as_measured_with_their_precision():
    """Zones every 0.5 s read "0.5 s", not "0 s"; the CPU source is its sum, sampled every
    second, not the median over the busiest threads' series, which come and go."""
    half = np.arange(0, 100, 0.5)
    threads = [
        series("head", "cpu", f"thread vllm {tid} cpu0", [10.0 * tid, 10.0 * tid + 2, 10.0 * tid + 4])
        for tid in range(1, 9)
    ]
    frame = pd.concat(
        [
            series("head", "thermal", "TSOC", half),
            series("head", "thermal", "TS0P", half),
            series("head", "cpu", "vllm_cpu_pct", np.arange(0, 100, 1.0)),
            *threads,
        ],
        ignore_index=True,
    )
    intervals = measured_intervals(frame, "head")
    assert intervals == {"thermal": 0.5, "cpu": 1.0}
    assert _sampling(intervals, "thermal") == "sampled every 0.5 s (median)"
    assert _sampling(intervals, "cpu") == "sampled every 1 s (median)"
    assert _sampling({"power": 0.25}, "power") == "sampled every 0.25 s (median)"
    assert _sampling(intervals, "gpu") == "not sampled in this run"


def agent_files(host_dir, end_s=400.0):
    """An agent's files as a host writes them: zones every 0.5 s, hwmon temperatures every
    15 s, RAPL counters every 5 s and hwmon power every second (the schema's defaults)."""
    host_dir.mkdir(parents=True)
    files = {
        "thermal": (0.5, "TSOC"),
        "hwmon": (15.0, "nct6775@isa/SYSTIN"),
        "rapl": (5.0, "package-0 uJ:max=262143328850"),
        "hwmon_power": (1.0, "acpi_power@0/power1 W"),
    }
    for stem, (interval, sensor) in files.items():
        lines = ["t,sensor,value,reason"]
        for step, t in enumerate(np.arange(0.0, end_s, interval)):
            value = step * interval * 50e6 if stem == "rapl" else 50.0  # 50 W, as a µJ counter for RAPL
            lines.append(f"{t:.3f},{sensor},{value},")
        (host_dir / f"{stem}.csv").write_text("\n".join(lines) + "\n")
    return {stem: interval for stem, (interval, _sensor) in files.items()}


def test_each_source_of_a_kind_is_judged_at_its_own_interval(tmp_path):
    """RAPL (5 s) and hwmon power (1 s) are both kind power, zones (0.5 s) and hwmon
    temperatures (15 s) both thermal: each is its own row at its own interval, with no gap
    that is not one; and the summary prints the zones' interval, not the pooled one."""
    intervals = agent_files(tmp_path / "monitor" / "head")
    sources = {}
    frame, dropped = ingest.telemetry(tmp_path / "monitor", {"head": 0.0}, sources)
    assert dropped == {}
    assert sources["head"] == {
        "power": {"package-0": "rapl", "acpi_power@0/power1": "hwmon_power"},
        "thermal": {"TSOC": "thermal", "nct6775@isa/SYSTIN": "hwmon"},
    }
    table = completeness(frame, WINDOWS, ["head"], {**intervals, "cpu": 1}, sources=sources).set_index("source")
    assert set(table.index) == {"thermal", "hwmon", "rapl", "hwmon_power", "cpu"}
    for source, interval in intervals.items():
        row = table.loc[source]
        assert row["interval_s"] == interval and row["expected"] == 2 * math.floor(60 / interval)
        assert row["got"] >= row["expected"] - 2 and row["largest_gap_s"] <= interval + 1e-9, source
    notes = completeness_section(completeness(frame, WINDOWS, ["head"], {**intervals, "cpu": 1}, sources=sources))
    assert "gap of" not in notes
    assert measured_intervals(frame, "head", sources) == intervals
    pooled = measured_intervals(frame, "head")  # a run ingested before sources were kept: one per kind
    assert set(pooled) == {"thermal", "power"}


def scrapes(phase_dir, times, first_tokens):
    """The server.csv a phase's scraper writes: at each time, the gauges, the token counters
    and the TTFT histogram's sum and count (``first_tokens`` of them so far)."""
    phase_dir.mkdir(parents=True)
    lines = ["t,sensor,value,reason"]
    for t, n in zip(times, first_tokens, strict=True):
        for name, value in (
            ("vllm:num_requests_running", 4),
            ("vllm:num_requests_waiting", 0),
            ("vllm:generation_tokens_total", 40 * t),
            ("vllm:prompt_tokens_total", 10 * t),
            ("vllm:time_to_first_token_seconds_sum", 0.05 * n),
            ("vllm:time_to_first_token_seconds_count", n),
        ):
            lines.append(f"{t:.3f},{name},{value},")
    (phase_dir / "server.csv").write_text("\n".join(lines) + "\n")


def test_a_server_hole_is_a_missed_scrape_not_an_interval_without_a_first_token(tmp_path):
    """Scraped every second; in window A no request reached its first token for 7 s (the
    TTFT mean has no value there, rightly), in window B the scrapes stopped for 10 s: only B
    is a hole."""
    times = np.array([t for t in np.arange(0.0, 400.0, 1.0) if not 320 <= t < 330])
    first_tokens = np.cumsum([0 if 120 <= t < 127 else 1 for t in times])
    scrapes(tmp_path / "phase", times, first_tokens)
    frame, dropped = ingest.server_telemetry([tmp_path / "phase"], "head")
    assert dropped == {}
    ttft, running = (frame[frame["sensor"] == sensor]["t"] for sensor in ("ttft_mean_s", "running"))
    assert not ((ttft > 119) & (ttft < 126)).any() and len(ttft) == len(running) - 1 - 7, "no first token, no mean"
    a, b = (completeness(frame, WINDOWS.iloc[[i]], ["head"], {"server": 1}).set_index("source") for i in (0, 1))
    assert a.loc["server", "largest_gap_s"] == pytest.approx(1.0) and a.loc["server", "got"] == 60
    assert b.loc["server", "largest_gap_s"] == pytest.approx(11.0) and b.loc["server", "got"] == 50
    text = completeness_section(completeness(frame, WINDOWS, ["head"], {"server": 1}))
    assert "| head | server | 1.0 s | 120 | 110 | 11.0 s | gap of 11 intervals |" in text
