"""The closed-loop load: real Locust runs (a few seconds each) against misbehaving test
peers on 127.0.0.1, and the pure helpers of thermab.load.runner and thermab.load.prompts."""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from support.openai_test_servers import MisbehavingServer
from thermab import config
from thermab.analysis import metrics, wakeup
from thermab.contracts import REQUEST_COLUMNS
from thermab.jsonl import JsonlTail
from thermab.load import prompts, runner, validity
from thermab.load.stream import MAX_TOKEN_COUNT, StreamFailure, StreamReader

SPEC_FIELDS = {field.name for field in dataclasses.fields(runner.LoadSpec)}

MAX_TOKENS = 20
PROMPT_TOKENS = 200
# Warnings that how busy this machine is can raise on a run of a few seconds: users start tens
# of ms after load_start (spawn, model lookup), which alone can take the mean in flight below
# users − 0.05, and a client that falls behind reads a short probe's tokens in a few bursts.
# measured on the client's wall clock, which a loaded machine stalls too: an inter-token gap
# of a second there is the machine's, not the server's
BUSY_MACHINE_WARNINGS = ("mean in-flight", "probe decode speed not measurable", "inter-token gaps of at least")


def untimed(warnings):
    return [w for w in warnings if not any(kind in w for kind in BUSY_MACHINE_WARNINGS)]


def run(server, tmp_path, **overrides):
    """A short load with small requests; returns (report, frame, progress lines)."""
    lines = []
    options = dict(
        order="AB",
        rep=1,
        arm="A",
        users=3,
        duration_s=3,
        max_tokens=MAX_TOKENS,
        prompt_tokens=PROMPT_TOKENS,
        probe=False,
        stop_timeout_s=10,
        progress=lines.append,
    )
    options.update(overrides)
    if "probe_at" in options:
        options["probe_at_s"] = options.pop("probe_at")
    spec = runner.LoadSpec(**{name: options.pop(name) for name in list(options) if name in SPEC_FIELDS})
    report = runner.run_load(server.url, tmp_path / "requests.parquet", spec, **options)
    return report, pd.read_parquet(tmp_path / "requests.parquet"), lines


def test_normal_load_records_every_request_with_probe_and_unique_tags(tmp_path):
    with MisbehavingServer("normal", token_interval_s=0.01) as server:
        report, frame, lines = run(
            server,
            tmp_path,
            users=4,
            duration_s=4,
            probe=True,
            probe_at=1,
            probe_n=3,
            probe_tokens=10,
            progress_every_s=1,
            status_hint=lambda: "head TSOC 80.0 C",
        )
        prompts_seen = list(server.prompts)

    assert "locust" not in sys.modules  # Locust ran in its own process
    assert dict(frame.dtypes.astype(str)) == REQUEST_COLUMNS
    assert report == json.loads((tmp_path / "validity.json").read_text())
    assert (tmp_path / "requests.jsonl").exists() and (tmp_path / "locust.log").exists()
    latency = json.loads((tmp_path / "latency.json").read_text())  # vllm bench serve's keys beside the records
    assert 0 < latency["completed"] <= report["requests"]["load_ok"] and latency["failed"] == 0
    assert latency["probes"]["completed"] == 3 and 5 <= latency["median_itl_ms"] <= 50

    # Every request the server saw is a record, and every record is complete and from usage.
    assert len(frame) == len(prompts_seen)
    assert frame["ok"].all() and (frame["error"] == "").all()
    assert (frame["usage_source"] == "usage").all()
    assert frame["prompt_tokens"].notna().all() and (frame["cached_tokens"] == 0).all()
    assert (frame["t_start"] < frame["t_first_token"]).all() and (frame["t_first_token"] < frame["t_end"]).all()
    assert (frame["stall_gaps"] == 0).all() and (frame["max_gap_s"] < 1.0).all()
    # one token a chunk, read as they come: at most one arrival per token, spanning the decode
    assert frame["token_arrivals"].between(1, frame["completion_tokens"]).all()
    assert (frame["token_chunks"] == frame["completion_tokens"]).all()
    assert (frame["token_span_s"] <= frame["t_end"] - frame["t_first_token"]).all()

    loads, probes = frame[frame["kind"] == "load"], frame[frame["kind"] == "probe"]
    assert (loads["completion_tokens"] == MAX_TOKENS).all()
    assert sorted(loads["user"].unique()) == [1, 2, 3, 4]
    assert list(loads["order"].unique()) == ["AB"] and list(loads["rep"].unique()) == [1]

    # The probe: probe_n sequential requests of probe_tokens, beside the load.
    assert len(probes) == 3 and (probes["completion_tokens"] == 10).all() and (probes["user"] == 0).all()
    assert (probes["t_start"].to_numpy()[1:] >= probes["t_end"].to_numpy()[:-1]).all()
    events = [e["event"] for e in report["events"]]
    assert events == ["load_start", "probe_start", "probe_end", "load_end"]
    assert 0.5 < probes["t_start"].min() - report["window"]["start"] < 1.8  # probe_at, not 60 % of 4 s

    # Unique from the very start, so no prefix-cache block is ever shared.
    assert len({p[:64] for p in prompts_seen}) == len(prompts_seen)
    assert frame["tag"].is_unique
    assert {p[: p.index("]") + 1] for p in prompts_seen} == set(frame["tag"])

    # Requests in flight at the end finish and are recorded; none starts after it.
    end = report["window"]["end"]
    at_end = loads[(loads["t_start"] < end) & (loads["t_end"] >= end)]
    assert sorted(at_end["user"]) == [1, 2, 3, 4]
    assert (loads["t_start"] < end).all()
    assert report["requests"]["started_after_end"] == 0 and report["requests"]["ended_after_end"] == 4

    assert untimed(report["warnings"]) == []
    assert report["full_length"]["share_of_ok_load"] == 1
    assert report["concurrency"]["inflight_mean"] > 3.6
    assert report["prompt_tokens"]["median_over_target"] == pytest.approx(1, abs=0.05)
    assert report["throughput"]["output_tok_s"] > 0 and report["probe"]["ok"] == 3
    assert any("output tok/s" in line and "head TSOC 80.0 C" in line for line in lines)
    assert any(line.startswith("load AB rep1-A done: ") for line in lines)


def test_no_usage_falls_back_to_counting_chunks_and_says_so(tmp_path):
    with MisbehavingServer("no_usage") as server:
        report, frame, _ = run(server, tmp_path)
    assert frame["ok"].all()
    assert (frame["usage_source"] == "chunks").all()
    assert (frame["completion_tokens"] == MAX_TOKENS).all()  # one token a chunk here
    assert metrics.request_tokens_per_step(frame).isna().all(), "tokens counted as chunks say nothing of the steps"
    assert frame["prompt_tokens"].isna().all() and frame["cached_tokens"].isna().all()
    assert any("without usage" in w for w in report["warnings"])


def test_packed_chunks_are_counted_from_usage(tmp_path):
    with MisbehavingServer("packed", tokens_per_chunk=3) as server:
        report, frame, _ = run(server, tmp_path)
    assert frame["ok"].all() and (frame["usage_source"] == "usage").all()
    assert (frame["completion_tokens"] == MAX_TOKENS).all()  # 7 chunks carried the 20 tokens
    assert (frame["token_arrivals"] <= 7).all()  # arrivals are of chunks, not tokens
    assert (frame["token_chunks"] == 7).all()
    # after the first chunk's token, 19 tokens in 6 steps of 3 (the last step 1)
    assert metrics.request_tokens_per_step(frame).tolist() == pytest.approx([19 / 6] * len(frame))
    assert untimed(report["warnings"]) == []


@pytest.mark.parametrize(
    "behaviour, category",
    [
        ("drop", "connection dropped mid-stream"),
        ("truncated", "stream truncated"),
        ("http_error", "HTTP 500"),
    ],
)
def test_broken_streams_are_failed_records_with_a_clear_error(tmp_path, behaviour, category):
    with MisbehavingServer(behaviour) as server:
        report, frame, lines = run(server, tmp_path, users=2)
    assert len(frame) >= 2 and not frame["ok"].any()
    assert frame["error"].str.startswith(category).all()
    assert report["errors"]["by_category"] == {category: len(frame)}
    assert report["requests"]["load_ok"] == 0
    assert any("no load request succeeded" in w for w in report["warnings"])
    assert any(f"{category}: {len(frame)}" in w for w in report["warnings"])
    assert any(category in line for line in lines)
    if behaviour == "drop":  # the tokens that did arrive are counted, and flagged as such
        assert (frame["completion_tokens"] == MAX_TOKENS // 2).all()
        assert (frame["usage_source"] == "chunks").all()


def test_server_dying_mid_load_gives_error_records_not_a_hang(tmp_path):
    server = MisbehavingServer("normal", token_interval_s=0.01).start()
    killed_at = []

    def kill_once_loaded():  # relative to the load, not to Locust's start-up time
        deadline = time.monotonic() + 60  # Locust's start-up takes seconds on a busy machine
        while len(server.prompts) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()
        killed_at.append(time.time())

    threading.Thread(target=kill_once_loaded, daemon=True).start()
    began = time.monotonic()
    try:
        report, frame, _ = run(server, tmp_path, duration_s=4)
    finally:
        server.kill()
    # no hang: far below the 120 s a read would wait on a silent server (Locust's start-up on a
    # busy machine takes seconds of its own)
    assert time.monotonic() - began < 60
    categories = report["errors"]["by_category"]
    assert frame["ok"].any() and categories.get("request failed before a response", 0) > 0
    assert categories.get("connection dropped mid-stream", 0) > 0  # the streams open at the kill
    last_ok_end = report["window"]["start"] + report["errors"]["last_ok_end_s"]
    assert killed_at[0] - 0.5 < last_ok_end <= killed_at[0] + 0.01
    assert any("last successful load request ended" in w for w in report["warnings"])


def test_stream_open_when_stop_timeout_runs_out_is_recorded_as_stopped(tmp_path):
    with MisbehavingServer("normal", token_interval_s=0.2) as server:  # 20 tokens take 4 s
        report, frame, _ = run(server, tmp_path, users=2, duration_s=2, stop_timeout_s=1)
    assert len(frame) == 2 and not frame["ok"].any()
    assert frame["error"].str.startswith("stopped at --stop-timeout").all()
    assert (frame["t_end"] - report["window"]["end"]).between(0.5, 2).all()


def test_single_stream_mode(tmp_path):
    with MisbehavingServer("normal") as server:
        report, frame, _ = run(server, tmp_path, users=1, duration_s=2, probe=False)
    assert set(frame["kind"]) == {"load"} and set(frame["user"]) == {1}
    ordered = frame.sort_values("t_start")
    assert (ordered["t_start"].iloc[1:].to_numpy() >= ordered["t_end"].iloc[:-1].to_numpy()).all(), (
        "one stream: a request starts only after the previous one ended"
    )
    assert 0 < report["concurrency"]["inflight_mean"] <= 1.0
    assert untimed(report["warnings"]) == []


def most_in_flight(frame):
    steps = sorted([(t, 1) for t in frame["t_start"]] + [(t, -1) for t in frame["t_end"]], key=lambda s: (s[0], s[1]))
    level = most = 0
    for _, step in steps:
        level += step
        most = max(most, level)
    return most


def test_an_open_loop_sends_on_its_schedule_and_holds_arrivals_at_the_cap(tmp_path):
    """10 arrivals a second of requests taking ~0.4 s, at most 2 in flight: arrivals wait for
    a slot, the records say how long, and the report names the cap as what set the load."""
    with MisbehavingServer("normal", token_interval_s=0.02) as server:
        report, frame, _ = run(server, tmp_path, users=2, rate=10.0, duration_s=3)
    assert dict(frame.dtypes.astype(str)) == REQUEST_COLUMNS
    assert frame["load_level"].eq("10 req/s ≤2").all() and report["load_level"] == "10 req/s ≤2"  # its label
    assert frame["ok"].all() and set(frame["user"]) == {1} and frame["tag"].is_unique
    assert frame["t_due"].is_monotonic_increasing and (frame["t_start"] >= frame["t_due"]).all()
    assert most_in_flight(frame) <= 2
    waited = frame[frame["slot_wait_s"] > 0]
    assert len(waited) and (waited["t_start"] - waited["t_due"] >= waited["slot_wait_s"]).all()
    shape = report["shape"]
    assert shape["kind"] == "rate" and shape["delayed_by_cap"] == len(
        waited[waited["t_start"] < report["window"]["end"]]
    )
    assert any("waited for one of the 2 slots" in s for s in validity.shortfalls(report))
    assert not any(w.startswith("mean in-flight") for w in report["warnings"])  # no closed loop to fill


def test_a_think_loop_waits_each_drawn_think_time_after_a_request(tmp_path):
    with MisbehavingServer("normal", token_interval_s=0.005) as server:
        report, frame, _ = run(server, tmp_path, users=2, think_s=0.3, duration_s=3)
    assert frame["ok"].all() and sorted(frame["user"].unique()) == [1, 2]
    for _, mine in frame.sort_values("t_start").groupby("user"):
        assert pd.isna(mine["think_s"].iloc[0]) and mine["think_s"].iloc[1:].gt(0).all()
        assert (
            mine["t_due"].iloc[1:].to_numpy()
            == (mine["t_end"].iloc[:-1] + mine["think_s"].iloc[1:].to_numpy()).to_numpy()
        ).all()
        assert (mine["t_start"].iloc[1:] >= mine["t_due"].iloc[1:]).all()
    shape = report["shape"]
    assert shape["kind"] == "think" and shape["thinks"] == frame["think_s"].notna().sum()
    assert frame["load_level"].eq("2 users think 0.3 s").all() and report["load_level"] == "2 users think 0.3 s"


def test_wakeup_probes_follow_the_load_each_after_its_gap_of_idle(tmp_path):
    with MisbehavingServer("normal", token_interval_s=0.005) as server:
        report, frame, _ = run(server, tmp_path, users=2, duration_s=2, wakeup_gaps_s=(0.05, 0.3), wakeup_n=2)
    load, probes = frame[frame["kind"] == "load"], frame[frame["kind"] == "wakeup"].sort_values("t_start")
    assert probes["ok"].all() and (probes["user"] == 0).all() and len(probes) == 1 + 2 + 2 * 2
    assert probes["t_start"].min() >= load["t_end"].max()  # the server idle: the load has ended
    # the first opens the connection, two more follow back to back: all after no gap
    assert probes["gap_s"].iloc[:3].isna().all()
    assert list(probes["gap_s"].iloc[3:]) == [0.05, 0.05, 0.3, 0.3]
    idle = probes["t_start"].to_numpy()[3:] - probes["t_end"].to_numpy()[2:-1]
    assert (idle >= probes["gap_s"].to_numpy()[3:]).all()
    assert (probes["first_step_s"] > 0).all() and (probes["completion_tokens"] == 8).all()
    assert report["wakeup"] == {"n": 4, "ok": 4, "gaps_s": [0.05, 0.3], "first_error": None}
    assert report["requests"]["started_after_end"] == 0  # the probes are not the load's
    table = wakeup.wakeup_table(frame)
    assert list(zip(table["gap_s"], table["n"], strict=True)) == [(0.05, 2), (0.3, 2)]
    metrics = set(wakeup.phase_metrics(frame)["metric"])
    assert {"wake-up penalty after 0.05 s", "first-step wake-up penalty after 0.3 s"} <= metrics


class LookupCountingServer(MisbehavingServer):
    """A normal peer that also counts the model lookups (GET /v1/models) it answers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lookups = []

    def _handler_class(self):
        peer, handler = self, super()._handler_class()

        class Counting(handler):
            def do_GET(self):
                if self.path == "/v1/models":
                    peer.lookups.append(time.time())
                super().do_GET()

        return Counting


def test_users_spawned_together_look_the_model_up_once(tmp_path):
    with LookupCountingServer("normal") as server:
        report, frame, _ = run(server, tmp_path, users=8, duration_s=2)
    assert len(server.lookups) == 1
    assert frame["ok"].all() and sorted(frame["user"].unique()) == list(range(1, 9))


def read_streams(*streams):
    """Each stream, (arrival time, line) pairs, through the load's StreamReader as the
    locustfile's exchange records them."""
    records = []
    for events in streams:
        reader = StreamReader(stall_gap_s=1.0)
        try:
            for t, line in events:
                reader.line(line.encode(), t)
            reader.end()
        except StreamFailure as exc:
            reader.fail(str(exc))
        except ValueError as exc:
            reader.fail(f"bad stream data: {exc}")
        records.append({**reader.record("load", 1, "tag"), "bytes": reader.bytes})
    return records


def sse(obj, end="\n"):
    """One event's data line as a server sends it (compact JSON, as vLLM writes it)."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}{end}"


def chunk(delta, **extra):
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        **extra,
    }


def test_stream_events_are_read_from_their_json():
    usage = {"prompt_tokens": 7, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3}}
    # A reasoning model behind an OpenAI-style server: "usage": null in every chunk, CRLF line
    # ends, a keep-alive comment, and a chunk whose only "content" is its logprobs list.
    reasoning = [
        (1.0, sse(chunk({"role": "assistant", "content": ""}, usage=None), "\r\n")),
        (1.0, "\r\n"),
        (1.2, ": keep-alive\r\n"),
        (1.5, sse(chunk({"reasoning_content": "think"}, usage=None), "\r\n")),
        (1.5, "\r\n"),
        (
            1.6,
            sse(
                chunk({}, usage=None)
                | {
                    "choices": [
                        {"index": 0, "delta": {}, "finish_reason": None, "logprobs": {"content": [{"token": "x"}]}}
                    ]
                },
                "\r\n",
            ),
        ),
        (2.7, sse(chunk({"content": "Hi"}, usage=None), "\r\n")),
        (2.8, sse(chunk({}, usage=None) | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})),
        (2.8, sse({"id": "c1", "choices": [], "usage": usage})),
        (2.8, "data: [DONE]\n"),
    ]
    no_usage = [
        (1.0, sse(chunk({"role": "assistant"}))),
        (1.1, sse(chunk({"content": "a"}))),
        (1.3, sse(chunk({"content": "b"}))),
        (1.3, "data: [DONE]\n"),
    ]
    error = [(1.0, sse(chunk({"content": "a"}))), (1.1, sse({"error": {"message": "overloaded"}}))]
    bad_json = [(1.0, sse(chunk({"content": "a"}))), (1.1, 'data: {"choices": [\n')]
    not_an_object = [(1.0, "data: [1, 2]\n")]
    truncated = [(1.0, sse(chunk({"content": "a"}))), (1.1, sse(chunk({"content": "b"})))]

    full, counted, failed, malformed, listed, cut = read_streams(
        reasoning, no_usage, error, bad_json, not_an_object, truncated
    )

    assert full["ok"] and full["error"] == "" and full["usage_source"] == "usage"
    assert full["t_first_token"] == 1.5  # the reasoning text, not the role chunk
    assert (full["prompt_tokens"], full["completion_tokens"], full["cached_tokens"]) == (7, 5, 3)
    assert full["max_gap_s"] == pytest.approx(1.2) and full["stall_gaps"] == 1  # reasoning to "Hi"
    assert full["bytes"] == sum(len(line.encode()) for _, line in reasoning)

    assert counted["ok"] and counted["usage_source"] == "chunks" and counted["completion_tokens"] == 2
    assert counted["t_first_token"] == 1.1 and counted["max_gap_s"] == pytest.approx(0.2)
    assert counted["prompt_tokens"] is None

    assert failed["error"] == "server error in stream: {'message': 'overloaded'}"
    assert malformed["error"].startswith("bad stream data: ") and not malformed["ok"]
    assert listed["error"].startswith("bad stream data: an event that is not a JSON object")
    assert cut["error"] == "stream truncated: the body ended without [DONE] after 2 token chunks"


def test_prompts_are_deterministic_tagged_first_and_sized():
    first = prompts.build_prompt("[AB-rep1-A load u1 #0]", 1400)
    assert first == prompts.build_prompt("[AB-rep1-A load u1 #0]", 1400)
    assert first.startswith("[AB-rep1-A load u1 #0] ")
    assert abs(len(first) * prompts.DEFAULT_TOKENS_PER_CHAR - 1400) < 5
    assert first == first.rstrip()
    assert len(prompts.build_prompt("t", 40_000)) > 150_000  # longer than the corpus: it repeats
    ratio = prompts.calibrated_tokens_per_char(first, 1200)
    assert abs(len(prompts.build_prompt("t", 1200, ratio)) * ratio - 1200) < 5


def test_inflight_is_time_weighted_over_the_window():
    frame = pd.DataFrame({"t_start": [0.0, 0.0, 5.0, -3.0], "t_end": [10.0, 5.0, 12.0, 1.0]})
    mean, share = validity.inflight(frame, 0.0, 10.0, users=2)
    assert mean == pytest.approx((10 + 5 + 5 + 1) / 10)
    assert share == pytest.approx(1.0)  # two in flight all along, three during [0, 1)
    assert validity.inflight(frame, 0.0, 10.0, users=3)[1] == pytest.approx(0.1)


def records(n_load=4, probe_arrivals=30, inflight_end=10.0, completion=20, cached=0):
    """A hand-made phase: ``n_load`` users each with one request over [0, inflight_end) and a
    30-token probe decoding in 1 s, its tokens in ``probe_arrivals`` arrivals."""
    load = [
        {
            "kind": "load",
            "user": u,
            "tag": f"u{u}",
            "t_start": 0.0,
            "t_first_token": 0.5,
            "t_end": inflight_end,
            "prompt_tokens": 200,
            "completion_tokens": completion,
            "cached_tokens": cached,
            "ok": True,
            "error": "",
            "max_gap_s": 0.1,
            "stall_gaps": 0,
            "usage_source": "usage",
            "token_arrivals": completion,
            "token_span_s": inflight_end - 0.6,
        }
        for u in range(1, n_load + 1)
    ]
    probe = {
        "kind": "probe",
        "user": 0,
        "tag": "p",
        "t_start": 2.0,
        "t_first_token": 2.5,
        "t_end": 3.5,
        "prompt_tokens": 200,
        "completion_tokens": 30,
        "cached_tokens": 0,
        "ok": True,
        "error": "",
        "max_gap_s": 0.1,
        "stall_gaps": 0,
        "usage_source": "usage",
        "token_arrivals": probe_arrivals,
        "token_span_s": 0.95 if probe_arrivals >= 8 else 0.001,
    }
    return validity.to_frame(load + [probe], order="AB", rep=1, arm="B")


def report_of(frame, users=4):
    report = validity.validity_report(
        frame, (0.0, 10.0), users=users, max_tokens=20, prompt_tokens=200, probe_n=1, stall_gap_s=1.0
    )
    return {"order": "AB", "rep": 1, "arm": "B", **report}


def test_a_closed_loop_of_full_length_unique_requests_is_as_configured():
    report = report_of(records())
    assert validity.shortfalls(report) == [] and report["warnings"] == []
    assert records()["token_chunks"].isna().all()  # records without chunk counts: unknown
    assert report["probe"]["measurable"] == 1 and report["probe"]["decode_tok_s_median"] == 29.0


def test_probes_not_sent_before_the_window_ended_are_no_failures():
    frame = records()
    asked_three = validity.validity_report(
        frame, (0.0, 10.0), users=4, max_tokens=20, prompt_tokens=200, probe_n=3, stall_gap_s=1.0
    )
    assert asked_three["warnings"] == ["probe: 1 of 3 requests sent before the window ended"]
    failed = frame.assign(ok=frame["ok"].where(frame["kind"] != "probe", False))
    assert "probe: 1 of 1 requests sent failed" in report_of(failed)["warnings"]


def test_shortfalls_name_each_way_the_load_fell_short():
    """users − 0.05 in flight is the least that counts as the configured closed loop."""
    assert validity.shortfalls(report_of(records(inflight_end=9.9))) == []  # 3.96 of 4
    report = report_of(records(inflight_end=9.8, completion=19, cached=64))
    assert validity.shortfalls(report) == [
        "3.92 of 4 requests in flight",
        "0.0% of ok load requests at max_tokens=20",
        "4 load requests hit the prefix cache",
    ]
    assert any(w.startswith("mean in-flight requests 3.92 for 4 users") for w in report["warnings"])
    assert validity.shortfalls({**report_of(records()), "aborted": "thermal interlock"}) == [
        "load aborted: thermal interlock"
    ]


def test_a_bursty_probe_has_no_decode_speed_and_says_how_its_tokens_came():
    report = report_of(records(probe_arrivals=2))
    assert report["probe"] == {"n": 1, "ok": 1, "measurable": 0, "token_arrivals": [2], "decode_tok_s_median": None}
    assert report["warnings"] == [
        "probe decode speed not measurable: tokens arrived in 2 bursts "
        "(it needs 8 arrivals spanning 80 % of the decode time)"
    ]
    assert "probe not measurable (2 bursts)" in validity.summary_line(report)


def test_locust_command_bounds_the_run_and_passes_the_options():
    spec = runner.LoadSpec(
        users=4,
        duration_s=1800,
        stop_timeout_s=120,
        max_tokens=400,
        prompt_tokens=1400,
        model=None,
        extra_body={"reasoning_effort": "low"},
        probe=False,
        probe_at_s=None,
        probe_n=3,
        probe_tokens=256,
        stall_gap_s=1.0,
    )
    command = runner.locust_command(
        "http://127.0.0.1:1", "r.jsonl", "e.jsonl", spec, "AB-rep1-A", extra_body_file="x/extra_body.json"
    )
    joined = " ".join(command)
    assert runner.LOCUSTFILE.is_file()
    for part in (
        "--headless",
        "-u 4 -r 4",
        "--run-time 1800s",
        "--stop-timeout 120s",
        "--probe-n 0",
        "--extra-body-file x/extra_body.json",
        "--records-out r.jsonl",
    ):
        assert part in joined
    assert "reasoning_effort" not in joined  # the body travels in the file, never on the command line
    assert "--model" not in command and "--probe-at" not in command


def test_a_large_extra_body_reaches_every_request_through_a_file(tmp_path):
    """300 kB of extra fields: over the kernel's 128 KiB per argument, so only a file carries it."""
    extra = {"reasoning_effort": "low", "pad": "x" * 300_000}
    with MisbehavingServer("normal", token_interval_s=0.01) as server:
        report, frame, _ = run(server, tmp_path, users=2, duration_s=2, extra_body=extra)
        seen = list(server.extra_fields)
    assert report["requests"]["load_ok"] > 0 and len(seen) == len(frame)
    assert all(fields == extra for fields in seen)
    assert json.loads((tmp_path / "extra_body.json").read_text()) == extra


def test_jsonl_tail_waits_for_the_newline(tmp_path):
    path = tmp_path / "r.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == []
    path.write_text('{"a": 1}\n{"a": ')
    assert tail.poll() == [{"a": 1}]
    with path.open("a") as handle:
        handle.write("2}\n")
    assert tail.poll() == [{"a": 1}, {"a": 2}]


# -- what a server replies is checked before it is counted -----------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def usage_of(value):
    return st.fixed_dictionaries(
        {"completion_tokens": value},
        optional={"prompt_tokens": value, "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": value})},
    )


@settings(max_examples=300, deadline=None)
@given(
    choices=st.one_of(
        JSON_VALUES,
        st.lists(st.fixed_dictionaries({"delta": JSON_VALUES}) | JSON_VALUES, max_size=3),
        st.lists(st.fixed_dictionaries({"delta": st.fixed_dictionaries({"content": JSON_VALUES})}), max_size=2),
    ),
    usage=st.one_of(JSON_VALUES, usage_of(JSON_VALUES), usage_of(st.integers(-5, 2**40))),
)
def test_any_reply_is_an_ok_record_of_true_counts_or_a_failed_one_with_its_reason(choices, usage):
    """Whatever shape a server gives ``choices``, ``delta`` and ``usage``, the record is a
    failed request naming what was wrong, or an ok one whose token counts are whole numbers
    from 0 to MAX_TOKEN_COUNT (or absent); never an ok record of a reply that was not read."""
    (record,) = read_streams(
        [
            (1.0, sse({"choices": choices, "usage": usage}, "\n")),
            (1.1, sse(chunk({"content": "a"}))),
            (1.2, "data: [DONE]\n"),
        ]
    )
    if not record["ok"]:
        assert record["error"].startswith("bad stream data: ") and "\n" not in record["error"]
        return
    for name in COUNTS:
        value = record[name]
        assert value is None or (type(value) is int and 0 <= value <= MAX_TOKEN_COUNT), (name, value)
    assert record["completion_tokens"] is not None


@pytest.mark.parametrize(
    "event, reason",
    [
        ({"choices": [1, 2]}, "'choices' is not a list of JSON objects"),
        ({"choices": [{"delta": "text"}]}, "'delta' is not a JSON object"),
        ({"choices": [{"delta": {"content": 5}}]}, "a text field of 'delta' is not text"),
        ({"choices": [], "usage": {"completion_tokens": -8409}}, "usage completion_tokens -8409 is not a token count"),
        ({"choices": [], "usage": {"completion_tokens": 10**30}}, "is not a token count"),
        ({"choices": [], "usage": {"completion_tokens": "5"}}, "usage completion_tokens 5 is not a token count"),
        ({"choices": [], "usage": {"completion_tokens": 5.5}}, "is not a token count"),
        ({"choices": [], "usage": 5}, "'usage' is not a JSON object"),
        ({"choices": [], "usage": {"prompt_tokens": 3}}, "'usage' without completion_tokens"),
    ],
)
def test_a_reply_of_the_wrong_shape_is_a_failed_request_naming_it(event, reason):
    (record,) = read_streams([(1.0, sse(chunk({"content": "a"}))), (1.1, sse(event)), (1.2, "data: [DONE]\n")])
    assert not record["ok"] and reason in record["error"]


@pytest.mark.parametrize(
    "extra_body", [{"seed": 99_999_999_999_999_999_999}, {"stop": "\ud800"}, {"n": [{"x": -(2**64)}]}]
)
def test_an_extra_body_the_load_cannot_encode_is_refused_at_config_time(extra_body):
    """The load's encoder (orjson) takes no integer past 64 bits and no lone surrogate:
    such a body is refused when read, naming the key, not sent as requests that never left."""
    assert "not JSON" in config.extra_body_problem(extra_body)
    with pytest.raises(argparse.ArgumentTypeError):
        runner._extra_body_arg(json.dumps(extra_body))


def test_a_password_in_the_url_is_never_echoed(tmp_path):
    with MisbehavingServer("normal") as server:
        url = server.url.replace("http://", "http://user:s3cret@")
        runner_out = tmp_path / "requests.parquet"
        lines = []
        runner.run_load(
            url,
            runner_out,
            runner.LoadSpec(duration_s=1, users=1, max_tokens=4, prompt_tokens=50, probe=False, stop_timeout_s=5),
            order="AB",
            rep=1,
            arm="A",
            progress=lines.append,
        )
    validity_text = (tmp_path / "validity.json").read_text()
    assert "s3cret" not in validity_text and "user:***@" in validity_text
    assert not any("s3cret" in line for line in lines)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_log_that_is_no_file_is_refused_at_once(tmp_path, kind):
    log = tmp_path / "log"
    os.mkfifo(log) if kind == "fifo" else log.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "thermab", "load", "http://127.0.0.1:9", "--out", str(tmp_path / "r.parquet")]
        + ["--duration", "1", "--log", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"thermab load: {log}: a {'FIFO' if kind == 'fifo' else 'directory'}, not a file"
    ]


def test_the_cause_of_a_failed_load_is_in_the_output_not_only_in_its_log(tmp_path):
    """A locustfile whose test start fails: Locust exits with an error status (or, as it
    happens, runs past its bound): the error that says why is in the warnings and the
    output, or in the stage's message, not only in locust.log."""
    broken = tmp_path / "broken_locustfile.py"
    broken.write_text(
        "from locust import events\n\n"
        "from thermab.load.locustfile import LoadUser  # noqa: F401\n\n\n"
        "@events.test_start.add_listener\n"
        "def broken(environment, **_kwargs):\n"
        '    raise RuntimeError("the cause is here")\n'
    )
    (tmp_path / "out").mkdir()
    with MisbehavingServer("normal") as server:
        try:
            report, _, lines = run(server, tmp_path / "out", users=1, duration_s=1, stop_timeout_s=1, locustfile=broken)
            shown = report["warnings"] + lines
        except runner.StageFailed as error:
            shown = [str(error)]
    assert any("RuntimeError: the cause is here" in text for text in shown), shown
