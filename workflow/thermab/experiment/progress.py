"""Where a run stands: which phase of how many, and how long until the phase, the look and
the run are done. The load's progress line carries it every few seconds, and it is kept in
the run directory's status.json, which ``python -m thermab status`` reads from another
terminal.

The time left is estimated from the run's own pace where it has one (each restart from
restart_start to server_ready, each cooldown from load_end to cooldown_end, as
events.jsonl holds them), else from the config (a cooldown of cooldown_max_s, a restart of
none measured yet: the first phase's start-up is all that is unknown)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from thermab.config import Config
from thermab.experiment import plan


def look_repeats(config: Config, order: str, rep: int) -> int:
    """The repeats of the look the phase job of repeat ``rep`` runs toward: with ``until:
    decided`` the look that ends its block (the study may stop at any look), else the run's."""
    return plan.look_of(order, config.max_repeats, rep) if config.until == "decided" else config.repeats


@dataclass(frozen=True)
class Position:
    phase: str  # the window's phase id
    k: int  # its place in the look, from 1
    n: int  # windows in this look
    phase_left_s: float  # the window's load left and its cooldown
    look_left_s: float  # until this look's last window has cooled down
    run_left_s: float  # the same for the run; with until: decided, until max_repeats at most
    run_bounded: bool  # run_left_s is an upper bound (until: decided may stop at any look)


def _mean(values: list[float], default: float) -> float:
    values = [v for v in values if v >= 0]
    return sum(values) / len(values) if values else default


def pace(events: list[dict], cooldown_max_s: float) -> tuple[float, float]:
    """Seconds a restart and a cooldown take in this run so far: (restart, cooldown)."""
    started: dict[tuple, float] = {}
    restarts, cooldowns = [], []
    for event in events:
        key = (event.get("rep"), event.get("arm"), event.get("users"), event.get("load_level"))
        if event["event"] == "restart_start":
            started[key[:2]] = event["t"]
        elif event["event"] == "server_ready" and key[:2] in started:
            restarts.append(event["t"] - started.pop(key[:2]))
        elif event["event"] == "load_end":
            started[key] = event["t"]
        elif event["event"] == "cooldown_end" and key in started:
            cooldowns.append(event["t"] - started.pop(key))
    return _mean(restarts, 0.0), _mean(cooldowns, cooldown_max_s)


def position(
    config: Config, order: str, look_repeats: int, phase_id: str, elapsed_s: float, events: list[dict]
) -> Position:
    """Where the window ``phase_id`` stands ``elapsed_s`` after its load began (its load
    and then its cooldown). Pure."""
    crossover = config.until == "decided"
    levels = plan.levels(config.load)
    load_s = float(config.timings.load_s)
    restart_s, cooldown_s = pace(events, float(config.timings.cooldown_max_s))
    window_s = load_s + cooldown_s

    def left_after(sequence: list[plan.Phase], k: int) -> float:
        later = sequence[k:]
        jobs = {(p.rep, p.arm) for p in later} - {(sequence[k - 1].rep, sequence[k - 1].arm)}
        return len(later) * window_s + len(jobs) * restart_s

    look = plan.phases(order, look_repeats, crossover, levels)
    k = 1 + next(i for i, p in enumerate(look) if p.id == phase_id)
    phase_left = max(load_s - elapsed_s, 0.0) + max(cooldown_s - max(elapsed_s - load_s, 0.0), 0.0)
    look_left = phase_left + left_after(look, k)
    if crossover:
        everything = plan.phases(order, max(config.max_repeats, look_repeats), crossover, levels)
        run_left = phase_left + left_after(everything, k)
    else:
        run_left = look_left
    return Position(phase_id, k, len(look), phase_left, look_left, run_left, crossover)


def duration(seconds: float) -> str:
    """``1 h 05 min``, ``12 min``, ``40 s``: as precise as an estimate deserves."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(round(seconds), 0)
    if seconds < 90:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def hottest(readings: dict[str, float]) -> str:
    if not readings:
        return "no thermal sample yet"
    name = max(readings, key=readings.get)
    return f"hottest {name} {readings[name]:.1f} °C"


def line(where: Position, config: Config, arm: str, readings: dict[str, dict[str, float]], head: str) -> str:
    """The run-level part of the progress line."""
    label = config.arms[arm].label
    run = f"run {'≤ ' if where.run_bounded else ''}{duration(where.run_left_s)}"
    look = f"look {duration(where.look_left_s)}, " if where.run_bounded else ""
    return (
        f"phase {where.k} of {where.n} ({where.phase}, {label}), {head} {hottest(readings.get(head, {}))}"
        f"; ETA phase {duration(where.phase_left_s)}, {look}{run}"
    )


def write_status(path: Path, where: Position, arm: str, elapsed_s: float, readings: dict) -> None:
    """status.json, replaced whole (a reader never sees half of it)."""
    record = {
        **asdict(where),
        "t": time.time(),
        "arm": arm,
        "elapsed_s": round(elapsed_s, 1),  # since the window's load began
        "readings": readings,
    }
    partial = path.with_suffix(".json.part")
    partial.write_text(json.dumps(record, indent=1))
    os.replace(partial, path)
