"""A wall meter that stopped answering during a load window, named in that phase's validity.

The controller polls the meters outside the hosts (telemetry/wall_poll.py); a poll that
fails leaves no reading, so the meter's power rows have a gap.  Its energy is still whole
where the meter has a counter (the first reading after the gap carries the energy of all of
it), and bridged by the readings around it where it has none; either way the phase says
so.  A gap is a stretch of the window without a row (its edges included) longer than
``GAP_INTERVALS`` times the meter's median spacing over the run.  Pure: frames in, frames
out."""

from __future__ import annotations

import numpy as np
import pandas as pd

from thermab.analysis.metrics import each_window
from thermab.analysis.model import Telemetry, as_telemetry
from thermab.telemetry.agent import domain_scope
from thermab.telemetry.power import WALL_SCOPE

GAP_INTERVALS = 3.0  # a missed poll or two is jitter; three intervals without one is a meter silent


def largest_gap(t: np.ndarray, start: float, end: float) -> tuple[float, float]:
    """(length, start) of the longest stretch of ``[start, end)`` without a time of ``t``."""
    edges = np.concatenate([[start], t[(t >= start) & (t < end)], [end]])
    steps = np.diff(edges)
    longest = int(np.argmax(steps))
    return float(steps[longest]), float(edges[longest])


def wall_gaps(telemetry: Telemetry | pd.DataFrame, windows: pd.DataFrame) -> list[str]:
    """Per window (in the windows' order), what the wall meters left out: ``head wall-0: no
    reading for 12.0 s from 31.0 s into the load window`` (``; ``-joined), empty where none."""
    power = as_telemetry(telemetry).frame(kind="power")
    if power.empty:
        return [""] * len(windows)
    walls = power[[domain_scope(str(sensor))[0] == WALL_SCOPE for sensor in power["sensor"]]]
    series = {key: np.sort(rows["t"].to_numpy(float)) for key, rows in walls.groupby(["host", "sensor"], sort=True)}
    said = []
    for window in each_window(windows):
        gaps = []
        for (host, domain), t in series.items():
            spacing = np.median(np.diff(t)) if len(t) > 1 else np.nan
            length, at = largest_gap(t, window.load_start, window.load_end)
            if not np.isfinite(spacing) or length > GAP_INTERVALS * spacing:
                into = at - window.load_start
                gaps.append(f"{host} {domain}: no reading for {length:.1f} s from {into:.1f} s into the load window")
        said.append("; ".join(gaps))
    return said


def with_wall_gaps(validity: pd.DataFrame, telemetry: Telemetry | pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """``validity`` with each phase's wall meter gaps added to its ``warnings`` (the rows of
    ``validity`` and ``windows`` are the same phases, in the same order)."""
    gaps = wall_gaps(telemetry, windows)
    if not any(gaps):
        return validity
    warnings = [
        "; ".join(part for part in (warning, gap) if isinstance(part, str) and part)
        for warning, gap in zip(validity["warnings"], gaps, strict=True)
    ]
    return validity.assign(warnings=warnings)
