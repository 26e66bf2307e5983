"""The closed-loop load of one phase: Locust in its own process, then records and a report.

``run_load`` starts ``python -m locust -f scripts/locustfile.py --headless ...`` as a
subprocess (importing Locust here would monkey-patch this process with gevent, which hangs
Snakemake), prints a progress line every few seconds while it runs, and afterwards writes,
beside ``out_parquet``:

- ``requests.jsonl``: the locustfile's raw records, one line per request;
- ``load_events.jsonl``: ``load_start``, ``probe_start``, ``probe_end``, ``load_end``;
- ``locust.log``: Locust's own output (unless ``log_path`` says elsewhere);
- ``out_parquet``: the records with ``order``, ``rep`` and ``arm`` added, in the columns and
  dtypes of DESIGN.md's ``tidy/requests.parquet`` plus the stream diagnostics
  ``max_gap_s``, ``stall_gaps`` and ``usage_source``;
- ``validity.json``: whether the load was the load intended (``validity_report``).

The load window is ``[load_start, load_end)``: from the test start to the moment the run
time ran out. Requests still in flight then finish (within the stop timeout) and are
recorded, but count for throughput only if they end inside the window (DESIGN.md).
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

LOCUSTFILE = Path(__file__).resolve().parents[2] / "scripts" / "locustfile.py"
COLUMNS = {  # DESIGN.md's tidy/requests.parquet, then the stream diagnostics
    "order": "string",
    "rep": "int64",
    "arm": "string",
    "kind": "string",
    "user": "int64",
    "tag": "string",
    "t_start": "float64",
    "t_first_token": "float64",
    "t_end": "float64",
    "prompt_tokens": "Int64",
    "completion_tokens": "Int64",
    "cached_tokens": "Int64",
    "ok": "bool",
    "error": "string",
    "max_gap_s": "float64",
    "stall_gaps": "int64",
    "usage_source": "string",
}
LOCUST_GRACE_S = 30  # Locust start-up and shutdown, beyond run time and stop timeout
RATE_WINDOW_S = 30  # the progress line's output rate is over this trailing window
SATURATED_SHARE = 0.95  # mean in-flight below this share of the users means an unsaturated loop
PROMPT_TOLERANCE = 0.10  # measured prompt size this far from the target is reported


def locust_command(url, records, events, *, users, duration_s, stop_timeout_s, max_tokens, prompt_tokens,
                   model, extra_body, tag_prefix, probe, probe_at, probe_n, probe_tokens, stall_gap_s, locustfile):
    command = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--only-summary",
        "--host", url, "-u", str(users), "-r", str(users),
        "--run-time", f"{int(duration_s)}s", "--stop-timeout", f"{int(stop_timeout_s)}s",
        # Failed requests are data here, in the records; a non-zero exit means Locust broke.
        "--exit-code-on-error", "0",
        "--records-out", str(records), "--events-out", str(events), "--tag-prefix", tag_prefix,
        "--max-tokens", str(max_tokens), "--prompt-tokens", str(prompt_tokens),
        "--extra-body", json.dumps(extra_body or {}), "--stall-gap-s", str(stall_gap_s),
        "--probe-n", str(probe_n if probe else 0), "--probe-tokens", str(probe_tokens),
    ]
    if model:
        command += ["--model", model]
    if probe_at is not None:
        command += ["--probe-at", str(probe_at)]
    return command


class JsonlTail:
    """The complete lines so far of a JSONL file another process is appending to. A line
    still being written (or cut short by a crash) waits for its newline."""

    def __init__(self, path):
        self.path = Path(path)
        self.offset = 0
        self.rows = []

    def poll(self):
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return self.rows
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.rows.extend(json.loads(line) for line in complete.splitlines() if line.strip())
        return self.rows


def progress_line(records, elapsed_s, duration_s, now, hint=""):
    load = [r for r in records if r["kind"] == "load"]
    ok = [r for r in load if r["ok"]]
    window = min(RATE_WINDOW_S, max(elapsed_s, 1.0))
    recent_tokens = sum(r["completion_tokens"] for r in ok if r["t_end"] >= now - window)
    left = f"{duration_s - elapsed_s:.0f} s left" if elapsed_s < duration_s else "finishing in-flight requests"
    probes = sum(r["kind"] == "probe" for r in records)
    line = (f"load {elapsed_s:.0f}/{duration_s:.0f} s ({left})  requests {len(ok)} ok, {len(load) - len(ok)} failed"
            f"  {recent_tokens / window:.1f} output tok/s (last {window:.0f} s)  probes {probes}")
    return f"{line}  | {hint}" if hint else line


def to_frame(records, *, order, rep, arm):
    frame = pd.DataFrame.from_records(records, columns=[c for c in COLUMNS if c not in ("order", "rep", "arm")])
    frame.insert(0, "order", order)
    frame.insert(1, "rep", rep)
    frame.insert(2, "arm", arm)
    return frame.astype(COLUMNS).sort_values("t_start", kind="stable").reset_index(drop=True)


def load_window(events, frame, duration_s):
    """``[load_start, load_end)`` from the locustfile's marks; from the first request and
    the duration when a mark is missing (a Locust that died early)."""
    marks = {e["event"]: e["t"] for e in events}
    start = marks.get("load_start", frame["t_start"].min() if len(frame) else np.nan)
    return start, marks.get("load_end", start + duration_s)


def inflight(frame, start, end, users):
    """Time-weighted mean number of requests in flight over [start, end), and the share of
    that time at least ``users`` were."""
    starts = frame["t_start"].clip(start, end).to_numpy()
    ends = frame["t_end"].clip(start, end).to_numpy()
    length = end - start
    if not length > 0:  # also NaN: no window to weigh over
        return np.nan, np.nan
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.argsort(times, kind="stable")
    level = np.cumsum(steps[order])
    held = np.diff(np.append(times[order], end))
    return float((ends - starts).sum() / length), float(held[level >= users].sum() / length)


def _number(value, digits=3):
    """A JSON-friendly number: None for NaN/NA, plain int or rounded float otherwise."""
    if value is None or pd.isna(value):
        return None
    if float(value).is_integer():
        return int(value)
    return round(float(value), digits)


def _counts(series):
    return {str(key): int(n) for key, n in series.value_counts().items()}


def error_category(error):
    """Failure texts start with a fixed category before the first ': '."""
    return error.split(": ", 1)[0]


def validity_report(frame, window, *, users, max_tokens, prompt_tokens, probe_n, stall_gap_s):
    """Was this the load intended? Facts with their n, then ``warnings`` in words."""
    start, end = window
    length = end - start
    load = frame[frame["kind"] == "load"]
    ok_load = load[load["ok"]]
    probe = frame[frame["kind"] == "probe"]
    ok_probe = probe[probe["ok"]]
    failed = frame[~frame["ok"]]
    in_window = ok_load[(ok_load["t_end"] >= start) & (ok_load["t_end"] < end)]
    measured_prompt = load["prompt_tokens"].dropna()
    mean_inflight, share_at_users = inflight(load, start, end, users)
    decode = (ok_probe["completion_tokens"] - 1) / (ok_probe["t_end"] - ok_probe["t_first_token"])
    report = {
        "window": {"start": _number(start, 3), "end": _number(end, 3), "s": _number(length)},
        "requests": {
            "load": len(load), "load_ok": len(ok_load), "probe": len(probe), "probe_ok": len(ok_probe),
            "started_after_end": int((frame["t_start"] >= end).sum()),
            "ended_after_end": int((frame["t_end"] >= end).sum()),
        },
        "errors": {
            "n": len(failed),
            "by_category": _counts(failed["error"].map(error_category)),
            "first": failed["error"].iloc[0] if len(failed) else None,
            "last_ok_end_s": _number(ok_load["t_end"].max() - start) if len(ok_load) else None,
        },
        "full_length": {
            "max_tokens": max_tokens,
            "share_of_ok_load": _number((ok_load["completion_tokens"] == max_tokens).mean()) if len(ok_load) else None,
        },
        "cached": {
            "load_with_cached_tokens": int((load["cached_tokens"].fillna(0) > 0).sum()),
            "load_reporting_cached_tokens": int(load["cached_tokens"].notna().sum()),
        },
        "concurrency": {
            "users": users,
            "inflight_mean": _number(mean_inflight),
            "share_of_window_at_users": _number(share_at_users),
        },
        "gaps": {
            "stall_gap_s": stall_gap_s,
            "max_gap_s": _number(frame["max_gap_s"].max()),
            "stall_gaps": int(frame["stall_gaps"].sum()),
            "requests_with_stalls": int((frame["stall_gaps"] > 0).sum()),
        },
        "prompt_tokens": {
            "target": prompt_tokens,
            "n": len(measured_prompt),
            "median": _number(measured_prompt.median()),
            "min": _number(measured_prompt.min()),
            "max": _number(measured_prompt.max()),
            "median_over_target": _number(measured_prompt.median() / prompt_tokens),
        },
        "usage_source": _counts(frame["usage_source"]),
        "throughput": {
            "requests_completed": len(in_window),
            "output_tokens": int(in_window["completion_tokens"].sum()),
            "output_tok_s": _number(in_window["completion_tokens"].sum() / length if length > 0 else np.nan),
        },
        "probe": {"n": len(probe), "ok": len(ok_probe), "decode_tok_s_median": _number(decode.median())},
    }
    report["warnings"] = warnings(report, probe_n)
    return report


def warnings(report, probe_n):
    """What in ``report`` makes the phase suspect, in words a reader can act on."""
    out = []
    req, errors, conc = report["requests"], report["errors"], report["concurrency"]
    if req["load_ok"] == 0:
        out.append("no load request succeeded: is the server up and serving the model?")
    if errors["n"]:
        categories = ", ".join(f"{k}: {v}" for k, v in errors["by_category"].items())
        last_ok = errors["last_ok_end_s"]
        when = f"; the last successful load request ended {last_ok} s into the window" if last_ok is not None else ""
        out.append(f"{errors['n']} of {req['load'] + req['probe']} requests failed ({categories}){when}; "
                   f"first: {errors['first']}")
    share = report["full_length"]["share_of_ok_load"]
    if share is not None and share < 1:
        out.append(f"only {share:.1%} of successful load requests returned max_tokens="
                   f"{report['full_length']['max_tokens']} tokens: the server ignored ignore_eos or max_tokens")
    if report["cached"]["load_with_cached_tokens"]:
        out.append(f"{report['cached']['load_with_cached_tokens']} load requests hit the prefix cache: "
                   "the prompts are not unique from their first tokens")
    if conc["inflight_mean"] is not None and conc["inflight_mean"] < SATURATED_SHARE * conc["users"]:
        out.append(f"mean in-flight requests {conc['inflight_mean']} for {conc['users']} users: "
                   "the closed loop was not saturated (failures and their back-off, or a slow client)")
    chunks = report["usage_source"].get("chunks", 0)
    if chunks:
        out.append(f"{chunks} requests came without usage: their token counts are stream chunks, "
                   "which undercount under speculative decoding")
    ratio = report["prompt_tokens"]["median_over_target"]
    if ratio is not None and abs(ratio - 1) > PROMPT_TOLERANCE:
        out.append(f"measured prompt size {report['prompt_tokens']['median']} tokens (median) against the "
                   f"target {report['prompt_tokens']['target']}")
    gaps = report["gaps"]
    if gaps["stall_gaps"]:
        out.append(f"{gaps['stall_gaps']} inter-token gaps of at least {gaps['stall_gap_s']} s in "
                   f"{gaps['requests_with_stalls']} requests (largest {gaps['max_gap_s']} s)")
    if report["probe"]["ok"] < probe_n:
        out.append(f"probe: {report['probe']['ok']} of {probe_n} requests succeeded")
    if req["started_after_end"]:
        out.append(f"{req['started_after_end']} requests started after the load window ended")
    return out


def run_load(url, out_parquet, *, order, rep, arm, users=4, duration_s, max_tokens=400, prompt_tokens=1400,
             model=None, extra_body=None, probe=True, probe_at=None, probe_n=3, probe_tokens=256,
             stall_gap_s=1.0, stop_timeout_s=120, log_path=None, progress=None, status_hint=None,
             progress_every_s=5.0, locustfile=None, interlock=None, interlock_every_s=1.0):
    """Run one phase's load against ``url`` and return its validity report (see module doc).

    ``duration_s`` is whole seconds (Locust's run time). ``probe_at`` is seconds from the
    start (None: 60 % of the duration). Single-stream mode: ``users=1, probe=False``.
    ``progress(line)`` receives the progress lines (default: stderr); ``status_hint()`` may
    return a short string appended to each (the workflow shows the head's hottest zone).
    ``interlock()`` is asked every ``interlock_every_s``: a non-empty answer (the reason)
    stops Locust at once; the records so far are still written, then ``LoadAborted`` is
    raised with the reason.
    """
    out_parquet = Path(out_parquet)
    out_parquet.parent.mkdir(parents=True, exist_ok=True)
    records_path = out_parquet.with_suffix(".jsonl")
    events_path = out_parquet.parent / "load_events.jsonl"
    log_path = Path(log_path) if log_path else out_parquet.parent / "locust.log"
    for stale in (records_path, events_path):
        stale.unlink(missing_ok=True)  # the locustfile appends; a rerun must not mix attempts
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    command = locust_command(
        url, records_path, events_path, users=users, duration_s=duration_s, stop_timeout_s=stop_timeout_s,
        max_tokens=max_tokens, prompt_tokens=prompt_tokens, model=model, extra_body=extra_body,
        # The clock time keeps a rerun of the same phase from sharing prefixes with the last.
        tag_prefix=f"{order}-rep{rep}-{arm}-{time.strftime('%H%M%S')}", probe=probe, probe_at=probe_at, probe_n=probe_n,
        probe_tokens=probe_tokens, stall_gap_s=stall_gap_s, locustfile=locustfile or LOCUSTFILE,
    )
    tail = JsonlTail(records_path)
    exit_code, aborted = _supervise(
        command, log_path, duration_s + stop_timeout_s + LOCUST_GRACE_S,
        lambda elapsed: progress(progress_line(tail.poll(), elapsed, duration_s, time.time(), _hint(status_hint))),
        progress_every_s, interlock, interlock_every_s)
    records, events = tail.poll(), JsonlTail(events_path).poll()
    if not records and exit_code != 0:
        raise RuntimeError(f"locust exited with code {exit_code} and recorded nothing; see {log_path}:\n"
                           + _log_tail(log_path))

    frame = to_frame(records, order=order, rep=rep, arm=arm)
    frame.to_parquet(out_parquet, engine="pyarrow", index=False)
    report = {
        "order": order, "rep": rep, "arm": arm, "url": url, "users": users, "duration_s": duration_s,
        "locust_exit_code": exit_code, "events": events,
        **validity_report(frame, load_window(events, frame, duration_s), users=users, max_tokens=max_tokens,
                          prompt_tokens=prompt_tokens, probe_n=probe_n if probe else 0, stall_gap_s=stall_gap_s),
    }
    if aborted:
        report["aborted"] = aborted
        report["warnings"].append(f"load aborted: {aborted}")
    elif exit_code != 0:
        report["warnings"].append(f"locust exited with code {exit_code}; see {log_path}")
    (out_parquet.parent / "validity.json").write_text(json.dumps(report, indent=2) + "\n")
    progress(summary_line(report))
    for warning in report["warnings"]:
        progress(f"  warning: {warning}")
    if aborted:
        raise LoadAborted(aborted)
    return report


def summary_line(report):
    req, thr = report["requests"], report["throughput"]
    return (f"load {report['order']} rep{report['rep']}-{report['arm']} done: {req['load_ok']}/{req['load']} load "
            f"requests ok, {thr['output_tok_s']} output tok/s over {report['window']['s']} s, "
            f"in flight {report['concurrency']['inflight_mean']}, probe {report['probe']['decode_tok_s_median']} tok/s, "
            f"{len(report['warnings'])} warnings")


class LoadAborted(RuntimeError):
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
                        raise RuntimeError(f"locust (pid {process.pid}) still running after {elapsed:.0f} s, "
                                           f"past its {limit_s:.0f} s bound; stopped it. See {log_path}")
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="thermab load", description="Closed-loop streaming load on an "
                                     "OpenAI-compatible server: requests.parquet and validity.json.")
    parser.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, required=True, help="requests.parquet to write (the rest goes beside it)")
    parser.add_argument("--order", default="AB")
    parser.add_argument("--rep", type=int, default=1)
    parser.add_argument("--arm", default="A")
    parser.add_argument("--users", type=int, default=4, help="closed-loop slots (requests always in flight)")
    parser.add_argument("--duration", type=int, required=True, help="load seconds")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--prompt-tokens", type=int, default=1400)
    parser.add_argument("--model", help="default: the first id of /v1/models")
    parser.add_argument("--extra-body", type=json.loads, help='JSON object, e.g. \'{"reasoning_effort": "low"}\'')
    parser.add_argument("--no-probe", action="store_true", help="no single-stream probe (single-stream mode)")
    parser.add_argument("--probe-at", type=float, help="seconds from the start (default: 60%% of the duration)")
    parser.add_argument("--probe-n", type=int, default=3)
    parser.add_argument("--probe-tokens", type=int, default=256)
    parser.add_argument("--stall-gap-s", type=float, default=1.0)
    parser.add_argument("--stop-timeout", type=int, default=120, help="seconds in-flight requests get to finish")
    parser.add_argument("--log", type=Path, help="Locust's output (default: locust.log beside --out)")
    parser.add_argument("--locustfile", type=Path, help=f"default: {LOCUSTFILE}")
    args = parser.parse_args(argv)
    report = run_load(
        args.url, args.out, order=args.order, rep=args.rep, arm=args.arm, users=args.users,
        duration_s=args.duration, max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens, model=args.model,
        extra_body=args.extra_body, probe=not args.no_probe, probe_at=args.probe_at, probe_n=args.probe_n,
        probe_tokens=args.probe_tokens, stall_gap_s=args.stall_gap_s, stop_timeout_s=args.stop_timeout,
        log_path=args.log, locustfile=args.locustfile,
    )
    print(json.dumps(report, indent=2))
    return 0 if report["requests"]["load_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
