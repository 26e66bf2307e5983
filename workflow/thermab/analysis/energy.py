"""Energy per phase: the ``power`` rows of the tidy telemetry -> ``tables/energy.csv``.

Definitions (docs/design.md), per host, power domain and phase:

* ``mean_w``: time-weighted mean of the domain's power samples inside the load window
  ``[load_start, load_end)``: the trapezoid over them divided by the span they cover (a
  single sample is its own mean);
* ``energy_j`` = mean_w × window_s;
* ``idle_w``: the same mean over the baseline window ``[baseline_start, baseline_end)``;
* ``energy_above_idle_j`` = energy_j − idle_w × window_s;
* ``output_tokens``: the tokens generated inside the load window, the ones its energy paid
  for: each ok request of the phase (load and probe) counts the share of its
  ``completion_tokens`` that falls in the window, its tokens spread evenly from its first
  token to its end (:func:`tokens_in_window`);
* ``j_per_token`` = energy_j / output_tokens, ``j_per_token_above_idle`` likewise.

Not the tokens of the requests that *ended* in the window (throughput's count, as the study
counted): those leave out the requests still in flight at ``load_end`` whose energy the
window holds, and come in whole requests.  At the study's 30 minutes that is a few tenths
of a percent; in a 60-s window of the simulated cluster (some 31 requests of 400 tokens) it
read J/token 6 % high and moved it by a request's 3 % from phase to phase, three times the
spread of the energy itself.

A domain with no samples in a window has empty values there, never zero; a phase without
tokens has no J/token.  The rows with host ``all``, domain ``total`` sum each host's total:
its meters at the wall where it has any (``wall-N``, polled by the controller), else its
``node`` domain where it has one, else its module meters (a Grace Hopper module holds its
GPU and Grace socket), else its cpu, dram and gpu domains (``package-N``, ``dram-N``, ``gpuN``,
a Grace or Altra socket's meter), never a rail, a sub-domain (``package-0/core``) or another
reading (``psys``, ``hwmon/...``) that overlaps them (thermab.telemetry.power).  ``scope``
says what each row covers: a domain's scope (``module``, ``cpu``, ``gpu``, ``rail`` ...) and the
domain holding it where one does (``gpu in <module>``); on the total row each host's scopes.
A host without such domains is left out of the sum (the summary names the hosts it covers);
a host total with a domain empty in a phase makes that phase's total empty, as a partial sum
would read as less energy.  Where a host has meters at the wall, rows with domain
``onboard`` beside the total sum the same hosts' totals without them (what the boards'
own meters see), so J/token is reported at the wall and on board side by side.  Pure
functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from thermab import metric_names as names
from thermab.analysis.metrics import PHASE_KEYS, PHASE_METRIC_COLUMNS, each_window, phase_rows, tokens_in_window
from thermab.analysis.model import Telemetry, as_telemetry
from thermab.contracts import MeterRecord
from thermab.telemetry.agent import domain_scope
from thermab.telemetry.power import (
    WALL_SCOPE,
    container,
    host_total_domains,
    time_weighted_mean,
    total_scope,
)

ENERGY_COLUMNS = PHASE_KEYS + [
    "host",
    "domain",
    "window_s",
    "mean_w",
    "energy_j",
    "idle_w",
    "energy_above_idle_j",
    "output_tokens",
    "j_per_token",
    "j_per_token_above_idle",
    "scope",
]
TOTAL_HOST, TOTAL_DOMAIN = "all", "total"
# beside a total held by meters at the wall: the same sum of the meters on the boards alone
ONBOARD_DOMAIN = "onboard"
FED = "in the wall meter of"  # a total row's scope of a host another host's meter feeds too
METRIC = names.CLUSTER_ENERGY_PER_TOKEN
METRIC_UNIT = "J/token"


class EnergyRow(TypedDict):
    """A row of energy.csv (``ENERGY_COLUMNS``)."""

    order: str
    rep: int
    arm: str
    host: str
    domain: str
    window_s: float
    mean_w: float
    energy_j: float
    idle_w: float
    energy_above_idle_j: float
    output_tokens: float
    j_per_token: float
    j_per_token_above_idle: float
    scope: str


def baseline_window(events: pd.DataFrame) -> tuple[float, float] | None:
    """``[baseline_start, baseline_end)``: the last baseline_start and the first baseline_end
    after it (a baseline redone after a failure is the one measured); None without one."""
    if events.empty or "event" not in events:
        return None
    starts = events.loc[events["event"] == "baseline_start", "t"]
    if starts.empty:
        return None
    ends = events.loc[(events["event"] == "baseline_end") & (events["t"] > starts.max()), "t"]
    return None if ends.empty else (float(starts.max()), float(ends.min()))


def _series(power: pd.DataFrame) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(host, domain) -> (t, watts) sorted by time, so that windows are cut by bisection."""
    series = {}
    for (host, domain), rows in power.groupby(["host", "sensor"], sort=True):
        rows = rows.sort_values("t", kind="stable")
        series[(str(host), str(domain))] = (rows["t"].to_numpy(float), rows["value"].to_numpy(float))
    return series


def _mean_in(series: tuple[np.ndarray, np.ndarray], start: float, end: float) -> float:
    t, value = series
    first, last = np.searchsorted(t, start, side="left"), np.searchsorted(t, end, side="left")
    return time_weighted_mean(t[first:last], value[first:last])


def _per_token(joules: float, tokens: float) -> float:
    return joules / tokens if not pd.isna(tokens) and tokens > 0 else np.nan


def energy_table(
    telemetry: Telemetry | pd.DataFrame,
    windows: pd.DataFrame,
    events: pd.DataFrame,
    requests: pd.DataFrame | None,
    hosts: list[str] | None = None,
    meters: list[MeterRecord] | None = None,
) -> pd.DataFrame:
    """energy.csv: one row per phase, host and power domain seen in the run, then the
    ``all``/``total`` row of the phase; phases in time order, hosts in the order of ``hosts``
    (others after them, sorted).  ``telemetry``: a model.Telemetry or the tidy frame;
    ``requests``: the run's (tidy/requests.parquet), None when it has none; ``meters``: the
    wall meters' records (:func:`wall_meter_records`), which say what each ``wall-N`` row is
    and which hosts a meter at the wall of another host feeds too (their own totals are
    inside that meter's, never added to it)."""
    meters = meters or []
    fed = {other: m["host"] for m in meters for other in m.get("feeds") or [] if other != m["host"]}
    described = {(m["host"], m["domain"]): meter_text(m) for m in meters}
    power = as_telemetry(telemetry).frame(kind="power")
    if power.empty or windows.empty:
        return pd.DataFrame(columns=ENERGY_COLUMNS)
    series = _series(power)
    present = sorted({host for host, _ in series})
    host_order = [h for h in (hosts or []) if h in present] + [h for h in present if h not in (hosts or [])]
    domains = {host: sorted(d for h, d in series if h == host) for host in host_order}
    scopes = {
        (host, d): domain_scope_text(d, domains[host])
        + (f" ({described[(host, d)]})" if (host, d) in described else "")
        for host in host_order
        for d in domains[host]
    }
    total_text = "; ".join(
        f"{host}: {FED} {fed[host]}" if host in fed else f"{host}: {' + '.join(total_scope(domains[host])[1])}"
        for host in host_order
        if host_total_domains(domains[host])
    )
    onboard = {host: on_board(domains[host]) for host in host_order}
    onboard_text = "; ".join(
        f"{host}: {' + '.join(total_scope(summed)[1])}"
        for host, summed in onboard.items()
        if host_total_domains(summed)
    )
    walled = any(onboard[host] != domains[host] for host in host_order) or bool(fed)
    baseline = baseline_window(events)
    idle = {key: _mean_in(s, *baseline) if baseline else np.nan for key, s in series.items()}
    measured = None if requests is None or requests.empty else requests
    phases = phase_rows(measured) if measured is not None else {}
    rows: list[EnergyRow] = []
    for window in each_window(windows):
        keys = (window.order, window.rep, window.arm)
        output_tokens = tokens_in_window(measured.iloc[phases.get(keys, [])] if measured is not None else None, window)
        phase: list[EnergyRow] = []
        for host in host_order:
            for domain in domains[host]:
                mean_w = _mean_in(series[(host, domain)], window.load_start, window.load_end)
                idle_w = idle[(host, domain)]
                phase.append(
                    _row(keys, host, domain, window.window_s, mean_w, idle_w, output_tokens, scopes[(host, domain)])
                )
        rows += phase
        total = _total([row for row in phase if row["host"] not in fed], domains)
        if total is not None:
            rows.append(_row(keys, TOTAL_HOST, TOTAL_DOMAIN, window.window_s, *total, output_tokens, total_text))
        total = _total(phase, onboard) if walled else None
        if total is not None:
            rows.append(_row(keys, TOTAL_HOST, ONBOARD_DOMAIN, window.window_s, *total, output_tokens, onboard_text))
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)


def wall_meter_records(preflight: Mapping[str, Any] | None) -> list[MeterRecord]:
    """The wall meters preflight.json keeps with each host's facts (telemetry/wall_meters.py's
    ``Meter.record``: host, domain, kind, where, feeds, update_s)."""
    hosts = (preflight or {}).get("hosts") or {}
    return [meter for facts in hosts.values() for meter in facts.get("wall_meters") or []]


def meter_text(meter: MeterRecord) -> str:
    """``shelly http://plug-a, its reading refreshed every 1 s, feeds head + worker``."""
    update = f", its reading refreshed every {meter['update_s']:g} s" if meter.get("update_s") else ""
    feeds = meter.get("feeds") or [meter["host"]]
    return f"{meter['kind']} {meter['where']}{update}" + (f", feeds {' + '.join(feeds)}" if len(feeds) > 1 else "")


def on_board(domains: list[str]) -> list[str]:
    """A host's domains less its meters at the wall: what its own boards measure."""
    return [domain for domain in domains if not is_wall(domain)]


def is_wall(domain: str) -> bool:
    """A meter outside the host (``wall-N``), read by the controller."""
    return domain_scope(domain)[0] == WALL_SCOPE


def domain_scope_text(domain: str, domains: list[str]) -> str:
    """``module``, or ``gpu in hwmon/power_meter@ACPI000D:00/Module Power Socket 0``."""
    holder = container(domain, domains)
    return domain_scope(domain)[0] + (f" in {holder}" if holder else "")


def _row(
    keys: tuple[str, int, str],
    host: str,
    domain: str,
    window_s: float,
    mean_w: float,
    idle_w: float,
    output_tokens: float,
    scope: str,
) -> EnergyRow:
    energy_j = mean_w * window_s
    above_j = energy_j - idle_w * window_s
    order, rep, arm = keys
    return EnergyRow(
        order=order,
        rep=rep,
        arm=arm,
        host=host,
        domain=domain,
        window_s=window_s,
        mean_w=mean_w,
        energy_j=energy_j,
        idle_w=idle_w,
        energy_above_idle_j=above_j,
        output_tokens=output_tokens,
        j_per_token=_per_token(energy_j, output_tokens),
        j_per_token_above_idle=_per_token(above_j, output_tokens),
        scope=scope,
    )


def _total(phase: list[EnergyRow], domains: dict[str, list[str]]) -> tuple[float, float] | None:
    """(mean_w, idle_w) of the cluster total in one phase, or None when no host has a total;
    NaN (never a partial sum) when a domain of a host total is empty."""
    summed = [row for row in phase if row["domain"] in host_total_domains(domains[row["host"]])]
    if not summed:
        return None
    return float(np.sum([row["mean_w"] for row in summed])), float(np.sum([row["idle_w"] for row in summed]))


def total_hosts(energy: pd.DataFrame) -> dict[str, list[str]]:
    """Host -> the domains its total sums, for the hosts the ``all``/``total`` rows cover."""
    hosts = energy.loc[energy["host"] != TOTAL_HOST, ["host", "domain"]].drop_duplicates()
    covered = {
        str(host): host_total_domains(rows["domain"].tolist()) for host, rows in hosts.groupby("host", sort=False)
    }
    scopes = energy.loc[(energy["host"] == TOTAL_HOST) & (energy["domain"] == TOTAL_DOMAIN), "scope"]
    inside = {
        part.split(":")[0] for text in scopes.dropna().unique() for part in text.split("; ") if f": {FED} " in part
    }
    return {host: summed for host, summed in covered.items() if summed and host not in inside}


def host_scopes(energy: pd.DataFrame) -> dict[str, tuple[list[str], list[str]]]:
    """Host -> (the scopes its total sums, the parts of the node they hold), for the hosts the
    ``all``/``total`` rows cover."""
    hosts = energy.loc[energy["host"] != TOTAL_HOST, ["host", "domain"]].drop_duplicates()
    found = {str(host): total_scope(rows["domain"].tolist()) for host, rows in hosts.groupby("host", sort=False)}
    return {host: (scopes, holds) for host, (summed, scopes, holds) in found.items() if summed}


def host_totals(energy: pd.DataFrame) -> pd.DataFrame:
    """Per phase and host, the mean power of the host's total (phase keys, host, mean_w),
    empty where one of its domains is; hosts in the table's order."""
    covered = total_hosts(energy)
    summed = energy[
        [domain in covered.get(host, ()) for host, domain in zip(energy["host"], energy["domain"], strict=False)]
    ]
    grouped = summed.groupby(PHASE_KEYS + ["host"], sort=False)["mean_w"]
    return grouped.sum().where(grouped.count() == grouped.size()).reset_index()


def phase_metrics(energy: pd.DataFrame) -> pd.DataFrame:
    """J/token of the cluster total per phase, in the long format of metrics.phase_metrics,
    so that the variance table and the verdicts treat it like the other metrics."""
    total = energy[(energy["host"] == TOTAL_HOST) & (energy["domain"] == TOTAL_DOMAIN)]
    long = total[PHASE_KEYS].assign(metric=METRIC, unit=METRIC_UNIT, value=total["j_per_token"].astype(float))
    return long.reindex(columns=PHASE_METRIC_COLUMNS).dropna(subset=["value"]).reset_index(drop=True)
