"""Did the arms start alike?  Each phase's start temperature (the head's timeline zone at
``load_start``), the cooldown before it, the head's idle power before its restart, and the arms
whose mean start temperatures differ
from the reference's by more than ``analysis.start_balance_c``.

A later phase that starts warmer measures warmer whatever its setting: a community re-run of
the spin-wait study reached the opposite thermal conclusion that way.  The start
is read from the telemetry itself (the last sample of the zone before ``load_start``),
so an imported run is judged the same way.  Pure functions over frames.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from thermab.analysis.metrics import PHASE_KEYS
from thermab.analysis.model import Telemetry
from thermab.telemetry.power import IDLE_BEFORE_S, total_watts

START_COLUMNS = ["start_c", "cooldown_before", "idle_w_before"]
DEFAULT_BALANCE_C = 2.0
TARGET, CAP, FIRST = "reached target", "hit its cap", "after the baseline"
ARM_START_COLUMNS = [
    "arm",
    "phases",
    "start_c",
    "start_min_c",
    "start_max_c",
    "idle_w_before",
    "cooldown_capped",
    "diff_c",
    "balanced",
]


def start_temperatures(telemetry: Telemetry, windows: pd.DataFrame, host: str, zone: str) -> pd.Series:
    """°C of ``zone`` on ``host`` at each window's ``load_start`` (its last sample before it:
    the first of the load already carries its heat; NaN when there is none), indexed like ``windows``."""
    # a zone that never gave a finite reading has a series without samples
    series = [arrays for _key, arrays in telemetry.series(kind="thermal", sensor=zone, host=host) if len(arrays["t"])]
    if not series or windows.empty:
        return pd.Series(np.nan, index=windows.index, dtype="float64")
    t, value = series[0]["t"], series[0]["value"]
    at = np.searchsorted(t, windows["load_start"].to_numpy(float), side="left") - 1
    return pd.Series(np.where(at >= 0, value[np.clip(at, 0, None)], np.nan), index=windows.index, dtype="float64")


def cooldowns_before(events: pd.DataFrame, windows: pd.DataFrame) -> list[str]:
    """For each window, how the cooldown that ended last before its load ended: ``reached
    target``, ``hit its cap``, or ``after the baseline`` for a first phase ('' when unknown)."""
    ends = events[events["event"] == "cooldown_end"] if "event" in events else events.iloc[:0]
    answers = []
    for window in windows.itertuples(index=False):
        before = ends[ends["t"] < window.load_start]
        if before.empty:
            answers.append(FIRST)
            continue
        detail = before["detail"].iloc[-1] if "detail" in before else None
        reason = detail.get("reason", "") if isinstance(detail, dict) else ""
        answers.append(CAP if reason.startswith("time cap") else TARGET if reason else "")
    return answers


def idle_power_before(
    telemetry: Telemetry, windows: pd.DataFrame, events: pd.DataFrame, host: str, seconds: float = IDLE_BEFORE_S
) -> list[float]:
    """W: ``host``'s total power (power.total_watts) over ``seconds`` before each phase's last
    ``restart_start``: how idle the node was when the phase began, at the end of the cooldown
    before it or of the baseline for the first (phase.json's ``idle_w_before`` is the same
    figure as the phase read it from the agent); NaN where a domain has no sample there or
    the phase has no restart mark."""
    series = {
        key["sensor"]: (arrays["t"], arrays["value"]) for key, arrays in telemetry.series(kind="power", host=host)
    }
    restarts = events[events["event"] == "restart_start"] if "event" in events else events.iloc[:0]
    values = []
    for window in windows.itertuples(index=False):
        mine = restarts[
            (restarts["order"] == window.order)
            & (restarts["rep"] == window.rep)
            & (restarts["arm"] == window.arm)
            & (restarts["t"] < window.load_start)
        ]
        if mine.empty:
            values.append(np.nan)
            continue
        end = float(mine["t"].max())
        values.append(total_watts(series, end - seconds, end))
    return values


def with_starts(
    validity: pd.DataFrame, windows: pd.DataFrame, telemetry: Telemetry, events: pd.DataFrame, host: str, zone: str
) -> pd.DataFrame:
    """validity.csv with ``start_c``, ``cooldown_before`` and ``idle_w_before`` appended, per phase."""
    keyed = windows.assign(
        start_c=start_temperatures(telemetry, windows, host, zone),
        cooldown_before=cooldowns_before(events, windows),
        idle_w_before=idle_power_before(telemetry, windows, events, host),
    )
    keyed = keyed.astype({"rep": "int64"}).set_index(PHASE_KEYS)[START_COLUMNS]
    keys = pd.MultiIndex.from_frame(validity[PHASE_KEYS].astype({"rep": "int64"}))
    found = keyed.reindex(keys)
    return validity.assign(
        start_c=found["start_c"].to_numpy(float),
        cooldown_before=found["cooldown_before"].fillna("").to_numpy(object),
        idle_w_before=found["idle_w_before"].to_numpy(float),
    )


def arm_starts(validity: pd.DataFrame, reference: str, tolerance_c: float = DEFAULT_BALANCE_C) -> pd.DataFrame:
    """One row per arm with start temperatures: its phases, mean and range of ``start_c``,
    the mean's difference from the reference's, the mean ``idle_w_before``, how many of its
    cooldowns hit their cap, and ``balanced`` (False where the means are more than
    ``tolerance_c`` apart; the reference itself True)."""
    if "start_c" not in validity:
        return pd.DataFrame(columns=ARM_START_COLUMNS)
    known = validity.reindex(columns=["arm", *START_COLUMNS])
    known = known[known["start_c"].notna()]
    rows = [
        {
            "arm": arm,
            "phases": len(part),
            "start_c": part["start_c"].mean(),
            "start_min_c": part["start_c"].min(),
            "start_max_c": part["start_c"].max(),
            "idle_w_before": part["idle_w_before"].mean(),
            "cooldown_capped": int((part["cooldown_before"] == CAP).sum()),
        }
        for arm, part in known.groupby("arm", sort=False)
    ]
    starts = pd.DataFrame(rows, columns=ARM_START_COLUMNS[:-2])
    reference_c = starts.loc[starts["arm"] == reference, "start_c"]
    diff = starts["start_c"] - (reference_c.iloc[0] if len(reference_c) else np.nan)
    return starts.assign(diff_c=diff, balanced=~(diff.abs() > tolerance_c))


def unbalanced(validity: pd.DataFrame, reference: str, tolerance_c: float = DEFAULT_BALANCE_C) -> dict[str, str]:
    """arm → why its starts are not balanced with the reference's: mean start temperatures
    more than ``tolerance_c`` apart.  Arms without start temperatures are left out."""
    starts = arm_starts(validity, reference, tolerance_c).set_index("arm")
    if reference not in starts.index:
        return {}
    reference_c = float(starts["start_c"][reference])
    return {
        arm: (
            f"unbalanced starts: {arm} started at {row.start_c:.1f} °C on average, {reference} at "
            f"{reference_c:.1f} °C (more than {tolerance_c:g} °C apart)"
        )
        for arm, row in zip(map(str, starts.index), starts.itertuples(index=False), strict=True)
        if not row.balanced
    }
