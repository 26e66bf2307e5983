"""The closed-loop load of one phase: Locust in its own process, then records and a report.

``run_load`` starts ``python -m locust -f thermab/load/locustfile.py --headless ...`` as a
subprocess (importing Locust here would monkey-patch this process with gevent, which hangs
Snakemake), prints a progress line every few seconds while it runs, and afterwards writes,
beside ``out_parquet``:

- ``requests.jsonl``: the locustfile's raw records, one line per request;
- ``load_events.jsonl``: ``load_start``, ``probe_start``, ``probe_end``, ``load_end``;
- ``locust.log``: Locust's own output (unless ``log_path`` says elsewhere);
- ``extra_body.json``: ``load.extra_body``, for the locustfile to merge into each request
  (a file, as nothing large travels on a command line);
- ``out_parquet``: the records with ``order``, ``rep``, ``arm`` and ``users`` added, in the columns and
  dtypes of docs/design.md's ``tidy/requests.parquet`` plus the stream diagnostics
  ``max_gap_s``, ``stall_gaps``, ``usage_source``, ``token_arrivals`` and ``token_span_s``;
- ``validity.json``: whether the load was the load intended (:mod:`thermab.load.validity`).

The load window is ``[load_start, load_end)``: from the test start to the moment the run
time ran out. Requests still in flight then finish (within the stop timeout) and are
recorded, but count for throughput only if they end inside the window (docs/design.md).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from thermab.config import DECIMAL_FLOAT, DECIMAL_INT, defaults as schema_defaults, extra_body_problem, key_problem
from thermab.contracts import PhaseValidity, write_validity
from thermab.errors import StageFailed
from thermab.jsonl import JsonlTail
from thermab.layout import PhaseDir
from thermab.load.validity import load_window, summary_line, to_frame, validity_report

# shipped inside the package, so a non-editable install runs the same load
LOCUSTFILE = resources.files("thermab.load") / "locustfile.py"
LOCUST_GRACE_S = 30  # Locust start-up and shutdown, beyond run time and stop timeout
RATE_WINDOW_S = 30  # the progress line's output rate is over this trailing window


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

    @classmethod
    def from_config(cls, config: dict, model: str | None = None) -> LoadSpec:
        load, duration = config["load"], config["timings"]["load_s"]
        return cls(
            duration_s=int(duration),
            users=load["users"],
            max_tokens=load["max_tokens"],
            prompt_tokens=load["prompt_tokens"],
            model=load["model"] or model,
            extra_body=load["extra_body"] or {},
            probe=load["probe"],
            probe_at_s=load["probe_at"] * duration,
            probe_n=load["probe_n"],
            probe_tokens=load["probe_tokens"],
            stall_gap_s=config["analysis"]["stall_gap_s"],
        )

    def locust_args(self) -> list[str]:
        """The locustfile's own options for this load."""
        args = [
            "-u",
            str(self.users),
            "-r",
            str(self.users),
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
        ]
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
    tag_prefix = f"u{spec.users}-{time.strftime('%H%M%S')}-{order}-rep{rep}-{arm}"
    files.extra_body.write_text(json.dumps(spec.extra_body or {}, allow_nan=False) + "\n")
    command = locust_command(url, records_path, events_path, spec, tag_prefix, locustfile, files.extra_body)
    tail = JsonlTail(records_path)
    duration_s = spec.duration_s
    exit_code, aborted = _supervise(
        command,
        log_path,
        duration_s + spec.stop_timeout_s + LOCUST_GRACE_S,
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

    frame = to_frame(records, order=order, rep=rep, arm=arm, users=spec.users)
    frame.to_parquet(out_parquet, engine="pyarrow", index=False)
    report: PhaseValidity = {
        "order": order,
        "rep": rep,
        "arm": arm,
        "url": url,
        "users": spec.users,
        "duration_s": duration_s,
        "locust_exit_code": exit_code,
        "events": events,
        **validity_report(
            frame,
            load_window(events, frame, duration_s),
            users=spec.users,
            max_tokens=spec.max_tokens,
            prompt_tokens=spec.prompt_tokens,
            probe_n=spec.probe_n if spec.probe else 0,
            stall_gap_s=spec.stall_gap_s,
        ),
    }
    if aborted:
        report["aborted"] = aborted
        report["warnings"].append(f"load aborted: {aborted}")
    elif exit_code != 0:
        report["warnings"].append(f"locust exited with code {exit_code}; see {log_path}")
    write_validity(files.validity, report)
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
    with open(log_path, "w") as log:
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
                            f"past its {limit_s:.0f} s bound; stopped it. See {log_path}"
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
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _extra_body_arg(text):
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    problem = extra_body_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _as_key(*path, parse=int):
    """An argparse type: the option's text parsed, and taken only where the config key it
    stands for (``path``) would take it (the schema's bounds, finite)."""

    def convert(text):
        value = text if parse is str else _number(text, parse)
        problem = key_problem(path, value)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem} (as config key '{'.'.join(path)}')")
        return value

    return convert


def _number(text, parse):
    """``text`` as a plain decimal number, as the config reads one (not 1_0, 0x10 or nan)."""
    try:
        if DECIMAL_INT.fullmatch(text) or (parse is float and DECIMAL_FLOAT.fullmatch(text)):
            return parse(text)
    except ValueError:  # YAML's .inf and .nan, which Python does not read
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not a plain decimal {'whole ' if parse is int else ''}number")


def _seconds(text):
    """An argparse type: a finite number of seconds, not negative."""
    value = _number(text, float)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds, at least 0")
    return value


def main(argv=None):
    defaults = LoadSpec(duration_s=0)
    parser = argparse.ArgumentParser(
        prog="thermab load",
        description="Closed-loop streaming load on an OpenAI-compatible server: requests.parquet and validity.json.",
    )
    parser.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, required=True, help="requests.parquet to write (the rest goes beside it)")
    parser.add_argument("--order", type=_as_key("order", parse=str), default="AB")
    parser.add_argument("--rep", type=_as_key("repeats"), default=1)
    parser.add_argument("--arm", type=_as_key("order", parse=str), default="A")
    parser.add_argument(
        "--users",
        type=_as_key("load", "users"),
        default=defaults.users,
        help="closed-loop slots (requests always in flight)",
    )
    parser.add_argument("--duration", type=_as_key("timings", "load_s"), required=True, help="load seconds")
    parser.add_argument("--max-tokens", type=_as_key("load", "max_tokens"), default=defaults.max_tokens)
    parser.add_argument("--prompt-tokens", type=_as_key("load", "prompt_tokens"), default=defaults.prompt_tokens)
    parser.add_argument("--model", help="default: the first id of /v1/models")
    parser.add_argument(
        "--extra-body", type=_extra_body_arg, default={}, help='JSON object, e.g. \'{"reasoning_effort": "low"}\''
    )
    parser.add_argument("--no-probe", action="store_true", help="no single-stream probe (single-stream mode)")
    parser.add_argument("--probe-at", type=_seconds, help="seconds from the start (default: 60%% of the duration)")
    parser.add_argument("--probe-n", type=_as_key("load", "probe_n"), default=defaults.probe_n)
    parser.add_argument("--probe-tokens", type=_as_key("load", "probe_tokens"), default=defaults.probe_tokens)
    parser.add_argument(
        "--stall-gap-s", type=_as_key("analysis", "stall_gap_s", parse=float), default=defaults.stall_gap_s
    )
    parser.add_argument(
        "--stop-timeout",
        type=lambda text: int(_seconds(text)),
        default=defaults.stop_timeout_s,
        help="seconds in-flight requests get to finish",
    )
    parser.add_argument("--log", type=Path, help="Locust's output (default: locust.log beside --out)")
    parser.add_argument("--locustfile", type=Path, help=f"default: {LOCUSTFILE}")
    args = parser.parse_args(argv)
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
