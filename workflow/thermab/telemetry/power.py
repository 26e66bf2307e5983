"""The agent's power rows -> ``power`` rows in watts, one series per domain (docs/design.md).

The agent writes each power reading or energy counter under the sensor ``<domain> <quantity>``
(``thermab.telemetry.agent.power_sensor``): ``W`` readings pass through; a counter (``uJ``,
``mJ``, ``uJ:max=N``) becomes one row per pair of consecutive readings, Δenergy / Δt, at the
midpoint of the pair, the mean power over that interval.  A counter that went down wrapped
(added back: N + 1, as it counts 0..N) where it has a range, and was reset (a driver reload;
that interval is skipped and counted) where it has none.  Every watt, read or derived from a
counter, is held to its domain's bound (``thermab.telemetry.agent.watt_bound``, the one
owner): a reading outside 0..bound is not used, and a counter interval that implies such a
watt (a counter read wrong once, as 2^64 − 1 or ACPI's unknown, or reset) is skipped, both
counted.  Where a domain has both a counter
and readings, the counter is used: it holds all the energy between samples, a reading only
the moment it was taken.  Pure functions on frames; ingest does the I/O.

Each domain has a scope (``thermab.telemetry.agent.domain_scope``: wall, node, module, cpu,
gpu, dram, rail, part, other).  A host's total power sums its meters at the wall where it
has any (``wall-N``: a plug, PDU outlet or BMC, which hold everything on the host, the
power supply's loss included), else its ``node`` domain where it has one,
else its module meters where it has any (a Grace Hopper module holds its Grace socket and
its GPU, so those are contained, never added to it), else its cpu, dram and gpu domains;
never a rail, a sub-domain or another reading that overlaps them (``host_total_domains``;
analysis/energy.py explains the choice, docs/power.md the sources).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from thermab.telemetry.agent import POWER_UNITS, domain_scope, watt_bound

JOULES_PER_UNIT = {"uJ": 1e-6, "mJ": 1e-3}
NODE_DOMAIN = "node"
WALL_SCOPE = "wall"  # meters outside the host (telemetry/wall_meters.py): they hold everything on it
SUMMED_SCOPES = ("cpu", "dram", "gpu")  # disjoint parts of a node without a node or module meter
# the parts of a node each scope holds: a total whose domains hold no "cpu" leaves the CPU out
SCOPE_HOLDS = {
    "wall": ("cpu", "gpu", "memory", "the rest of the node", "the power supply's loss"),
    "node": ("cpu", "gpu", "memory", "the rest of the node"),
    "module": ("cpu", "gpu", "memory"),
    "cpu": ("cpu",),
    "gpu": ("gpu",),
    "dram": ("memory",),
}
IDLE_BEFORE_S = 10.0  # a host's idle power before a restart: its total over this long
SENSOR = re.compile(r"^(?P<domain>.+) (?P<unit>{})(?::max=(?P<max>\d+))?$".format("|".join(POWER_UNITS)))


def split_sensor(sensor: str) -> tuple[str, str, int | None] | None:
    """``"package-0 uJ:max=262143328850"`` -> ("package-0", "uJ", 262143328850); None when the
    name is not a power sensor of the agent's grammar."""
    match = SENSOR.match(sensor)
    if not match:
        return None
    wrap = match.group("max")
    return match.group("domain"), match.group("unit"), None if wrap is None else int(wrap)


def counter_power(
    t: np.ndarray, raw: np.ndarray, joules_per_unit: float, wrap_max: int | None, bound_w: float = math.inf
) -> tuple[np.ndarray, np.ndarray, int]:
    """(midpoint times, watts, intervals skipped) of one counter's readings.  Skipped: a
    counter without a range that went down (a reset), and any interval whose watts lie
    outside 0..``bound_w`` (the domain's ``agent.watt_bound``) once a wrap is added back: a
    counter read wrong once (2^64 − 1, ACPI's unknown) or reset, never energy."""
    order = np.argsort(t, kind="stable")
    t, raw = np.asarray(t, float)[order], np.asarray(raw, float)[order]
    delta, dt = np.diff(raw), np.diff(t)
    went_down = delta < 0
    if wrap_max is not None:
        delta = np.where(went_down, delta + wrap_max + 1, delta)
        skipped = np.zeros_like(went_down)
    else:
        skipped = went_down
    timed = dt > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        watts = np.where(timed, delta * joules_per_unit / np.where(timed, dt, 1.0), np.nan)
    skipped = skipped | (timed & ~((watts >= 0) & (watts <= bound_w)))
    keep = ~skipped & timed
    middle = (t[:-1] + t[1:]) / 2
    return middle[keep], watts[keep], int(skipped.sum())


def power_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Tidy rows of one agent power file (t, host, kind, sensor = ``<domain> <quantity>``, value;
    values present) -> power rows with sensor = domain, and what was left out, counted."""
    if frame.empty:
        return frame, {}
    parsed = frame["sensor"].map(split_sensor)
    notes: dict[str, int] = {}
    unknown = parsed.isna()
    if unknown.any():
        for host, n in frame.loc[unknown, "host"].value_counts().items():
            notes[f"{host}/power: not a power sensor name"] = int(n)
    rows = frame[~unknown].assign(
        domain=parsed[~unknown].str[0], unit=parsed[~unknown].str[1], wrap=parsed[~unknown].str[2]
    )
    parts = []
    for (host, domain), series in rows.groupby(["host", "domain"], sort=True):
        counters = series[series["unit"] != "W"]
        if len(counters) >= 2:
            (unit, wrap), counter = next(iter(counters.groupby(["unit", "wrap"], dropna=False, sort=True)))
            t, watts, resets = counter_power(
                counter["t"].to_numpy(),
                counter["value"].to_numpy(),
                JOULES_PER_UNIT[unit],
                None if pd.isna(wrap) else int(wrap),
                watt_bound(domain),
            )
            if resets:
                notes[
                    f"{host}/power: {domain} counter went back (reset) or implied watts outside "
                    f"0-{watt_bound(domain):g} W, interval skipped"
                ] = resets
            readings = (series["unit"] == "W").sum()
            if readings:
                notes[f"{host}/power: {domain} W readings not used (its energy counter is)"] = int(readings)
        else:
            readings = series[series["unit"] == "W"]
            t, watts = readings["t"].to_numpy(float), readings["value"].to_numpy(float)
            plausible = (watts >= 0) & (watts <= watt_bound(domain))  # the agent's bound, for rows from elsewhere
            if not plausible.all():
                notes[f"{host}/power: {domain} W readings outside 0-{watt_bound(domain):g} W, not used"] = int(
                    (~plausible).sum()
                )
                t, watts = t[plausible], watts[plausible]
        parts.append(pd.DataFrame({"t": t, "host": host, "kind": "power", "sensor": domain, "value": watts}))
    if not parts:
        return frame.iloc[:0], notes
    return pd.concat(parts, ignore_index=True).astype({"t": "float64", "value": "float64"}), notes


def host_total_domains(domains) -> list[str]:
    """The domains whose sum is a host's total power (see the module docstring)."""
    walls = sorted(domain for domain in domains if domain_scope(domain)[0] == WALL_SCOPE)
    if walls:
        return walls
    if NODE_DOMAIN in domains:
        return [NODE_DOMAIN]
    scopes = {domain: domain_scope(domain)[0] for domain in domains}
    modules = sorted(domain for domain, scope in scopes.items() if scope == "module")
    return modules or sorted(domain for domain, scope in scopes.items() if scope in SUMMED_SCOPES)


def container(domain: str, domains) -> str | None:
    """The domain of ``domains`` whose reading holds ``domain``'s, None where none does: the
    node holds every other; a Grace socket its rails; a module its Grace socket, rails, DRAM
    and GPUs (the module of the same number, else the first); a RAPL package its sub-domains
    (``package-0/core``)."""
    scope, socket = domain_scope(domain)
    if scope == WALL_SCOPE:
        return None
    walls = sorted(d for d in domains if domain_scope(d)[0] == WALL_SCOPE)
    if walls and (scope != "part" or domain.split("/")[0] not in domains):
        # a host's meters at the wall hold all of it (its own sub-domains stay with their parent)
        return walls[0] if len(walls) == 1 else " + ".join(walls)
    if domain == NODE_DOMAIN:
        return None
    if NODE_DOMAIN in domains:
        return NODE_DOMAIN
    if scope == "part" and domain.split("/")[0] in domains:
        return domain.split("/")[0]
    if scope not in ("cpu", "gpu", "dram", "rail"):
        return None
    holders = [d for d in sorted(domains) if d != domain and domain_scope(d) == ("cpu", socket)]
    holders = (holders if scope == "rail" and socket is not None else []) + [
        d for d in sorted(domains) if domain_scope(d)[0] == "module"
    ]
    same_socket = [d for d in holders if domain_scope(d)[1] == socket]
    return (same_socket or holders or [None])[0]


def total_scope(domains) -> tuple[list[str], list[str], list[str]]:
    """(the domains of a host's total, their scopes, the parts of the node they hold)."""
    summed = host_total_domains(domains)
    scopes = sorted({domain_scope(domain)[0] for domain in summed})
    holds = sorted({part for scope in scopes for part in SCOPE_HOLDS.get(scope, ())})
    return summed, scopes, holds


def time_weighted_mean(t: np.ndarray, value: np.ndarray) -> float:
    """Trapezoid over the samples divided by the span they cover; NaN without samples."""
    if len(t) == 0:
        return np.nan
    if len(t) == 1 or t[-1] == t[0]:
        return float(np.mean(value))
    return float(np.trapezoid(value, t) / (t[-1] - t[0]))


def total_watts(series: dict[str, tuple[np.ndarray, np.ndarray]], start: float, end: float) -> float:
    """W: a host's total power over ``[start, end)``, from domain → (t, watts) sorted by t:
    the sum of its total domains' time-weighted means; NaN where it has none or one has no
    sample there (a partial sum would read as less power)."""
    domains = host_total_domains(series)
    means = []
    for domain in domains:
        t, value = series[domain]
        inside = (t >= start) & (t < end)
        means.append(time_weighted_mean(t[inside], value[inside]))
    return float(np.sum(means)) if domains and not np.isnan(means).any() else np.nan


def recent_total_watts(rows, seconds: float) -> float:
    """W: a host's total power over the last ``seconds`` of its agent's power rows ((t,
    sensor, value) as the agent writes them, host time): what a phase records before it
    restarts the server, with no clock offset to apply."""
    rows = pd.DataFrame(list(rows), columns=["t", "sensor", "value"])
    if rows.empty:
        return np.nan
    watts, _notes = power_rows(rows.assign(host="host", kind="power"))
    if watts.empty:
        return np.nan
    series = {
        str(domain): (part["t"].to_numpy(float), part["value"].to_numpy(float))
        for domain, part in watts.sort_values("t", kind="stable").groupby("sensor", sort=True)
    }
    end = float(rows["t"].max()) + 1e-9  # the newest reading counts
    return total_watts(series, end - seconds, end)


def domain_sources(sensors_of: dict[str, list[str]]) -> dict[str, str]:
    """The agent source (its file) each power domain's watts come from, given the raw sensor
    names of each source: by ``power_rows``' rule, a domain's counter over its readings."""
    found: dict[str, tuple[str, str]] = {}
    for source, sensors in sorted(sensors_of.items()):
        for sensor in sensors:
            parsed = split_sensor(sensor)
            if parsed is not None and (parsed[0] not in found or (parsed[1] != "W" and found[parsed[0]][1] == "W")):
                found[parsed[0]] = (source, parsed[1])
    return {domain: source for domain, (source, _unit) in found.items()}
