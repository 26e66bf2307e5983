"""Was each phase's load the configured one? The analysis side of ``load.validity``.

``validity_table`` turns each phase's ``validity.json`` into one row of
``tables/validity.csv``: a phase whose load fell short of its configuration
(``load.validity.shortfalls``) has ``load_valid`` False, a phase without load records
(imported runs) NA.  A phase with request rows in ``tidy/requests.parquet`` but no
``validity.json`` (a run written by another tool) is judged from those rows by the same
rule (``derived_reports``), so a loop that was not closed never passes unnoticed. ``mark`` carries
``load_valid`` into every per-phase table and the pooled metrics, ``short_phases`` names the
phases behind a comparison that fell short (the report's ``summary.verdicts`` says so in words).
Pure functions over frames; ``model.read_validity`` reads the files.
"""

from collections.abc import Mapping

import numpy as np
import pandas as pd

from thermab.analysis.metrics import PHASE_KEYS, LoadWindow, each_window
from thermab.analysis.model import Plan, Telemetry
from thermab.contracts import REQUEST_COLUMNS, PhaseValidity, Validity
from thermab.errors import UserError
from thermab.load.shapes import Shape
from thermab.load.validity import shortfalls, validity_report
from thermab.load_levels import CLOSED, run_shape

VALIDITY_COLUMNS = PHASE_KEYS + [
    "users",
    "load_s",
    "inflight_mean",
    "server_running_mean",
    "server_waiting_mean",
    "server_held_max",
    "share_at_users",
    "ok_load",
    "full_length_share",
    "reporting_cached",
    "cached_share",
    "requests",
    "failed",
    "usage_source",
    "shape",
    "achieved_rate",
    "delayed_by_cap",
    "think_mean_s",
    "client_delay_p99_s",
    "load_valid",
    "shortfalls",
    "warnings",
]
DTYPES = {
    **dict.fromkeys(
        ["users", "load_s", "ok_load", "reporting_cached", "requests", "failed", "delayed_by_cap"], "Int64"
    ),
    **dict.fromkeys(
        [
            "inflight_mean",
            "share_at_users",
            "full_length_share",
            "cached_share",
            "server_running_mean",
            "server_waiting_mean",
            "server_held_max",
            "achieved_rate",
            "think_mean_s",
            "client_delay_p99_s",
        ],
        "float64",
    ),
    "load_valid": "boolean",
}
NO_RECORDS = "no load records"
DERIVED = "no validity.json: judged from tidy/requests.parquet"
PhaseKey = tuple[str, int, str]  # (order, rep, arm)


class DerivedValidity(Validity):
    """The validity report of a window without validity.json, derived from its requests
    (``derived_reports``)."""

    duration_s: int | None  # the window the plan asked, as the load stage records it
    aborted: str | None  # why, where an abort event falls inside the window


def derived_reports(
    requests: pd.DataFrame | None,
    windows: pd.DataFrame,
    events: pd.DataFrame,
    plan: Plan,
    written: Mapping[PhaseKey, PhaseValidity],
) -> dict[PhaseKey, DerivedValidity]:
    """The validity report of each window that has request rows but no report ``written``
    (validity.json), from those rows: the
    configured users, shape, max_tokens, prompt size and probes where the plan (run.json) has them,
    else what the rows show (the load's distinct users, its longest ok completion, no prompt
    target, the probes sent).  An ``abort`` event inside the window marks the load aborted."""
    windows = windows[[(w.order, w.rep, w.arm) not in written for w in each_window(windows)]]
    if requests is None or requests.empty or windows.empty:
        return {}
    # diagnostics another writer may not have are unknown (NA), not zero: counts become nullable
    dtypes = {
        column: "Int64" if dtype == "int64" and column != "rep" else dtype for column, dtype in REQUEST_COLUMNS.items()
    }
    frame = requests.copy()
    for column, dtype in dtypes.items():
        if column not in frame:
            frame[column] = pd.array([None] * len(frame), dtype=dtype)  # type: ignore[call-overload]  # pandas-stubs: a dtype by name
    try:
        frame = frame.astype({column: dtype for column, dtype in dtypes.items() if str(frame[column].dtype) != dtype})
    except (ValueError, TypeError) as error:
        raise UserError(
            f"tidy/requests.parquet: a column is not of the type docs/design.md gives it: "
            f"{' '.join(str(error).split())[:160]}"
        ) from None
    phases = dict(tuple(frame.groupby(PHASE_KEYS, sort=False)))  # a week holds hundreds of phases
    reports: dict[PhaseKey, DerivedValidity] = {}
    for window in each_window(windows):
        rows = phases.get((window.order, window.rep, window.arm))
        if rows is None:
            continue
        load, probes = rows[rows["kind"] == "load"], rows[rows["kind"] == "probe"]
        ok_tokens = load.loc[load["ok"], "completion_tokens"].dropna()
        # a plan's facts where it has them (an imported plan may not), else what the rows show
        users = plan.users if isinstance(plan.users, int) else int(load["user"].nunique())
        max_tokens = plan.max_tokens
        if max_tokens is None:
            max_tokens = int(ok_tokens.max()) if len(ok_tokens) else None
        report = validity_report(
            rows.reset_index(drop=True),
            (window.load_start, window.load_end),
            users=users,
            max_tokens=max_tokens,
            prompt_tokens=plan.prompt_tokens,
            probe_n=len(probes) if plan.probe_n is None else plan.probe_n,
            stall_gap_s=plan.stall_gap_s,
            shape=Shape(users, **run_shape(plan)),
        )
        aborts = events[
            (events["event"] == "abort")
            & (events["order"] == window.order)
            & (events["rep"] == window.rep)
            & (events["arm"] == window.arm)
            & events["t"].between(window.load_start, window.load_end)
        ]
        aborted = None
        if len(aborts):
            detail = aborts["detail"].iloc[0] if "detail" in aborts else None
            aborted = (detail.get("reason") if isinstance(detail, dict) else None) or "abort event"
        reports[(window.order, window.rep, window.arm)] = {
            **report,
            "warnings": [DERIVED, *report["warnings"]],
            "duration_s": plan.load_s,
            "aborted": aborted,
        }
    return reports


def validity_table(reports: Mapping[PhaseKey, PhaseValidity | DerivedValidity], windows: pd.DataFrame) -> pd.DataFrame:
    """One row per load window from the phase's validity report (``model.read_validity``);
    ``cached_share`` is the share of the load requests reporting cached tokens that had any."""
    rows = [_row(window, reports.get((window.order, window.rep, window.arm))) for window in each_window(windows)]
    table = pd.DataFrame(rows, columns=VALIDITY_COLUMNS)
    return table.astype(DTYPES)


def _row(window: LoadWindow, report: PhaseValidity | DerivedValidity | None) -> dict[str, object]:
    row: dict[str, object] = {"order": window.order, "rep": window.rep, "arm": window.arm}
    if report is None:
        return {**row, "warnings": NO_RECORDS}
    requests, concurrency, cached = report["requests"], report["concurrency"], report["cached"]
    reporting = cached["load_reporting_cached_tokens"]
    short = shortfalls(report)
    shape = report.get("shape") or {"kind": CLOSED}
    return {
        **row,
        "users": concurrency["users"],
        "load_s": report.get("duration_s"),
        "inflight_mean": concurrency["inflight_mean"],
        "share_at_users": concurrency["share_of_window_at_users"],
        "ok_load": requests["load_ok"],
        "full_length_share": report["full_length"]["share_of_ok_load"],
        "reporting_cached": reporting,
        "cached_share": cached["load_with_cached_tokens"] / reporting if reporting else np.nan,
        "requests": requests["load"] + requests["probe"],
        "failed": report["errors"]["n"],
        "usage_source": "; ".join(f"{source}: {n}" for source, n in report["usage_source"].items()),
        "shape": shape["kind"],
        "achieved_rate": shape.get("achieved_rate"),
        "delayed_by_cap": shape.get("delayed_by_cap"),
        "think_mean_s": shape.get("drawn_mean_s"),
        "client_delay_p99_s": shape.get("client_delay_s", {}).get("p99"),
        "load_valid": not short,
        "shortfalls": "; ".join(short),
        "warnings": "; ".join(report["warnings"]),
    }


SERVER_COLUMNS = ["server_running_mean", "server_waiting_mean", "server_held_max"]
SERVER_SLACK = 1.0  # requests: a disagreement beyond this is a warning


def server_view(validity: pd.DataFrame, telemetry: Telemetry, windows: pd.DataFrame) -> pd.DataFrame:
    """``validity`` (``validity_table``) with the server's own view of each load window from its ``/metrics``
    (telemetry kind ``server``): the mean of vLLM's running and waiting gauges, the most
    requests it held at once (running + waiting of one scrape), NaN where it was not scraped.

    The gauges are the scheduler's state after the engine's latest step, so a request
    counts only while the engine holds it: its mean is the users times the share of a
    request's time spent in the engine, less than the client's in-flight, by much on a
    model whose steps are short beside the HTTP and tokenizing around them (docs/load-tools.md).
    What holds whatever the model: the server holds no more than the client has in flight,
    and at some moment it holds every user's request.  So a phase whose mean running +
    waiting is more than one request above the client's in-flight measured another client's
    load too: a shortfall (``load_valid`` False), never a valid phase; one whose most held at
    once is more than one below the users is warned (something between the load and the
    engine holds requests back) in a closed loop, the one shape that keeps every user's request
    in flight."""
    server = telemetry.frame(kind="server")
    server = server[server["sensor"].isin(["running", "waiting"])]
    rows: list[dict[str, object]] = []
    shared: list[str] = []
    phases = zip(
        each_window(windows),
        validity["warnings"],
        validity["inflight_mean"].astype("float64"),
        validity["shape"],
        validity["users"],
        strict=False,
    )
    for window, warning, inflight_mean, shape, users in phases:
        inside = server[(server["t"] >= window.load_start) & (server["t"] < window.load_end)]
        running = inside.loc[inside["sensor"] == "running", "value"]
        waiting = inside.loc[inside["sensor"] == "waiting", "value"]
        held = inside.groupby("t")["value"].sum()
        view = {
            "server_running_mean": float(running.mean()) if len(running) else np.nan,
            "server_waiting_mean": float(waiting.mean()) if len(waiting) else np.nan,
            "server_held_max": float(held.max()) if len(held) else np.nan,
        }
        warnings = [w for w in [warning] if isinstance(w, str) and w]
        shared.append("")
        if len(held) and pd.notna(inflight_mean):
            server_mean = view["server_running_mean"] + np.nan_to_num(view["server_waiting_mean"])
            if server_mean > inflight_mean + SERVER_SLACK:
                shared[-1] = (
                    f"the server held {server_mean:.2f} requests on average, more than the load's "
                    f"{inflight_mean:.2f} in flight: another client shares it"
                )
                warnings.append(shared[-1])
            if shape == CLOSED and pd.notna(users) and view["server_held_max"] < users - SERVER_SLACK:
                warnings.append(
                    f"the server never held more than {view['server_held_max']:.0f} of the "
                    f"{users} users' requests at once: something in front of it holds them back"
                )
        rows.append({**view, "warnings": "; ".join(warnings)})
    views = pd.DataFrame(rows, columns=SERVER_COLUMNS + ["warnings"], index=validity.index)
    validity = validity.assign(
        **{column: views[column].astype("float64") for column in SERVER_COLUMNS}, warnings=views["warnings"]
    )
    if "load_valid" in validity and any(shared):  # what was measured was two loads: never a valid phase
        validity["load_valid"] = [
            bool(valid) and not why for valid, why in zip(validity["load_valid"], shared, strict=True)
        ]
        validity["shortfalls"] = [
            "; ".join(part for part in (short, why) if isinstance(part, str) and part)
            for short, why in zip(validity["shortfalls"], shared, strict=True)
        ]
    return validity


def mark(frame: pd.DataFrame, validity: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (rows of phases of one run) with its phase's ``load_valid`` appended."""
    flags = validity.set_index(PHASE_KEYS)["load_valid"]
    keys = pd.MultiIndex.from_frame(frame[PHASE_KEYS].astype({"rep": "int64"}))
    return frame.assign(load_valid=pd.array(flags.reindex(keys).to_numpy(), dtype="boolean"))


def is_short(frame: pd.DataFrame) -> pd.Series:
    """Rows whose phase's load fell short (not those without load records)."""
    return ~frame["load_valid"].fillna(True).astype(bool)


def short_phases(frame: pd.DataFrame) -> list[str]:
    """``["AB rep1-B", ...]``: the phases of ``frame`` whose load fell short, in order of appearance."""
    short = frame[is_short(frame)]
    names = short["order"].astype(str) + " rep" + short["rep"].astype(int).astype(str) + "-" + short["arm"]
    return list(dict.fromkeys(names))
