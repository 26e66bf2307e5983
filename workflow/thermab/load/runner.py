"""The load of one phase (a closed loop, a think-time loop or an arrival rate:
``load/shapes.py``): Locust in its own process, then records and a report.

``run_load`` starts ``python -m locust -f thermab/load/locustfile.py --headless ...`` as a
subprocess (importing Locust here would monkey-patch this process with gevent, which hangs
Snakemake), prints a progress line every few seconds while it runs, and afterwards writes,
beside ``out_parquet``:

- ``requests.jsonl``: the locustfile's raw records, one line per request;
- ``load_events.jsonl``: ``load_start``, ``probe_start``, ``probe_end``, ``load_end``;
- ``locust.log``: Locust's own output (unless ``log_path`` says elsewhere);
- ``extra_body.json``: ``load.extra_body``, for the locustfile to merge into each request
  (a file, as nothing large travels on a command line);
- ``out_parquet``: the records with ``order``, ``rep``, ``arm``, ``users`` and ``load_level`` added, in the columns and
  dtypes of docs/design.md's ``tidy/requests.parquet`` plus the stream diagnostics
  ``max_gap_s``, ``stall_gaps``, ``usage_source``, ``token_arrivals``, ``token_chunks`` and
  ``token_span_s``;
- ``validity.json``: whether the load was the load intended (:mod:`thermab.load.validity`);
- ``latency.json``: the window's latency in ``vllm bench serve``'s result keys, with its
  ITL sketch and goodput against ``load.slo`` (:mod:`thermab.load.latency`).

The load window is ``[load_start, load_end)``: from the test start to the moment the run
time ran out. Requests still in flight then finish (within the stop timeout) and are
recorded, but count for throughput only if they end inside the window (docs/design.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from thermab import atomic, cli, load_levels
from thermab.config import (
    Config,
    check_file,
    defaults as schema_defaults,
    extra_body_problem,
    key_problem,
    port_problem,
    redact_url,
    thaw,
)
from thermab.contracts import PhaseValidity, write_validity
from thermab.errors import StageFailed, UserError
from thermab.jsonl import JsonlTail
from thermab.layout import PhaseDir
from thermab.load.latency import SLO_KEYS, window_report
from thermab.load.shapes import Shape
from thermab.load.validity import load_window, summary_line, to_frame, validity_report

# shipped inside the package, so a non-editable install runs the same load
LOCUSTFILE = resources.files("thermab.load") / "locustfile.py"
LOCUST_GRACE_S = 30  # Locust start-up and shutdown, beyond run time and stop timeout
RATE_WINDOW_S = 30  # the progress line's output rate is over this trailing window
WAKEUP_REQUEST_S = 30  # the bound on one wake-up probe (a few tokens) in the run's time limit


LOAD_DEFAULTS = schema_defaults("load")  # the schema's, as every default of the load


@dataclass(frozen=True)
class LoadSpec:
    """What one phase's load is: the owner of the load settings (the config's ``load``
    section and ``timings.load_s``); the locustfile receives them as its options.  Its
    defaults are the schema's."""

    duration_s: int
    users: int = LOAD_DEFAULTS["users"]
    max_tokens: int = LOAD_DEFAULTS["max_tokens"]
    prompt_tokens: int = LOAD_DEFAULTS["prompt_tokens"]
    model: str | None = None
    extra_body: dict = field(default_factory=dict)
    probe: bool = LOAD_DEFAULTS["probe"]
    probe_at_s: float | None = None  # None: load.probe_at (a share) of the duration
    probe_n: int = LOAD_DEFAULTS["probe_n"]
    probe_tokens: int = LOAD_DEFAULTS["probe_tokens"]
    stall_gap_s: float = schema_defaults("analysis")["stall_gap_s"]
    stop_timeout_s: int = 120
    rate: float | None = LOAD_DEFAULTS["rate"]  # an open loop, ``users`` its cap (load/shapes.py)
    burstiness: float = LOAD_DEFAULTS["burstiness"]
    think_s: float | None = LOAD_DEFAULTS["think_s"]
    shape_seed: int = LOAD_DEFAULTS["shape_seed"]
    wakeup_gaps_s: tuple[float, ...] = ()  # wake-up probes after the load (none: empty)
    wakeup_n: int = LOAD_DEFAULTS["wakeup_n"]
    slo: dict | None = None  # load.slo: goodput's bounds in ms (load/latency.py)

    @property
    def wakeup_s(self) -> float:
        """The most the wake-up probes may take: their gaps, and WAKEUP_REQUEST_S a request."""
        # after each gap, and back to back after the first that opens the connection
        requests = self.wakeup_n * (len(self.wakeup_gaps_s) + 1) + 1 if self.wakeup_gaps_s else 0
        return self.wakeup_n * sum(self.wakeup_gaps_s) + requests * WAKEUP_REQUEST_S

    @property
    def shape(self) -> Shape:
        return Shape(self.users, self.rate, self.burstiness, self.think_s, self.shape_seed)

    @property
    def level(self) -> load_levels.Level:
        """The level of load this is (its label names it in every table)."""
        shape = {"rate": self.rate, "burstiness": self.burstiness, "think_s": self.think_s}
        return load_levels.Level(self.users, **load_levels.run_shape(shape))

    def at(self, level: load_levels.Level) -> LoadSpec:
        """This load at ``level`` (one of a run of levels): its users and its own shape."""
        return dataclasses.replace(self, users=level.users, **level.shape)

    @classmethod
    def from_config(cls, config: Config, model: str | None = None) -> LoadSpec:
        load, duration = config.load, config.timings.load_s
        return cls(
            duration_s=int(duration),
            users=thaw(load.users),  # a run of levels: the list, until ``at`` picks one
            max_tokens=load.max_tokens,
            prompt_tokens=load.prompt_tokens,
            model=load.model or model,
            extra_body=thaw(load.extra_body) or {},  # written out as JSON for the locustfile
            probe=load.probe,
            probe_at_s=load.probe_at * duration,
            probe_n=load.probe_n,
            probe_tokens=load.probe_tokens,
            stall_gap_s=config.analysis.stall_gap_s,
            rate=load.rate,
            burstiness=load.burstiness,
            think_s=load.think_s,
            shape_seed=load.shape_seed,
            wakeup_gaps_s=tuple(load.wakeup_gaps_s or ()),
            wakeup_n=load.wakeup_n,
            slo=thaw(load.slo),
        )

    def locust_args(self) -> list[str]:
        """The locustfile's own options for this load: an open loop is one Locust user, the
        dispatcher of its arrivals, with ``users`` its cap."""
        spawned = 1 if self.rate else self.users
        args = [
            "-u",
            str(spawned),
            "-r",
            str(spawned),
            "--run-time",
            f"{self.duration_s}s",
            "--stop-timeout",
            f"{self.stop_timeout_s}s",
            "--max-tokens",
            str(self.max_tokens),
            "--prompt-tokens",
            str(self.prompt_tokens),
            "--stall-gap-s",
            str(self.stall_gap_s),
            "--probe-n",
            str(self.probe_n if self.probe else 0),
            "--probe-tokens",
            str(self.probe_tokens),
            "--shape-seed",
            str(self.shape_seed),
        ]
        if self.rate:
            args += ["--rate", repr(float(self.rate)), "--burstiness", repr(float(self.burstiness))]
            args += ["--max-inflight", str(self.users)]
        if self.think_s:
            args += ["--think-s", repr(float(self.think_s))]
        if self.wakeup_gaps_s:
            args += ["--wakeup-gaps", ",".join(repr(float(gap)) for gap in self.wakeup_gaps_s)]
            args += ["--wakeup-n", str(self.wakeup_n)]
        if self.model:
            args.append(f"--model={self.model}")  # one word: a name starting with '-' is no option
        if self.probe_at_s is not None:
            args += ["--probe-at", str(self.probe_at_s)]
        return args


def locust_command(url, records, events, spec: LoadSpec, tag_prefix, locustfile=None, extra_body_file=None):
    """The Locust command line; ``extra_body_file`` holds ``spec.extra_body`` (the caller writes it)."""
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(locustfile or LOCUSTFILE),
        "--headless",
        "--only-summary",
        "--host",
        url,
        # Failed requests are data here, in the records; a non-zero exit means Locust broke.
        "--exit-code-on-error",
        "0",
        "--records-out",
        str(records),
        "--events-out",
        str(events),
        "--tag-prefix",
        tag_prefix,
        *spec.locust_args(),
        *(["--extra-body-file", str(extra_body_file)] if extra_body_file else []),
    ]


def progress_line(records, elapsed_s, duration_s, now, hint=""):
    load = [r for r in records if r["kind"] == "load"]
    ok = [r for r in load if r["ok"]]
    window = min(RATE_WINDOW_S, max(elapsed_s, 1.0))
    recent_tokens = sum(r["completion_tokens"] for r in ok if r["t_end"] >= now - window)
    left = f"{duration_s - elapsed_s:.0f} s left" if elapsed_s < duration_s else "finishing in-flight requests"
    probes = sum(r["kind"] == "probe" for r in records)
    line = (
        f"load {elapsed_s:.0f}/{duration_s:.0f} s ({left})  requests {len(ok)} ok, {len(load) - len(ok)} failed"
        f"  {recent_tokens / window:.1f} output tok/s (last {window:.0f} s)  probes {probes}"
    )
    return f"{line}  | {hint}" if hint else line


def run_load(
    url,
    out_parquet,
    spec: LoadSpec,
    *,
    order,
    rep,
    arm,
    log_path=None,
    progress=None,
    status_hint=None,
    progress_every_s=5.0,
    locustfile=None,
    interlock=None,
    interlock_every_s=1.0,
) -> PhaseValidity:
    """Run one phase's load against ``url`` and return its validity report (see module doc).

    Single-stream mode: ``LoadSpec(users=1, probe=False, ...)``.
    ``progress(line)`` receives the progress lines (default: stderr); ``status_hint()`` may
    return a short string appended to each (the workflow shows the head's hottest zone).
    ``interlock()`` is asked every ``interlock_every_s``: a non-empty answer (the reason)
    stops Locust at once; the records so far are still written, then ``LoadAborted`` is
    raised with the reason.
    """
    out_parquet = Path(out_parquet)
    out_parquet.parent.mkdir(parents=True, exist_ok=True)
    files = PhaseDir(out_parquet.parent)
    records_path, events_path = files.records, files.marks
    log_path = Path(log_path) if log_path else out_parquet.parent / "locust.log"
    for stale in (records_path, events_path):
        stale.unlink(missing_ok=True)  # the locustfile appends; a rerun must not mix attempts
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    # The level keeps the next level's window on the same server, and the clock time a rerun
    # of the same phase, from sharing prefixes with the last; the level first, so that it
    # falls in the prompt's first 16-token cache block (after the chat template and the
    # user's number: the clock's minutes may not, and two windows share one minute).
    tag_prefix = f"{spec.level.slug}-{time.strftime('%H%M%S')}-{order}-rep{rep}-{arm}"
    files.extra_body.write_text(json.dumps(spec.extra_body or {}, allow_nan=False) + "\n")
    command = locust_command(url, records_path, events_path, spec, tag_prefix, locustfile, files.extra_body)
    tail = JsonlTail(records_path)
    duration_s = spec.duration_s
    exit_code, aborted = _supervise(
        command,
        log_path,
        duration_s + spec.stop_timeout_s + LOCUST_GRACE_S + spec.wakeup_s,
        lambda elapsed: progress(progress_line(tail.poll(), elapsed, duration_s, time.time(), _hint(status_hint))),
        progress_every_s,
        interlock,
        interlock_every_s,
    )
    records, events = tail.poll(), JsonlTail(events_path).poll()
    if not records and exit_code != 0:
        raise StageFailed(
            f"locust exited with code {exit_code} and recorded nothing; see {log_path}:\n" + _log_tail(log_path)
        )

    frame = to_frame(records, order=order, rep=rep, arm=arm, users=spec.users, load_level=spec.level.label)
    window = load_window(events, frame, duration_s)
    with atomic.replacing(out_parquet) as temporary:
        frame.to_parquet(temporary, engine="pyarrow", index=False)
    report: PhaseValidity = {
        "order": order,
        "rep": rep,
        "arm": arm,
        "url": redact_url(url),
        "users": spec.users,
        "load_level": spec.level.label,
        "duration_s": duration_s,
        "locust_exit_code": exit_code,
        "events": events,
        **validity_report(
            frame,
            window,
            users=spec.users,
            max_tokens=spec.max_tokens,
            prompt_tokens=spec.prompt_tokens,
            probe_n=spec.probe_n if spec.probe else 0,
            stall_gap_s=spec.stall_gap_s,
            shape=spec.shape,
        ),
    }
    if aborted:
        report["aborted"] = aborted
        report["warnings"].append(f"load aborted: {aborted}")
    elif exit_code != 0 or not report["requests"]["load"]:
        # the cause is in Locust's own output: its last error line is shown here too
        what = f"locust exited with code {exit_code}" if exit_code else "no load request was recorded"
        report["warnings"].append(f"{what}: {_log_cause(log_path)} (see {log_path})")
    write_validity(files.validity, report)
    keys = {key: report[key] for key in ("order", "rep", "arm", "users", "load_level")}
    latency = {**keys, **window_report(records, *window, spec.slo)}
    atomic.write_text(files.latency, json.dumps(latency, indent=2, allow_nan=False) + "\n")
    progress(summary_line(report))
    for warning in report["warnings"]:
        progress(f"  warning: {warning}")
    if aborted:
        raise LoadAborted(aborted)
    return report


class LoadAborted(StageFailed):
    """The interlock stopped the load; the message says why."""


def _supervise(command, log_path, limit_s, tick, every_s, interlock=None, interlock_every_s=1.0):
    """Run ``command`` with its output in ``log_path``, calling ``tick(elapsed)`` every
    ``every_s`` and ``interlock()`` every ``interlock_every_s``; stop it (SIGTERM, then
    SIGKILL) past ``limit_s``, when the interlock answers, or on any exception.
    Returns (exit code, the interlock's reason or None)."""
    started = time.monotonic()
    poll_s = min(every_s, interlock_every_s) if interlock else every_s
    next_tick = started + every_s
    with _open_log(log_path) as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while True:
                try:
                    return process.wait(timeout=poll_s), None
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > limit_s:
                        raise StageFailed(
                            f"locust (pid {process.pid}) still running after {elapsed:.0f} s, "
                            f"past its {limit_s:.0f} s bound; stopped it: {_log_cause(log_path)} "
                            f"(see {log_path})"
                        ) from None
                    reason = interlock() if interlock else None
                    if reason:
                        return _stop_now(process), reason
                    if time.monotonic() >= next_tick:
                        next_tick += every_s
                        tick(elapsed)
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _stop_now(process, grace_s=1.0):
    """Stop Locust without waiting for its --stop-timeout: SIGTERM, then SIGKILL."""
    process.terminate()
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _hint(status_hint):
    if status_hint is None:
        return ""
    try:
        return status_hint()
    except Exception as exc:  # a display aid: a failing reading must not stop the load
        return f"status hint failed: {exc!r}"


def _log_tail(path, lines=20):
    try:
        return redact_url("\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:]))
    except OSError as exc:
        return f"(log unreadable: {exc})"


# an exception's line in a log: its class (dotted, ending Error, Exception or Exit) and message
EXCEPTION_LINE = re.compile(r"\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Failure)\b.*")


def _log_cause(path) -> str:
    """The last exception line of a log, else its last line, one line and at most 300
    characters, a URL's password hidden."""
    lines = [line.strip() for line in _log_tail(path, 200).splitlines() if line.strip()]
    causes = [line for line in lines if EXCEPTION_LINE.fullmatch(line)]
    cause = (causes or lines or ["the log is empty"])[-1]
    return cause if len(cause) <= 300 else cause[:299] + "…"


def _open_log(path: Path):
    """``path`` opened for Locust's output, or a UserError naming it: opened without
    blocking (a FIFO with no reader would wait forever), and only a regular file taken."""
    if os.path.lexists(path):
        check_file(path, sys.maxsize)  # a FIFO, a device, a directory: named
    try:  # and one made meanwhile cannot block the open
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY, 0o644)
    except OSError as error:
        raise UserError(f"{path}: cannot write the load's log: {error.strerror}") from None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "w")


def _extra_body_arg(text):
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    problem = extra_body_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _url(text):
    """An argparse type: a server base URL the load can reach (http(s), a host, a port
    1-65535); a user and password are allowed (never shown)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{redact_url(text)!r} is not a URL: {error}") from None
    problem = (
        "must start with http:// or https://"
        if parts.scheme not in ("http", "https")
        else "has no host"
        if not parts.hostname
        else port_problem(port)
        if port is not None
        else None
    )
    if problem:
        raise argparse.ArgumentTypeError(f"{redact_url(text)!r}: {problem}")
    return text


def _seconds(text):
    """An argparse type: a finite number of seconds, not negative."""
    value = cli.decimal(text, float)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds, at least 0")
    return value


def _gaps(text):
    """An argparse type: ``0.001,0.1,1`` as ``load.wakeup_gaps_s`` takes it."""
    gaps = [cli.decimal(part.strip(), float) for part in text.split(",")]
    problem = key_problem(("load", "wakeup_gaps_s"), gaps)
    if problem or any(later <= earlier for earlier, later in zip(gaps, gaps[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"{problem or 'not strictly ascending'} (as config key 'load.wakeup_gaps_s')")
    return tuple(gaps)


def _slo(text):
    """``--slo``: KEY=MS pairs, comma-separated, each key one of load.slo's."""
    slo = {}
    for pair in text.split(","):
        key, _, value = pair.partition("=")
        key = key.strip()
        if key not in SLO_KEYS:
            raise argparse.ArgumentTypeError(f"{key!r} is none of {', '.join(SLO_KEYS)} (as config key 'load.slo')")
        slo[key] = cli.as_key("load", "slo", key, parse=float)(value)
    return slo


def main(argv=None):
    defaults = LoadSpec(duration_s=0)
    parser = cli.parser(
        "load",
        "Streaming load (closed loop, think-time loop or open-loop arrivals) on an OpenAI-compatible\n"
        "server: writes requests.parquet and validity.json (and the raw records, load events and\n"
        "Locust's log beside them).",
    )
    parser.add_argument("url", type=_url, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, required=True, help="requests.parquet to write (the rest goes beside it)")
    parser.add_argument("--order", type=cli.as_key("order", parse=str), default="AB", help="the run's order, recorded")
    parser.add_argument("--rep", type=cli.as_key("repeats"), default=1, help="the repeat, recorded")
    parser.add_argument("--arm", type=cli.as_key("order", parse=str), default="A", help="the arm letter, recorded")
    parser.add_argument(
        "--users",
        type=cli.as_key("load", "users"),
        default=defaults.users,
        help="closed-loop slots (requests always in flight); with --rate the cap on requests in flight",
    )
    parser.add_argument("--duration", type=cli.as_key("timings", "load_s"), required=True, help="load seconds")
    parser.add_argument(
        "--max-tokens", type=cli.as_key("load", "max_tokens"), default=defaults.max_tokens, help="tokens per response"
    )
    parser.add_argument(
        "--prompt-tokens",
        type=cli.as_key("load", "prompt_tokens"),
        default=defaults.prompt_tokens,
        help="tokens per prompt",
    )
    parser.add_argument("--model", help="the model to ask (default: the first id of /v1/models)")
    parser.add_argument(
        "--extra-body", type=_extra_body_arg, default={}, help='JSON object, e.g. \'{"reasoning_effort": "low"}\''
    )
    parser.add_argument("--no-probe", action="store_true", help="no single-stream probe (single-stream mode)")
    parser.add_argument("--probe-at", type=_seconds, help="seconds from the start (default: 60%% of the duration)")
    parser.add_argument(
        "--probe-n", type=cli.as_key("load", "probe_n"), default=defaults.probe_n, help="single-stream probe requests"
    )
    parser.add_argument(
        "--probe-tokens",
        type=cli.as_key("load", "probe_tokens"),
        default=defaults.probe_tokens,
        help="tokens per probe response",
    )
    parser.add_argument(
        "--stall-gap-s",
        type=cli.as_key("analysis", "stall_gap_s", parse=float),
        default=defaults.stall_gap_s,
        help="an inter-token gap at least this long counts as a stall",
    )
    parser.add_argument(
        "--stop-timeout",
        type=lambda text: int(_seconds(text)),
        default=defaults.stop_timeout_s,
        help="seconds in-flight requests get to finish",
    )
    parser.add_argument(
        "--rate",
        type=cli.as_key("load", "rate", parse=float),
        help="an open loop: requests per second (Poisson, or gamma with --burstiness); --users is its cap in flight",
    )
    parser.add_argument(
        "--burstiness",
        type=cli.as_key("load", "burstiness", parse=float),
        default=defaults.burstiness,
        help="the gamma shape of the arrival gaps with --rate (1: Poisson; below 1 burstier)",
    )
    parser.add_argument(
        "--think-s", type=cli.as_key("load", "think_s", parse=float), help="mean think time of each user (exponential)"
    )
    parser.add_argument(
        "--shape-seed",
        type=cli.as_key("load", "shape_seed"),
        default=defaults.shape_seed,
        help="the seed of the drawn arrivals and think times (the same in every arm)",
    )
    parser.add_argument(
        "--wakeup-gaps",
        type=_gaps,
        default=(),
        help="wake-up probes after the load: idle gaps in seconds, comma-separated, ascending",
    )
    parser.add_argument(
        "--wakeup-n", type=cli.as_key("load", "wakeup_n"), default=defaults.wakeup_n, help="probes per wake-up gap"
    )
    parser.add_argument(
        "--slo",
        type=_slo,
        help="goodput's bounds in ms, e.g. ttft_ms=500,tpot_ms=50 (any of ttft_ms, tpot_ms, e2el_ms)",
    )
    parser.add_argument("--log", type=Path, help="Locust's output (default: locust.log beside --out)")
    parser.add_argument("--locustfile", type=Path, help=f"the Locust file to run (default: {LOCUSTFILE})")
    args = parser.parse_args(argv)
    if args.rate is not None and args.think_s is not None:
        parser.error("--think-s belongs to a loop of users, --rate makes an open loop: give one")
    if load_levels.burstiness_problem({"rate": args.rate, "burstiness": args.burstiness}, "load", "the load"):
        parser.error(f"argument --burstiness: {args.burstiness:g} shapes the gaps between arrivals of --rate: give one")
    spec = LoadSpec(
        duration_s=args.duration,
        users=args.users,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        model=args.model,
        extra_body=args.extra_body,
        probe=not args.no_probe,
        probe_at_s=args.probe_at,
        probe_n=args.probe_n,
        probe_tokens=args.probe_tokens,
        stall_gap_s=args.stall_gap_s,
        stop_timeout_s=args.stop_timeout,
        rate=args.rate,
        burstiness=args.burstiness,
        think_s=args.think_s,
        shape_seed=args.shape_seed,
        wakeup_gaps_s=args.wakeup_gaps,
        wakeup_n=args.wakeup_n,
        slo=args.slo,
    )
    report = run_load(
        args.url,
        args.out,
        spec,
        order=args.order,
        rep=args.rep,
        arm=args.arm,
        log_path=args.log,
        locustfile=args.locustfile,
    )
    print(json.dumps(report, indent=2))
    return 0 if report["requests"]["load_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
