"""Was the load the load intended? Pure functions over a phase's request records.

``to_frame`` puts the locustfile's records into the columns of ``tidy/requests.parquet``
(``contracts.REQUEST_COLUMNS``); ``validity_report`` states the facts of the
load window with their n, ``warnings`` says in words what makes a phase suspect, and
``shortfalls`` how its load fell short of the configuration. ``decode_speed`` is the one
rule for a request's decode speed: a rate only where the tokens' arrivals measured one.
"""

from collections.abc import Iterable

import numpy as np
import pandas as pd

from thermab.contracts import REQUEST_COLUMNS, Validity
from thermab.load.shapes import LATE_S, MAX_LATE_SHARE, WAKEUP, Shape, tolerance
from thermab.load_levels import CLOSED, RATE

PROMPT_TOLERANCE = 0.10  # measured prompt size this far from the target is reported
# The load fell short of the configuration (docs/design.md, "Load validity") when:
INFLIGHT_SLACK = 0.05  # the mean in flight is more than this below the users,
FULL_LENGTH_MIN = 0.99  # fewer ok load requests than this share returned max_tokens,
# or any load request hit the prefix cache, or the load was aborted.
# Decode speed is measured (docs/design.md, "Probe decode speed") only from at least
MIN_TOKEN_ARRIVALS = 8  # separate arrivals of tokens
MIN_ARRIVAL_SPAN_SHARE = 0.8  # whose first-to-last span covers this share of t_end - t_first_token


def to_frame(records, *, order, rep, arm, users=None, load_level=None):
    keys = {"order": order, "rep": rep, "arm": arm, "users": users, "load_level": load_level}
    frame = pd.DataFrame.from_records(records, columns=[c for c in REQUEST_COLUMNS if c not in keys])
    for position, (name, value) in enumerate(keys.items()):
        frame.insert(position, name, value)
    return frame.astype(REQUEST_COLUMNS).sort_values("t_start", kind="stable").reset_index(drop=True)


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


def decode_measurable(frame):
    """Whether each request's tokens arrived spread out enough to time its decode: at least
    MIN_TOKEN_ARRIVALS separate arrivals whose span is at least MIN_ARRIVAL_SPAN_SHARE of
    t_end − t_first_token. Tokens that came in a few bursts (a tiny model, a coalescing
    proxy) give (tokens − 1) / almost nothing. Records without the arrival columns (written
    before they existed) cannot show it and are not measurable."""
    if "token_arrivals" not in frame or "token_span_s" not in frame:
        return pd.Series(False, index=frame.index)
    decode_s = frame["t_end"] - frame["t_first_token"]
    arrivals = frame["token_arrivals"].astype("float64")  # nullable Int64: NA → NaN, never measurable
    return (
        (arrivals >= MIN_TOKEN_ARRIVALS) & (decode_s > 0) & (frame["token_span_s"] >= MIN_ARRIVAL_SPAN_SHARE * decode_s)
    )


def decode_speed(frame: pd.DataFrame) -> pd.Series:
    """Decode speed of each request in tok/s, (completion_tokens − 1) / (t_end − t_first_token):
    the first token is excluded because its latency is prefill, not decode. NaN where it was
    not measurable (``decode_measurable``)."""
    decode_s = frame["t_end"] - frame["t_first_token"]
    tokens = frame["completion_tokens"].astype("float64")  # nullable Int64: NA → NaN
    return ((tokens - 1) / decode_s).where(decode_measurable(frame) & (tokens > 1))


def bursts(arrivals: Iterable[float | None]) -> str | None:
    """``"1–2 bursts"`` from the token arrivals of some requests; None when none recorded."""
    arrivals = pd.Series(arrivals, dtype="float64").dropna()
    if arrivals.empty:
        return None
    low, high = int(arrivals.min()), int(arrivals.max())
    count = f"{low}" if low == high else f"{low}–{high}"
    return f"{count} burst{'' if high == 1 else 's'}"


def _number(value, digits=3):
    """A JSON-friendly number: None for NaN/NA, plain int or rounded float otherwise."""
    if value is None or pd.isna(value) or not np.isfinite(float(value)):
        return None
    if float(value).is_integer():
        return int(value)
    return round(float(value), digits)


def _counts(series):
    return {str(key): int(n) for key, n in series.value_counts().items()}


def error_category(error):
    """Failure texts start with a fixed category before the first ': '."""
    return error.split(": ", 1)[0]


def validity_report(
    frame, window, *, users, max_tokens, prompt_tokens, probe_n, stall_gap_s, shape: Shape | None = None
) -> Validity:
    """Was this the load intended? Facts with their n, then ``warnings`` in words;
    ``shape`` (default: a closed loop of ``users``) says by which rule."""
    shape = shape or Shape(users)
    wakeups = frame[frame["kind"] == WAKEUP]  # after the load: judged on their own
    frame = frame[frame["kind"] != WAKEUP]
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
    decode = decode_speed(ok_probe)
    report: Validity = {
        "window": {"start": _number(start, 3), "end": _number(end, 3), "s": _number(length)},
        "requests": {
            "load": len(load),
            "load_ok": len(ok_load),
            "probe": len(probe),
            "probe_ok": len(ok_probe),
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
            "median_over_target": _number(measured_prompt.median() / prompt_tokens) if prompt_tokens else None,
        },
        "usage_source": _counts(frame["usage_source"]),
        "throughput": {
            "requests_completed": len(in_window),
            "output_tokens": int(in_window["completion_tokens"].sum()),
            "output_tok_s": _number(in_window["completion_tokens"].sum() / length if length > 0 else np.nan),
        },
        "probe": {
            "n": len(probe),
            "ok": len(ok_probe),
            "measurable": int(decode.notna().sum()),
            "token_arrivals": [int(n) for n in ok_probe["token_arrivals"].dropna()],
            "decode_tok_s_median": _number(decode.median()),
        },
        "shape": shape_report(frame, window, shape),
        "wakeup": {
            "n": int(wakeups["gap_s"].notna().sum()),
            "ok": int((wakeups["ok"] & wakeups["gap_s"].notna()).sum()),
            "gaps_s": sorted(float(gap) for gap in wakeups["gap_s"].dropna().unique()),
            "first_error": wakeups.loc[~wakeups["ok"], "error"].iloc[0] if (~wakeups["ok"]).any() else None,
        },
        "warnings": [],
    }
    report["warnings"] = warnings(report, probe_n)
    return report


def warnings(report: Validity, probe_n):
    """What in ``report`` makes the phase suspect, in words a reader can act on."""
    out = []
    req, errors, conc = report["requests"], report["errors"], report["concurrency"]
    if req["load_ok"] == 0:
        out.append("no load request succeeded: is the server up and serving the model?")
    if errors["n"]:
        categories = ", ".join(f"{k}: {v}" for k, v in errors["by_category"].items())
        last_ok = errors["last_ok_end_s"]
        when = f"; the last successful load request ended {last_ok} s into the window" if last_ok is not None else ""
        out.append(
            f"{errors['n']} of {req['load'] + req['probe']} requests failed ({categories}){when}; "
            f"first: {errors['first']}"
        )
    share = report["full_length"]["share_of_ok_load"]
    if share is not None and share < 1:
        out.append(
            f"only {share:.1%} of successful load requests returned max_tokens="
            f"{report['full_length']['max_tokens']} tokens: the server ignored ignore_eos or max_tokens"
        )
    if report["cached"]["load_with_cached_tokens"]:
        out.append(
            f"{report['cached']['load_with_cached_tokens']} load requests hit the prefix cache: "
            "the prompts are not unique from their first tokens"
        )
    if (
        closed_loop(report)
        and conc["inflight_mean"] is not None
        and conc["inflight_mean"] < conc["users"] - INFLIGHT_SLACK
    ):
        out.append(
            f"mean in-flight requests {conc['inflight_mean']} for {conc['users']} users: "
            "the closed loop was not saturated (failures and their back-off, or a slow client)"
        )
    chunks = report["usage_source"].get("chunks", 0)
    if chunks:
        out.append(
            f"{chunks} requests came without usage: their token counts are stream chunks, "
            "which undercount under speculative decoding"
        )
    ratio = report["prompt_tokens"]["median_over_target"]
    if ratio is not None and abs(ratio - 1) > PROMPT_TOLERANCE:
        out.append(
            f"measured prompt size {report['prompt_tokens']['median']} tokens (median) against the "
            f"target {report['prompt_tokens']['target']}"
        )
    gaps = report["gaps"]
    if gaps["stall_gaps"]:
        out.append(
            f"{gaps['stall_gaps']} inter-token gaps of at least {gaps['stall_gap_s']} s in "
            f"{gaps['requests_with_stalls']} requests (largest {gaps['max_gap_s']} s)"
        )
    probe = report["probe"]
    if probe["ok"] < probe["n"]:
        out.append(f"probe: {probe['n'] - probe['ok']} of {probe['n']} requests sent failed")
    if probe["n"] < probe_n:  # a probe is sent only inside the window: the rest did not fit
        out.append(f"probe: {probe['n']} of {probe_n} requests sent before the window ended")
    if probe["ok"] and not probe["measurable"]:
        how = bursts(probe["token_arrivals"])
        out.append(
            f"probe decode speed not measurable: tokens arrived in {how} (it needs {MIN_TOKEN_ARRIVALS} "
            f"arrivals spanning {MIN_ARRIVAL_SPAN_SHARE * 100:.0f} % of the decode time)"
            if how
            else "probe decode speed not measurable: the records do not say when its tokens arrived"
        )
    if req["started_after_end"]:
        out.append(f"{req['started_after_end']} requests started after the load window ended")
    wakeup = report.get("wakeup", {})
    if wakeup.get("first_error"):
        out.append(
            f"wake-up probes: {wakeup['ok']} of {wakeup['n']} after a gap succeeded; "
            f"first error: {wakeup['first_error']}"
        )
    return out + shape_shortfalls(report.get("shape", {}))


def closed_loop(report: Validity) -> bool:
    """Whether the phase's load was a closed loop without think time (a report written
    without a shape was): only then are ``users`` requests always in flight."""
    return report.get("shape", {}).get("kind", CLOSED) == CLOSED


def shortfalls(report: Validity):
    """How the load of a phase fell short of its configuration, in words (empty when it did
    not), from a validity report (``validity.json``): the closed loop not closed, requests
    shorter than max_tokens, prefix-cache hits or an aborted load. Any of them changes what
    the server was asked to do, so the phase's numbers are not those of the configured load.
    A think-time loop or an arrival rate is judged by its shape's rule instead of the
    closed loop's (``shapes.shape_shortfalls``)."""
    out = []
    if report.get("aborted"):
        out.append(f"load aborted: {report['aborted']}")
    conc = report["concurrency"]
    if conc["inflight_mean"] is None:
        out.append("no load window to measure requests in flight over")
    elif closed_loop(report) and conc["inflight_mean"] < conc["users"] - INFLIGHT_SLACK:
        out.append(f"{conc['inflight_mean']:.2f} of {conc['users']} requests in flight")
    share = report["full_length"]["share_of_ok_load"]
    if share is None:
        out.append("no successful load request")
    elif share < FULL_LENGTH_MIN:
        out.append(f"{share:.1%} of ok load requests at max_tokens={report['full_length']['max_tokens']}")
    if report["cached"]["load_with_cached_tokens"]:
        out.append(f"{report['cached']['load_with_cached_tokens']} load requests hit the prefix cache")
    return out + shape_shortfalls(report.get("shape", {}))


def summary_line(report):
    req, thr, probe = report["requests"], report["throughput"], report["probe"]
    speed = (
        f"{probe['decode_tok_s_median']} tok/s"
        if probe["measurable"]
        else f"not measurable ({bursts(probe['token_arrivals']) or 'no probe'})"
    )
    return (
        f"load {report['order']} rep{report['rep']}-{report['arm']} done: {req['load_ok']}/{req['load']} load "
        f"requests ok, {thr['output_tok_s']} output tok/s over {report['window']['s']} s, "
        f"in flight {report['concurrency']['inflight_mean']}, probe {speed}, "
        f"{len(report['warnings'])} warnings"
    )


def client_delay(load: pd.DataFrame) -> pd.Series:
    """Seconds each request left after it was due, not counting a wait for a slot."""
    return load["t_start"] - load["t_due"] - load["slot_wait_s"].fillna(0.0)


def shape_report(frame: pd.DataFrame, window: tuple[float, float], shape: Shape) -> dict:
    """The facts by which ``shape``'s rule judges a phase's load requests (``frame``, the
    columns of requests.parquet) over the load ``window``."""
    start, end = window
    length = end - start
    load = frame[frame["kind"] == "load"]
    report = {"kind": shape.kind, "users": shape.users}
    if shape.kind == CLOSED:
        return report
    due = load[load["t_due"].notna()] if "t_due" in load else load.iloc[:0]
    delay = client_delay(due) if len(due) else pd.Series(dtype="float64")
    report["client_delay_s"] = {
        "n": len(delay),
        "median": _number(delay.median(), 4),
        "p99": _number(delay.quantile(0.99), 4) if len(delay) else None,
        "late": int((delay > LATE_S).sum()),
        "late_s": LATE_S,
    }
    if shape.kind == RATE:
        started = int(((load["t_start"] >= start) & (load["t_start"] < end)).sum()) if length > 0 else 0
        achieved = started / length if length > 0 else np.nan
        report.update(
            rate=shape.rate,
            burstiness=shape.burstiness,
            started=started,
            achieved_rate=_number(achieved, 4),
            rate_ratio=_number(achieved / shape.rate, 4),
            tolerance=_number(tolerance(shape.rate * length, shape.burstiness**-0.5), 4),
            delayed_by_cap=int((due["slot_wait_s"].fillna(0) > 0).sum()) if len(due) else 0,
        )
    else:
        drawn = due["think_s"].dropna() if len(due) else pd.Series(dtype="float64")
        report.update(
            think_s=shape.think_s,
            thinks=len(drawn),
            drawn_mean_s=_number(drawn.mean(), 4),
            think_ratio=_number(drawn.mean() / shape.think_s, 4) if len(drawn) else None,
            tolerance=_number(tolerance(len(drawn), 1.0), 4),
        )
    return report


def shape_shortfalls(report: dict) -> list[str]:
    """How a phase's load fell short of its shape's rule, in words (empty when it did not)."""
    kind = report.get("kind", CLOSED)
    if kind == CLOSED:
        return []
    out = []
    delay = report["client_delay_s"]
    if delay["n"] and delay["late"] > MAX_LATE_SHARE * delay["n"]:
        out.append(
            f"{delay['late']} of {delay['n']} requests left more than {delay['late_s']:g} s after they were due "
            f"(p99 {delay['p99']} s): the client fell behind its schedule"
        )
    if kind == RATE:
        tolerated = report["tolerance"]
        if report["rate_ratio"] is None or (tolerated is not None and abs(report["rate_ratio"] - 1) > tolerated):
            out.append(
                f"{report['achieved_rate']} requests/s started against the configured {report['rate']:g} "
                f"(tolerance {report['tolerance']:.1%})"
            )
        if report["delayed_by_cap"] > MAX_LATE_SHARE * max(report["started"], 1):
            out.append(
                f"{report['delayed_by_cap']} of {report['started']} arrivals waited for one of the "
                f"{report['users']} slots: the cap, not the rate, set the load"
            )
    elif report["think_ratio"] is None:
        out.append("no think time was drawn")
    elif report["tolerance"] is not None and abs(report["think_ratio"] - 1) > report["tolerance"]:
        out.append(
            f"think times drawn {report['drawn_mean_s']} s on average against the configured "
            f"{report['think_s']:g} s (tolerance {report['tolerance']:.1%})"
        )
    return out
