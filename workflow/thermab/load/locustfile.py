"""Closed-loop streaming load on an OpenAI-compatible server (vLLM), one record per request.

On its own, with the web UI (the options below appear in its form):

    locust -f scripts/locustfile.py --host http://127.0.0.1:8000

Headless, as thermab's load stage runs it (``thermab/load.py``; never import this file into
Snakemake's process, gevent's monkey-patching hangs it):

    locust -f scripts/locustfile.py --headless -u 4 -r 4 --run-time 1800 --stop-timeout 120 \\
        --host URL --tag-prefix AB-rep1-A --records-out requests.jsonl --events-out load_events.jsonl

Each user is one slot of a closed loop: it holds one streamed chat completion and sends the
next the moment the last one ends, so ``-u`` requests are always in flight. The
single-stream probe runs beside them in its own greenlet, not as a user, so ``-u`` stays
the load. When the run time ends no new request starts; those in flight finish within
``--stop-timeout`` and are recorded (a stream still open when it runs out is recorded as
failed).

Per request, times are epoch seconds on this machine: ``t_start`` before sending,
``t_first_token`` when the first delta carrying text arrives, ``t_end`` when the stream
ends. The stream is read as bytes arrive (``read1``), so buffering never delays the first
token. Token counts come from the server's ``usage`` (``stream_options.include_usage``);
only when a server sends none are text-bearing chunks counted instead, flagged
``usage_source = "chunks"`` (an undercount under speculative decoding, where one chunk
carries several tokens). Inter-token gaps are measured between chunks; ``max_gap_s`` is the
largest, ``stall_gaps`` counts those of at least ``--stall-gap-s``. ``token_arrivals`` counts
the reads that brought text (chunks read together arrived together) and ``token_span_s`` is
the time from the first to the last of them: what the analysis needs to tell a measured
decode speed from tokens that came in a few bursts.

Locust's own response_time stops at the headers for a stream, so the request event fired
here carries ``t_end - t_start`` and the stream's outcome, and Locust's statistics and UI
show whole requests.
"""

import http.client
import itertools
import json
import logging
import os
import time

import gevent
import requests
import urllib3
from gevent import GreenletExit
from locust import User, events, task
from locust.exception import StopUser

from thermab.load.prompts import DEFAULT_TOKENS_PER_CHAR, build_prompt, calibrated_tokens_per_char

READ_BYTES = 65536  # an upper bound only: read1 returns whatever has arrived
TIMEOUT_S = (10, 120)  # (connect, between bytes): a hung server fails the request instead of the run
ERROR_BACKOFF_S = 1.0
PROBE_USER = 0  # load users are numbered from 1
# Reasoning models stream their thinking in a separate field before any content; those
# tokens are generated tokens too, so they count for the first token and the gaps.
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")

RUN = None  # the Run of the test in progress (one per test_start)


@events.init_command_line_parser.add_listener
def add_options(parser):
    # Defaults carry the type: the web UI converts what is typed to the default's type.
    parser.add_argument("--model", default="", help="Model name (default: the first id of /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=400, help="max_tokens of each load request (ignore_eos is set)")
    parser.add_argument("--prompt-tokens", type=int, default=1400, help="Target prompt size in tokens")
    parser.add_argument("--extra-body", default="{}", help='JSON merged into each request, e.g. {"reasoning_effort": "low"}')
    parser.add_argument("--tag-prefix", default="", help="Run/phase id at the start of every tag (default: time and pid)")
    parser.add_argument("--records-out", default="", help="JSONL file, one record per request (appended, flushed per line)")
    parser.add_argument("--events-out", default="", help="JSONL file for load_start, probe_start, probe_end, load_end (appended)")
    parser.add_argument("--probe-at", default="60%", help="Probe start: seconds after test start, or a percentage of --run-time")
    parser.add_argument("--probe-n", type=int, default=3, help="Sequential probe requests (0: no probe)")
    parser.add_argument("--probe-tokens", type=int, default=256, help="max_tokens of each probe request")
    parser.add_argument("--stall-gap-s", type=float, default=1.0, help="An inter-token gap at least this long counts as a stall")


def probe_delay_s(probe_at, run_time_s):
    """``"60%"`` of the run time or plain seconds; None when a percentage has no run time."""
    text = str(probe_at).strip()
    if text.endswith("%"):
        return float(text[:-1]) / 100 * run_time_s if run_time_s else None
    return float(text.removesuffix("s"))


def parse_extra_body(text):
    extra_body = json.loads(text or "{}")
    if not isinstance(extra_body, dict):
        raise ValueError(f"--extra-body must be a JSON object, not {text!r}")
    return extra_body


class StreamFailure(Exception):
    """A request that did not deliver a complete stream; its text is the record's error."""


class StreamReader:
    """Reads one server-sent-events chat completion and keeps what its record needs."""

    def __init__(self, stall_gap_s):
        self.stall_gap_s = stall_gap_s
        self.t_start = time.time()
        self.t_first_token = None
        self.t_last_token = None
        self.t_end = None
        self.responded = False
        self.done = False
        self.token_chunks = 0
        self.bytes = 0
        self.usage = None
        self.max_gap_s = None
        self.stall_gaps = 0
        self.token_arrivals = 0
        self.error = ""
        self._pending = b""

    def read(self, response):
        self.responded = True
        while data := response.raw.read1(READ_BYTES):
            now = time.time()
            self.bytes += len(data)
            *lines, self._pending = (self._pending + data).split(b"\n")
            for line in lines:
                self._event(line.strip(), now)
        if not self.done:
            raise StreamFailure(f"stream truncated: the body ended without [DONE] after {self.token_chunks} token chunks")

    def _event(self, line, now):
        if not line.startswith(b"data:"):
            return  # blank separators, comments and event names carry nothing we count
        payload = line[len(b"data:"):].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        event = json.loads(payload)
        if event.get("error"):
            raise StreamFailure(f"server error in stream: {event['error']}")
        if event.get("usage"):
            self.usage = event["usage"]
        if any((choice.get("delta") or {}).get(field) for choice in event.get("choices") or [] for field in TEXT_FIELDS):
            self._token_chunk(now)

    def _token_chunk(self, now):
        if self.t_first_token is None:
            self.t_first_token = now
        else:
            gap = now - self.t_last_token
            self.max_gap_s = gap if self.max_gap_s is None else max(self.max_gap_s, gap)
            if gap >= self.stall_gap_s:
                self.stall_gaps += 1
        if now != self.t_last_token:  # chunks of one read share its time: one arrival
            self.token_arrivals += 1
        self.t_last_token = now
        self.token_chunks += 1

    def fail(self, error):
        self.error = error

    def record(self, kind, user, tag):
        usage = self.usage or {}
        return {
            "kind": kind,
            "user": user,
            "tag": tag,
            "t_start": self.t_start,
            "t_first_token": self.t_first_token,
            "t_end": self.t_end,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage["completion_tokens"] if self.usage else self.token_chunks,
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "ok": not self.error,
            "error": self.error,
            "max_gap_s": self.max_gap_s,
            "stall_gaps": self.stall_gaps,
            "usage_source": "usage" if self.usage else "chunks",
            "token_arrivals": self.token_arrivals,
            "token_span_s": None if self.t_first_token is None else self.t_last_token - self.t_first_token,
        }


def open_jsonl(path):
    return open(path, "a", encoding="utf-8") if path else None


def write_line(handle, obj):
    # Flushed per line: a crash loses at most the line being written. Greenlets cannot
    # interleave lines, as file writes do not yield to gevent.
    if handle:
        handle.write(json.dumps(obj) + "\n")
        handle.flush()


class Run:
    """What one test shares from test_start to test_stop: its options, the output files,
    the model name, the prompt-size calibration and the probe."""

    def __init__(self, environment):
        options = environment.parsed_options  # read per test: the web UI form updates it
        self.environment = environment
        self.options = options
        self.extra_body = parse_extra_body(options.extra_body)
        # A fresh default per test keeps reruns against one server from sharing prefixes.
        self.tag_prefix = options.tag_prefix or f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self.probe_delay_s = probe_delay_s(options.probe_at, options.run_time)
        self.records = open_jsonl(options.records_out)
        self.events = open_jsonl(options.events_out)
        self.base_url = (environment.host or "").rstrip("/").removesuffix("/v1")
        self.model = options.model
        self.tokens_per_char = DEFAULT_TOKENS_PER_CHAR
        self.calibrated = False
        self.user_ids = itertools.count(PROBE_USER + 1)
        self.stopping = False
        self.stop_deadline = None
        self.probe = None

    def model_name(self, session):
        if not self.model:
            try:
                response = session.get(f"{self.base_url}/v1/models", timeout=TIMEOUT_S)
                response.raise_for_status()
                self.model = response.json()["data"][0]["id"]
            except (requests.RequestException, ValueError, LookupError) as exc:
                raise StreamFailure(f"model lookup at /v1/models failed: {exc!r}") from exc
        return self.model

    def exchange(self, session, kind, user, sequence, max_tokens):
        """One streamed request, recorded whatever happens; returns whether it succeeded."""
        tag = f"[{self.tag_prefix} {kind} u{user} #{sequence}]"
        prompt = build_prompt(tag, self.options.prompt_tokens, self.tokens_per_char)
        reader = StreamReader(self.options.stall_gap_s)
        try:
            body = {
                **self.extra_body,
                "model": self.model_name(session),
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            reader.t_start = time.time()  # the first request's model lookup is not its latency
            with session.post(f"{self.base_url}/v1/chat/completions", json=body, stream=True, timeout=TIMEOUT_S) as response:
                if response.status_code != 200:
                    raise StreamFailure(f"HTTP {response.status_code}: {response.text[:300]}")
                reader.read(response)
        except GreenletExit:
            reader.fail(f"stopped at --stop-timeout: stream still open after {reader.token_chunks} token chunks")
            raise
        except StreamFailure as exc:
            reader.fail(str(exc))
        except (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            if reader.responded:
                reader.fail(f"connection dropped mid-stream: after {reader.token_chunks} token chunks, {exc!r}")
            else:
                reader.fail(f"request failed before a response: {exc!r}")
        except ValueError as exc:
            reader.fail(f"bad stream data: {exc}")
        finally:
            reader.t_end = time.time()
            self.emit(reader, kind, user, tag)
            self.learn_prompt_size(prompt, reader)
        return not reader.error

    def emit(self, reader, kind, user, tag):
        write_line(self.records, reader.record(kind, user, tag))
        self.environment.events.request.fire(
            request_type="POST",
            name=f"/v1/chat/completions ({kind})",
            response_time=(reader.t_end - reader.t_start) * 1000,
            response_length=reader.bytes,
            exception=StreamFailure(reader.error) if reader.error else None,
            context={"tag": tag},
        )

    def learn_prompt_size(self, prompt, reader):
        # The first measured prompt size recalibrates characters per token, so later prompts
        # land on the target whatever the server's tokenizer; the report shows how close.
        if not self.calibrated and not reader.error and (reader.usage or {}).get("prompt_tokens"):
            self.tokens_per_char = calibrated_tokens_per_char(prompt, reader.usage["prompt_tokens"])
            self.calibrated = True

    def start_probe(self):
        if self.options.probe_n <= 0:
            return
        if self.probe_delay_s is None:
            logging.warning("thermab probe skipped: no --run-time to take a percentage of; give --probe-at in seconds")
            return
        self.probe = gevent.spawn_later(self.probe_delay_s, self._probe)

    def _probe(self):
        session = requests.Session()
        self.mark("probe_start")
        try:
            for sequence in range(self.options.probe_n):
                if self.stopping:
                    return
                self.exchange(session, "probe", PROBE_USER, sequence, self.options.probe_tokens)
        finally:
            self.mark("probe_end")

    def mark(self, event):
        write_line(self.events, {"t": time.time(), "event": event})

    def begin_stop(self):
        self.mark("load_end")
        self.stopping = True
        self.stop_deadline = time.time() + self.environment.stop_timeout

    def finish(self):
        """Let a probe request in flight end within the stop timeout, then close the files."""
        if self.probe is not None:
            self.probe.join(timeout=max(0.0, self.stop_deadline - time.time()))
            self.probe.kill()  # no-op when it has ended; else its open stream is recorded as stopped
        for handle in (self.records, self.events):
            if handle:
                handle.close()


@events.test_start.add_listener
def on_test_start(environment, **_kwargs):
    global RUN
    RUN = Run(environment)
    RUN.mark("load_start")
    RUN.start_probe()


@events.test_stopping.add_listener
def on_test_stopping(environment, **_kwargs):
    RUN.begin_stop()


@events.test_stop.add_listener
def on_test_stop(environment, **_kwargs):
    RUN.finish()


class LoadUser(User):
    """One closed-loop slot: the next request leaves the moment the last one ends."""

    def wait_time(self):
        # Closed loop, no think time. After a failure only, a short pause, so a dead server
        # yields a handful of error records rather than thousands of refused connections.
        return ERROR_BACKOFF_S if self.last_failed else 0.0

    def on_start(self):
        self.index = next(RUN.user_ids)
        self.session = requests.Session()
        self.sequence = itertools.count()
        self.last_failed = False

    @task
    def chat(self):
        # Locust tells users to stop a moment after test_stopping; a request ending in that
        # moment must not start another after the end of the load.
        if RUN.stopping:
            raise StopUser()
        self.last_failed = not RUN.exchange(self.session, "load", self.index, next(self.sequence), RUN.options.max_tokens)
