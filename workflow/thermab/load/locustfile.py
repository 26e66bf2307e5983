"""Closed-loop streaming load on an OpenAI-compatible server (vLLM), one record per request.

On its own, with the web UI (the options below appear in its form):

    locust -f workflow/thermab/load/locustfile.py --host http://127.0.0.1:8000

Headless, as thermab's load stage runs it (``thermab/load/runner.py``; never import this file into
Snakemake's process, gevent's monkey-patching hangs it):

    locust -f workflow/thermab/load/locustfile.py --headless -u 4 -r 4 --run-time 1800 --stop-timeout 120 \\
        --host URL --tag-prefix AB-rep1-A --records-out requests.jsonl --events-out load_events.jsonl

Each user is one slot of a closed loop: it holds one streamed chat completion and sends the
next the moment the last one ends, so ``-u`` requests are always in flight. The
single-stream probe runs beside them in its own greenlet, not as a user, so ``-u`` stays
the load. When the run time ends no new request starts; those in flight finish within
``--stop-timeout`` and are recorded (a stream still open when it runs out is recorded as
failed).

Per request, times are epoch seconds on this machine: ``t_start`` before sending,
``t_first_token`` when the first delta carrying text arrives, ``t_end`` when the stream
ends. Each line of the stream is handled the moment it is complete, whatever else has
arrived, so buffering never delays the first token. Every event is parsed (orjson), so
text, usage and errors are read from the JSON, never guessed from its bytes. Token counts
come from the server's ``usage`` (``stream_options.include_usage``); only when a server
sends none are text-bearing chunks counted instead, flagged ``usage_source = "chunks"`` (an
undercount under speculative decoding, where one chunk carries several tokens).
Inter-token gaps are measured between chunks; ``max_gap_s`` is the largest, ``stall_gaps``
counts those of at least ``--stall-gap-s``.
``token_arrivals`` counts the separate arrivals of text (lines handled within
``ARRIVAL_GAP_S`` of the previous one were read from one buffer: one arrival) and
``token_span_s`` is the time from the first to the last: what the analysis needs to tell a
measured decode speed from tokens that came in a few bursts. ``token_chunks`` counts the
events that carried text, one per engine step: the request's own tokens per step.

Locust runs the users, their spawning and stopping, the statistics and the web UI. The
streams go over geventhttpclient, the client of Locust's FastHttpUser, used directly: a
FastHttpUser's session fires its request event when the headers arrive, but a stream's
latency ends with its last token, so the one request event here, fired when the stream
ends, carries ``t_end - t_start`` and the stream's outcome, and Locust's statistics and UI
show whole requests. There is no per-chunk event. docs/benchmarks.md has the profile behind
these choices and how this compares with a bare asyncio client.
"""

import itertools
import json
import logging
import os
import secrets
import time
from http.client import HTTPException

import gevent
import gevent.event
import gevent.pool
import gevent.queue
import orjson
from gevent import GreenletExit, Timeout
from gevent.lock import Semaphore
from geventhttpclient import URL, HTTPClient
from locust import User, constant, events, task
from locust.exception import StopUser

from thermab.config import MAX_EXTRA_BODY, defaults as schema_defaults, extra_body_problem, read_bounded
from thermab.load.prompts import DEFAULT_TOKENS_PER_CHAR, build_prompt, calibrated_tokens_per_char
from thermab.load.shapes import arrival_stream, shape_problem, think_stream
from thermab.load.stream import StreamFailure, StreamReader

LOAD_DEFAULTS = schema_defaults("load")  # the schema's: one owner of every default of the load
CONNECT_TIMEOUT_S = 10
# A server silent this long fails the request instead of hanging the run. It is one timer per
# request, restarted at most every REARM_S as lines arrive, not a socket timeout: gevent
# starts a timer for every wait of a socket that has one, 12 % of the load's CPU samples at
# 4 users (docs/benchmarks.md). So it fires after READ_TIMEOUT_S - REARM_S to READ_TIMEOUT_S
# without a line.
READ_TIMEOUT_S = 120
REARM_S = 1.0
JSON_HEADERS = {"Content-Type": "application/json"}
ERROR_BACKOFF_S = 1.0
PROBE_USER = 0  # load users are numbered from 1
WAKEUP_TOKENS = 8  # a wake-up probe's max_tokens: its first token and first decode steps

RUN = None  # the LoadTest in progress (one per test_start)


@events.init_command_line_parser.add_listener
def add_options(parser):
    # Defaults carry the type: the web UI converts what is typed to the default's type.
    parser.add_argument("--model", default="", help="Model name (default: the first id of /v1/models)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=LOAD_DEFAULTS["max_tokens"],
        help="max_tokens of each load request (ignore_eos is set)",
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=LOAD_DEFAULTS["prompt_tokens"], help="Target prompt size in tokens"
    )
    parser.add_argument(
        "--extra-body-file", default="", help='A JSON object merged into each request, e.g. {"reasoning_effort": "low"}'
    )
    parser.add_argument(
        "--tag-prefix", default="", help="Run/phase id at the start of every tag (default: time and pid)"
    )
    parser.add_argument(
        "--records-out", default="", help="JSONL file, one record per request (appended, flushed per line)"
    )
    parser.add_argument(
        "--events-out", default="", help="JSONL file for load_start, probe_start, probe_end, load_end (appended)"
    )
    parser.add_argument(
        "--probe-at",
        default=f"{LOAD_DEFAULTS['probe_at']:.0%}",
        help="Probe start: seconds after test start, or a percentage of --run-time",
    )
    parser.add_argument(
        "--probe-n", type=int, default=LOAD_DEFAULTS["probe_n"], help="Sequential probe requests (0: no probe)"
    )
    parser.add_argument(
        "--probe-tokens", type=int, default=LOAD_DEFAULTS["probe_tokens"], help="max_tokens of each probe request"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="Open loop: requests per second arriving whatever the server does, -u the cap in flight (0: a loop)",
    )
    parser.add_argument(
        "--burstiness", type=float, default=1.0, help="Gamma shape of the gaps between arrivals (1: Poisson)"
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=LOAD_DEFAULTS["users"],
        help="Open loop: the cap on requests in flight; an arrival finding it reached waits for a slot",
    )
    parser.add_argument(
        "--think-s", type=float, default=0.0, help="Mean think time of each user before its next request (0: none)"
    )
    parser.add_argument(
        "--shape-seed", type=int, default=0, help="Seed of the arrivals and think times (the same in every arm)"
    )
    parser.add_argument(
        "--wakeup-gaps",
        default="",
        help="After the load: single requests each sent this many seconds after the last ended, "
        "comma-separated, ascending (empty: none)",
    )
    parser.add_argument("--wakeup-n", type=int, default=LOAD_DEFAULTS["wakeup_n"], help="Wake-up probes per gap")
    parser.add_argument(
        "--stall-gap-s",
        type=float,
        default=schema_defaults("analysis")["stall_gap_s"],
        help="An inter-token gap at least this long counts as a stall",
    )


def probe_delay_s(probe_at, run_time_s):
    """``"60%"`` of the run time or plain seconds; None when a percentage has no run time."""
    text = str(probe_at).strip()
    if text.endswith("%"):
        return float(text[:-1]) / 100 * run_time_s if run_time_s else None
    return float(text.removesuffix("s"))


def read_extra_body(path):
    """The JSON object in ``path`` (none: {}), read bounded as the config bounds it."""
    if not path:
        return {}
    extra_body = json.loads(read_bounded(path, MAX_EXTRA_BODY))
    problem = extra_body_problem(extra_body)
    if problem:
        raise ValueError(f"--extra-body-file {path}: {problem}")
    return extra_body


def silence_timeout():
    return Timeout(READ_TIMEOUT_S, TimeoutError(f"no line from the server for {READ_TIMEOUT_S} s"))


def open_jsonl(path):
    return open(path, "a", encoding="utf-8") if path else None


def write_line(handle, obj):
    # Flushed per line: a crash loses at most the line being written. Greenlets cannot
    # interleave lines, as file writes do not yield to gevent.
    if handle:
        handle.write(json.dumps(obj) + "\n")
        handle.flush()


class LoadTest:
    """What one test shares from test_start to test_stop: its options, the output files,
    the model name, the prompt-size calibration and the probe."""

    def __init__(self, environment):
        options = environment.parsed_options  # read per test: the web UI form updates it
        self.environment = environment
        self.options = options
        self.extra_body = read_extra_body(options.extra_body_file)
        # A fresh default per test keeps reruns against one server from sharing prefixes.
        self.tag_prefix = options.tag_prefix or f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        # random per test, early in every tag: no two runs' prompts share a first cache block,
        # even two started together against one server (their clocks and pids can agree)
        self.nonce = secrets.token_hex(4)
        self.probe_delay_s = probe_delay_s(options.probe_at, options.run_time)
        self.records = open_jsonl(options.records_out)
        self.events = open_jsonl(options.events_out)
        self.base_url = (environment.host or "").rstrip("/").removesuffix("/v1")
        self.path = URL(self.base_url).path.rstrip("/")  # a server behind a path prefix
        self.chat_path = self.path + "/v1/chat/completions"
        self.model = options.model
        self.model_lookup = Semaphore()
        self.tokens_per_char = DEFAULT_TOKENS_PER_CHAR
        self.calibrated = False
        self.user_ids = itertools.count(PROBE_USER + 1)
        self.stopping = False
        self.stop_event = gevent.event.Event()  # set with stopping: ends a wait for an arrival or a think
        self.stop_deadline = None
        self.probe = None
        for key in ("rate", "think_s", "burstiness"):  # 0 turns a rate or think time off
            problem = shape_problem(key, getattr(options, key) or (None if key != "burstiness" else 0))
            if problem:
                raise ValueError(f"--{key.replace('_', '-')}: {problem}")
        if options.max_inflight < 1:
            raise ValueError(f"--max-inflight: {options.max_inflight} is not a whole number above 0")

    def client(self):
        """A keep-alive connection of its own for one user (or the probe)."""
        return HTTPClient.from_url(
            self.base_url, connection_timeout=CONNECT_TIMEOUT_S, network_timeout=None, concurrency=1
        )

    def model_name(self, client):
        if not self.model:
            with self.model_lookup:  # one lookup for all: users spawned together would each ask
                if not self.model:
                    try:
                        with silence_timeout():
                            response = client.get(self.path + "/v1/models")
                            text = response.read()
                        if response.status_code != 200:
                            raise ValueError(f"HTTP {response.status_code}: {text[:300]!r}")
                        self.model = orjson.loads(text)["data"][0]["id"]
                    except (HTTPException, OSError, ValueError, LookupError, TypeError) as exc:
                        raise StreamFailure(f"model lookup at /v1/models failed: {exc!r}") from exc
        return self.model

    def exchange(self, client, kind, user, sequence, max_tokens, timing=None):
        """One streamed request, recorded whatever happens (``timing``: the shape's
        ``t_due``, ``think_s`` and ``slot_wait_s`` of it); returns whether it succeeded
        and when it ended."""
        # what makes the tag unique comes first (the request within the run, then the run): a
        # prefix cache compares whole 16-token blocks from the start, and the chat template
        # already takes half of the first (8 of the tiny test model's tokens)
        tag = f"[u{user}#{sequence} {self.nonce} {kind} {self.tag_prefix}]"
        prompt = build_prompt(tag, self.options.prompt_tokens, self.tokens_per_char)
        reader = StreamReader(self.options.stall_gap_s)
        try:
            body = orjson.dumps(
                {
                    **self.extra_body,
                    "model": self.model_name(client),
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            )
            reader.t_start = time.time()  # the first request's model lookup is not its latency
            with silence_timeout() as silence:
                self.stream(client, body, reader, silence)
        except GreenletExit:
            reader.fail(f"stopped at --stop-timeout: stream still open after {reader.token_chunks} token chunks")
            raise
        except StreamFailure as exc:
            reader.fail(str(exc))
        except (HTTPException, OSError) as exc:  # geventhttpclient's parse errors are HTTPExceptions
            if reader.responded:
                reader.fail(f"connection dropped mid-stream: after {reader.token_chunks} token chunks, {exc!r}")
            else:
                reader.fail(f"request failed before a response: {exc!r}")
        except ValueError as exc:
            reader.fail(f"bad stream data: {exc}")
        except Exception as exc:  # a fault of ours: the request is still no ok one, and the fault is seen
            reader.fail(f"load fault: {exc!r}")
            raise
        finally:
            reader.t_end = time.time()
            self.emit(reader, kind, user, tag, timing)
            self.learn_prompt_size(prompt, reader)
        return not reader.error, reader.t_end

    def stream(self, client, body, reader, silence):
        response = client.request("POST", self.chat_path, body=body, headers=JSON_HEADERS)
        try:
            if response.status_code != 200:
                raise StreamFailure(f"HTTP {response.status_code}: {response.read()[:300].decode(errors='replace')}")
            reader.responded = True
            rearmed = reader.t_start
            # readline returns each line once it is complete, reading whatever has arrived:
            # no read waits for a buffer to fill, so the first token is never held back.
            readline = response.readline
            while line := readline(b"\n"):
                now = time.time()
                reader.line(line, now)
                if now - rearmed > REARM_S:
                    silence.cancel()
                    silence.start()
                    rearmed = now
            reader.end()
        finally:
            response.release()  # back to the pool when complete, else the connection is closed

    def emit(self, reader, kind, user, tag, timing=None):
        write_line(self.records, {**reader.record(kind, user, tag), **(timing or {})})
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
        client = self.client()
        self.mark("probe_start")
        try:
            for sequence in range(self.options.probe_n):
                if self.stopping:
                    return
                self.exchange(client, "probe", PROBE_USER, sequence, self.options.probe_tokens)
        finally:
            client.close()
            self.mark("probe_end")

    def wakeup_probes(self):
        """``--wakeup-n`` single requests after each gap of ``--wakeup-gaps``, in turn: each
        leaves its gap after the previous request ended, the load's last one for the first,
        so the server has been idle exactly that long.  One connection, kept alive, opened by
        a first request without a gap (recorded, ``gap_s`` empty), so no gap pays a connect;
        then ``--wakeup-n`` back-to-back requests on it (``gap_s`` empty too), each sent as
        the last ended: the same start's latency without idle, which each gap's is
        contrasted with (docs/design.md, "Wake-up probes")."""
        gaps = [float(gap) for gap in self.options.wakeup_gaps.split(",") if gap.strip()]
        if not gaps:
            return
        client = self.client()
        try:
            sequence = itertools.count()
            for _ in range(1 + self.options.wakeup_n):
                _, ended = self.exchange(client, "wakeup", PROBE_USER, next(sequence), WAKEUP_TOKENS)
            for gap in gaps:
                for _ in range(self.options.wakeup_n):
                    due = ended + gap
                    gevent.sleep(max(0.0, due - time.time()))
                    _, ended = self.exchange(
                        client, "wakeup", PROBE_USER, next(sequence), WAKEUP_TOKENS, {"t_due": due, "gap_s": gap}
                    )
        finally:
            client.close()

    def mark(self, event):
        write_line(self.events, {"t": time.time(), "event": event})

    def begin_stop(self):
        self.mark("load_end")
        self.stopping = True
        self.stop_event.set()
        self.stop_deadline = time.time() + self.environment.stop_timeout

    def finish(self):
        """Let a probe request in flight end within the stop timeout, send the wake-up probes
        to the server left idle, then close the files."""
        if self.probe is not None:
            self.probe.join(timeout=max(0.0, self.stop_deadline - time.time()))
            self.probe.kill()  # no-op when it has ended; else its open stream is recorded as stopped
        self.wakeup_probes()
        for handle in (self.records, self.events):
            if handle:
                handle.close()


@events.init.add_listener
def on_init(**_kwargs):
    # gevent's timers count from the loop's cached clock, which stood still while Locust and
    # this file were imported (seconds on a busy machine): refreshed here, just before Locust
    # arms its --run-time timer, the run time is counted from now, not from before the imports.
    gevent.get_hub().loop.update_now()


@events.test_start.add_listener
def on_test_start(environment, **_kwargs):
    global RUN
    RUN = LoadTest(environment)
    RUN.mark("load_start")
    RUN.start_probe()


@events.test_stopping.add_listener
def on_test_stopping(environment, **_kwargs):
    RUN.begin_stop()


@events.test_stop.add_listener
def on_test_stop(environment, **_kwargs):
    RUN.finish()


class LoadUser(User):
    """One slot of a loop: the next request leaves the moment the last one ends, or a drawn
    think time after it (``--think-s``).  With ``--rate`` the first user is the open loop's
    dispatcher instead (``arrivals``) and any other has nothing to do."""

    # The task returns only after a failed request (see chat); then a short pause, so a dead
    # server yields a handful of error records rather than thousands of refused connections.
    wait_time = constant(ERROR_BACKOFF_S)

    def on_start(self):
        self.index = next(RUN.user_ids)
        self.client = RUN.client()
        self.sequence = itertools.count()
        self.stop_asked = False
        options = RUN.options
        self.thinks = think_stream(options.think_s, options.shape_seed, self.index) if options.think_s else None
        self.due = None  # when the next request is due after a think time

    def on_stop(self):
        self.client.close()

    def stop(self, force=False):
        # Locust asks a running user to stop (the end of the test, or fewer users set in the
        # web UI) by marking it, and waits for its task to return: the loop in chat ends at
        # the next request boundary.
        self.stop_asked = True
        return super().stop(force)

    @task
    def chat(self):
        if RUN.options.rate:
            if self.index == PROBE_USER + 1:
                arrivals(RUN, lambda: self.stop_asked)
            raise StopUser()
        # The loop stays in this task while requests succeed: between two tasks Locust
        # yields to gevent even at zero wait, and at 64 users that yield left the slot idle
        # for milliseconds behind the other streams' chunks (docs/benchmarks.md).
        timing = None
        while not (RUN.stopping or self.stop_asked):
            ok, ended = RUN.exchange(
                self.client, "load", self.index, next(self.sequence), RUN.options.max_tokens, timing
            )
            if not ok:
                return
            if self.thinks:
                think = next(self.thinks)
                timing = {"t_due": ended + think, "think_s": think}
                RUN.stop_event.wait(max(0.0, timing["t_due"] - time.time()))
        # Locust tells users to stop a moment after test_stopping; a request ending in that
        # moment must not start another after the end of the load.
        raise StopUser()


def arrivals(run, stop_asked):
    """The open loop: each request leaves at its drawn arrival time, on a connection of a
    free slot; one that finds all ``--max-inflight`` slots busy waits for the first to free
    (recorded as ``slot_wait_s``).  The schedule is absolute from the first arrival's start,
    so a late start never shifts the ones after it.  A failed request frees its slot after
    the error back-off, as a loop's user pauses."""
    options = run.options
    slots = gevent.queue.Queue()  # free connections; a slot is a connection and its greenlet
    opened = 0
    flights = gevent.pool.Group()

    def fly(client, sequence, timing):
        try:
            ok, _ = run.exchange(client, "load", PROBE_USER + 1, sequence, options.max_tokens, timing)
            if not ok:
                gevent.sleep(ERROR_BACKOFF_S)
        finally:
            slots.put(client)

    start = time.time()
    try:
        for sequence, offset in enumerate(arrival_stream(options.rate, options.burstiness, options.shape_seed)):
            due = start + offset
            run.stop_event.wait(max(0.0, due - time.time()))
            if run.stopping or stop_asked():
                break
            if slots.empty() and opened < options.max_inflight:
                slots.put(run.client())
                opened += 1
            blocked, asked = slots.empty(), time.time()
            client = slots.get()  # waits only when every slot is in flight
            waited = time.time() - asked if blocked else 0.0
            if run.stopping or stop_asked():
                slots.put(client)
                break
            flights.spawn(fly, client, sequence, {"t_due": due, "slot_wait_s": waited})
        flights.join()
    finally:
        flights.kill()  # at the stop timeout: the streams still open are recorded as stopped
        while not slots.empty():
            slots.get().close()
