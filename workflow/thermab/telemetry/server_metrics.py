"""The server's own view, from its Prometheus ``/metrics``: telemetry of kind ``server``.

During a phase the controller scrapes the endpoint's ``/metrics`` every
``monitor.intervals.server`` seconds (:class:`Scraper`, a thread) into the phase's
``server.csv``, in the agent's CSV format (t, sensor, value, reason) and on the
controller's clock.  What is kept, summed over the series' labels (one per engine):

- gauges: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (older vLLM: ``vllm:gpu_cache_usage_perc``);
- counters, raw: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, the
  ``_count`` of ``vllm:iteration_tokens_total`` (the engine's steps), speculative
  decoding's ``vllm:spec_decode_num_drafts_total``, ``…_num_draft_tokens_total`` and
  ``…_num_accepted_tokens_total``, and the ``_sum`` and ``_count`` of the TTFT and
  inter-token-latency histograms.

Ingest (:func:`server_rows`) passes the gauges through under short names (``running``,
``waiting``, ``kv_cache_usage``) and turns the counters into rates over each pair of
consecutive scrapes, at the pair's midpoint, as energy counters become watts:
``prompt_tok_s``, ``generation_tok_s``, and the mean TTFT and inter-token latency of the
interval (Δsum / Δcount, none where no request finished its first token or step),
``engine_steps_s``, and ``spec_drafts_s``, ``spec_draft_tokens_s``, ``spec_accepted_s``.  A
counter that went down (the server restarted) skips that interval, counted; the
spec-decode counters are read together, and where one of them went back within the phase
or more tokens were accepted than drafted, none of their rates is made: one
``spec_decode_fault`` row says which (``SPEC_FAULTS``), so that the phase's acceptance is
empty with that reason (analysis/speed.py), never a number.

The body is cut to the lines of the kept samples before prometheus_client's parser reads
it (:func:`kept_lines`): the parser's cost is per line, and most of vLLM's lines are
histogram buckets and families thermab does not read.

Bad input never stalls a phase: a body over ``MAX_BYTES`` or slower than the timeout, more
than ``MAX_SERIES`` kept series, a refused connection, an HTTP error or kept lines the
parser rejects is one row with its reason and no value (ingest counts those rows by reason).  A
server without ``/metrics`` (404) is
told once and not asked again in that phase.
"""

from __future__ import annotations

import csv
import functools
import http.client
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from thermab.errors import HostError

MAX_BYTES = 4 << 20  # vLLM's own /metrics is ~100 kB; more is not a vLLM server's
READ_CHUNK = 64 << 10
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
}
COUNTERS = {
    "vllm:prompt_tokens_total": "prompt_tok_s",
    "vllm:generation_tokens_total": "generation_tok_s",
    "vllm:iteration_tokens_total_count": "engine_steps_s",  # one observation per engine step
}
# speculative decoding's counters, checked together (spec_decode_faults) before their rates are made
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "spec_drafts_s",
    "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens_s",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_s",
}
# a phase whose spec-decode counters cannot be read as rates gets this sensor at the fault's
# time, its value the fault's code, in place of their rates (analysis/speed.py says why)
SPEC_FAULT = "spec_decode_fault"
SPEC_FAULTS = {1: "went back within the phase", 2: "count more accepted than drafted tokens"}
# histograms: (sum, count) -> the mean of the observations made in each interval
HISTOGRAMS = {
    "ttft_mean_s": ("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"),
    "itl_mean_s": ("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count"),
}
# the histograms' means have a value only for an interval in which the server observed one
# (a request's first token, a decode step): no value there is no missing scrape
EVENT_MEANS = frozenset(HISTOGRAMS)
KEPT = set(GAUGES) | set(COUNTERS) | set(SPEC_COUNTERS) | {name for pair in HISTOGRAMS.values() for name in pair}
MEAN_GAUGES = {"kv_cache_usage"}  # a share: averaged over engines, not summed
# a line that is a kept sample: its name (the parser strips the line), then labels or the value
KEPT_LINE = re.compile(r"^[ \t]*(?:{})[{{ \t].*$".format("|".join(map(re.escape, sorted(KEPT)))), re.MULTILINE)
# a series per engine (vLLM labels each engine's): 1024 is 15 kept names of 68 engines; more
# is no vLLM server's, and what MAX_BYTES alone allows would cost the parser seconds (160 µs
# a line measured on 2 busy cores: 0.7 s for 4096 lines, 13 s for a whole 3-MiB body)
MAX_SERIES = 1024


class ScrapeError(HostError):
    """One scrape's failure, the reason its row gives."""


def kept_lines(text: str) -> str:
    """The sample lines of ``text`` that name a kept sample, the rest (comments, buckets,
    the families thermab does not read) left out before the parser sees them: on real vLLM
    that is 9 of 430 samples (docs/benchmarks.md); raises ScrapeError past MAX_SERIES."""
    lines = KEPT_LINE.findall(text)
    if len(lines) > MAX_SERIES:
        raise ScrapeError(f"/metrics has more than {MAX_SERIES} series of the metrics thermab reads")
    return "\n".join(lines)


def parse(text: str) -> dict[str, float]:
    """The kept samples of a Prometheus text exposition, each summed over its labels (the
    KV-cache share averaged); raises ScrapeError on kept lines the parser rejects (what
    thermab does not read is not judged)."""
    totals: dict[str, list[float]] = {}
    seen: set[tuple] = set()
    try:
        for family in text_string_to_metric_families(kept_lines(text)):
            for sample in family.samples:
                series = (sample.name, tuple(sorted(sample.labels.items())))
                if sample.name not in KEPT or series in seen:
                    continue  # a series given twice is one series: its first sample
                seen.add(series)
                # every kept metric counts or measures something: a negative one is no reading
                if math.isfinite(sample.value) and sample.value >= 0:
                    totals.setdefault(sample.name, []).append(sample.value)
    except (ValueError, TypeError, IndexError) as error:
        raise ScrapeError(f"malformed /metrics: {str(error)[:200]}") from None
    return {
        name: (sum(values) / len(values) if GAUGES.get(name) in MEAN_GAUGES else sum(values))
        for name, values in totals.items()
    }


class _Deadline:
    """A connection whose socket is shut at ``deadline`` (``time.monotonic()``), whatever it
    is reading then: the socket's own timeout bounds each read, so a server that trickles
    its headers a byte at a time would hold the scrape for ever without it."""

    def __init__(self, *args, deadline: float, timers: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline, self.timers = deadline, timers

    def connect(self) -> None:
        super().connect()
        timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), _shut, (self.sock,))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # the read in progress returns, the response ends short
    except OSError:
        pass  # closed already


class _HTTPConnection(_Deadline, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Deadline, http.client.HTTPSConnection):
    pass


class _DeadlineHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """urllib's own handling (proxies from the environment, TLS) with connections shut at
    the deadline that the request carries (``watch``: fetch sets it)."""

    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, **req.watch), req)

    def https_open(self, req):
        return self.do_open(functools.partial(_HTTPSConnection, **req.watch), req, context=self._context)


class _DeadlineRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect (older vLLM sent /metrics on to /metrics/) keeps the first request's deadline."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.watch = req.watch
        return new


# one opener for all scrapes: building one is 0.7 ms of CPU, a fifth of a scrape of real vLLM
_OPENER = urllib.request.build_opener(_DeadlineHandler(), _DeadlineRedirects())


def fetch(url: str, timeout_s: float, max_bytes: int = MAX_BYTES) -> str:
    """The body of ``url``, within ``timeout_s`` in all and ``max_bytes``; raises
    ScrapeError saying why not (urllib.error.HTTPError passes through for its status)."""
    deadline = time.monotonic() + timeout_s
    timers: list[threading.Timer] = []
    try:
        request = urllib.request.Request(url)
        request.watch = {"deadline": deadline, "timers": timers}
        with _OPENER.open(request, timeout=timeout_s) as response:
            chunks, size = [], 0
            while True:
                chunk = response.read1(READ_CHUNK)  # what has come
                if time.monotonic() > deadline:  # past it the socket was shut: what came is cut short
                    raise ScrapeError(f"/metrics took longer than {timeout_s:g} s")
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise ScrapeError(f"/metrics larger than {max_bytes} bytes")
    except urllib.error.HTTPError:
        raise
    except (OSError, ValueError, http.client.HTTPException) as error:  # refused, reset, timed out, shut, not HTTP
        if time.monotonic() > deadline:
            raise ScrapeError(f"/metrics took longer than {timeout_s:g} s") from None
        if isinstance(error, http.client.HTTPException):
            raise ScrapeError(f"/metrics gave no HTTP answer: {error!r}"[:300]) from None
        raise ScrapeError(f"/metrics unreachable: {error}") from None
    finally:
        for timer in timers:
            timer.cancel()
    return b"".join(chunks).decode("utf-8", "replace")


class Scraper:
    """Scrapes ``endpoint``/metrics every ``interval_s`` into ``path`` until stopped; use
    as a context manager around the phase's load."""

    def __init__(self, endpoint: str, path: Path, interval_s: float, progress=print):
        self.url = endpoint.rstrip("/") + "/metrics"
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.timeout_s = max(0.5, min(5.0, self.interval_s))
        self.progress = progress
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="server-metrics", daemon=True)
        self.rows = 0

    def __enter__(self) -> Scraper:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(["t", "sensor", "value", "reason"])
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(self.timeout_s + 5)
        self.file.close()

    def scrape(self) -> bool:
        """One scrape, its rows written; False when the server has no /metrics."""
        try:
            samples = parse(fetch(self.url, self.timeout_s))
            rows = [(name, repr(value), "") for name, value in sorted(samples.items())]
            if not rows:
                raise ScrapeError("/metrics has none of vLLM's metrics")
        except urllib.error.HTTPError as error:
            rows = [("", "", f"/metrics answered HTTP {error.code}")]
            if error.code in (404, 405):
                self.progress(
                    f"the server has no /metrics (HTTP {error.code} at {self.url}): no server telemetry this phase"
                )
                self._write(time.time(), rows)
                return False
        except ScrapeError as error:
            rows = [("", "", str(error))]
        except Exception as error:  # a fault of ours or the parser's must not end the phase's scrapes unseen
            first = str(error).splitlines()[0][:200] if str(error) else ""
            rows = [("", "", f"scrape failed: {type(error).__name__}: {first}")]
        self._write(time.time(), rows)
        return True

    def _write(self, t: float, rows) -> None:
        self.writer.writerows([(f"{t:.6f}", *row) for row in rows])
        self.file.flush()
        self.rows += len(rows)

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopped.is_set():
            if not self.scrape():
                return
            next_at = max(next_at + self.interval_s, time.monotonic())
            self.stopped.wait(next_at - time.monotonic())


def _rates(t: np.ndarray, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(midpoints, Δraw, Δt, resets skipped) over consecutive readings of a counter."""
    delta, dt = np.diff(raw), np.diff(t)
    keep = (delta >= 0) & (dt > 0)
    return (t[:-1] + t[1:])[keep] / 2, delta[keep], dt[keep], int((delta < 0).sum())


def spec_decode_fault(wide: pd.DataFrame) -> int:
    """The code (SPEC_FAULTS) of what makes one phase's spec-decode counters unreadable, 0
    when nothing does: ``wide`` has a column per counter, a row per scrape in time order."""
    values = wide.to_numpy(float)
    if (np.diff(values, axis=0) < 0).any():
        return 1
    accepted, drafted = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
    if accepted in wide and drafted in wide and (wide[accepted] > wide[drafted]).any():
        return 2
    return 0


def _spec_rows(frame: pd.DataFrame, notes: dict) -> list[pd.DataFrame]:
    """The spec-decode counters of one phase as rates, or, where they went back or disagree,
    one SPEC_FAULT row and none of their rates: a number made of them would be wrong."""
    parts = []
    for host, rows in frame[frame["sensor"].isin(list(SPEC_COUNTERS))].groupby("host", sort=True):
        wide = rows.pivot_table(index="t", columns="sensor", values="value", aggfunc="last").sort_index()
        fault = spec_decode_fault(wide)
        if fault:
            t = float(wide.index[-1])
            parts.append(pd.DataFrame({"t": [t], "host": host, "sensor": SPEC_FAULT, "value": float(fault)}))
            notes[f"{host}/server: spec-decode counters {SPEC_FAULTS[fault]}: their rates left out"] = 1
            continue
        for name, sensor in SPEC_COUNTERS.items():
            if name in wide:
                series = wide[name].dropna()
                middle, delta, dt, _ = _rates(series.index.to_numpy(float), series.to_numpy(float))
                parts.append(pd.DataFrame({"t": middle, "host": host, "sensor": sensor, "value": delta / dt}))
    return parts


def _readings(part: pd.DataFrame, host: str, notes: dict) -> pd.DataFrame:
    """``part``'s rows whose value is a reading (finite, not negative: a counter that jumped
    by more than a float holds gives an inf rate), the others counted in ``notes``."""
    bad = ~(np.isfinite(part["value"]) & (part["value"] >= 0))
    for sensor, n in part.loc[bad, "sensor"].value_counts().items():
        key = f"{host}/server: {sensor} not a finite reading of at least 0, dropped"
        notes[key] = notes.get(key, 0) + int(n)
    return part[~bad]


@np.errstate(over="ignore", invalid="ignore", divide="ignore")  # such values are dropped, counted
def server_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Tidy rows of scraped samples (t, host, kind, sensor = the metric's name, value) ->
    server telemetry (gauges under short names, counters as rates), and what was left out:
    a value that is no reading (non-finite or negative, docs/design.md) is dropped, counted."""
    notes: dict[str, int] = {}
    parts = []
    for (host, name), series in frame.sort_values("t", kind="stable").groupby(["host", "sensor"], sort=True):
        t, value = series["t"].to_numpy(float), series["value"].to_numpy(float)
        if name in GAUGES:
            parts.append(pd.DataFrame({"t": t, "host": host, "sensor": GAUGES[name], "value": value}))
        elif name in COUNTERS:
            middle, delta, dt, resets = _rates(t, value)
            parts.append(pd.DataFrame({"t": middle, "host": host, "sensor": COUNTERS[name], "value": delta / dt}))
            if resets:
                notes[f"{host}/server: {name} went back (server restarted), interval skipped"] = resets
    parts += _spec_rows(frame, notes)
    for sensor, (sum_name, count_name) in HISTOGRAMS.items():
        for host, rows in frame[frame["sensor"].isin([sum_name, count_name])].groupby("host", sort=True):
            wide = rows.pivot_table(index="t", columns="sensor", values="value", aggfunc="last").dropna()
            if len(wide) < 2 or sum_name not in wide or count_name not in wide:
                continue
            t = wide.index.to_numpy(float)
            count, total = np.diff(wide[count_name].to_numpy(float)), np.diff(wide[sum_name].to_numpy(float))
            observed = (count > 0) & (total >= 0)  # none observed, or a restart: no mean there
            middle = (t[:-1] + t[1:]) / 2
            parts.append(
                pd.DataFrame(
                    {"t": middle[observed], "host": host, "sensor": sensor, "value": total[observed] / count[observed]}
                )
            )
    parts = [_readings(part, part["host"].iloc[0], notes) for part in parts if len(part)]
    if not parts:
        return pd.DataFrame({"t": [], "host": [], "kind": [], "sensor": [], "value": []}), notes
    rows = pd.concat(parts, ignore_index=True).assign(kind="server")
    return rows[["t", "host", "kind", "sensor", "value"]].astype({"t": "float64", "value": "float64"}), notes
