"""The names of the per-phase metrics the arms are compared on (``variance.csv``'s
``metric``, the verdicts, the best setting, the fleet report, the dose response, the
questions a config declares): one owner, so a name is never rebuilt by hand where it is
looked up.  A bottom room: the config checks a question's metric against it."""

from __future__ import annotations

import re

OUTPUT_THROUGHPUT = "output throughput"
PROBE_DECODE_SPEED = "probe decode speed"
STALL_GAPS = "stall gaps"
CLUSTER_ENERGY_PER_TOKEN = "cluster energy per token"
TTFT_MEDIAN = "TTFT median"  # of the load's own requests: a level's latency, whatever its shape
# speed taken apart, from the server's /metrics (analysis/speed.py)
ACCEPTANCE_LENGTH = "acceptance length"
ENGINE_STEPS = "engine steps per second"
TOKENS_PER_STEP = "tokens per step"
# the probes' own tokens per decode step, counted by the client (analysis/metrics.py): the
# acceptance that the probes behind probe decode speed drew, request by request
PROBE_ACCEPTANCE_LENGTH = "probe acceptance length"
RUN_METRICS = (
    OUTPUT_THROUGHPUT,
    PROBE_DECODE_SPEED,
    STALL_GAPS,
    CLUSTER_ENERGY_PER_TOKEN,
    TTFT_MEDIAN,
    ACCEPTANCE_LENGTH,
    ENGINE_STEPS,
    TOKENS_PER_STEP,
    PROBE_ACCEPTANCE_LENGTH,
)  # one per run
# Speed and energy per token: their spread is between server restarts (docs/simulation.md,
# "Restart variance"), and none of them grows with the window as a heat-up ramp's mean or a
# count of gaps does.  So a look with only their questions open may run a shorter window
# (analysis/phase_length.py), and they pool phases of every length; every other metric
# pools only the phases of the run's full window.
BETWEEN_RESTARTS = frozenset(
    {
        OUTPUT_THROUGHPUT,
        PROBE_DECODE_SPEED,
        CLUSTER_ENERGY_PER_TOKEN,
        ACCEPTANCE_LENGTH,
        ENGINE_STEPS,
        TOKENS_PER_STEP,
        PROBE_ACCEPTANCE_LENGTH,
    }
)
# What a server start draws moves these three through the drafter's acceptance, which a
# setting that leaves the model's numerics alone cannot move: their arm effect is adjusted
# for the per-phase covariates of ``analysis.covariates`` (analysis/speed.py, ANCOVA).
ADJUSTED = (OUTPUT_THROUGHPUT, PROBE_DECODE_SPEED, CLUSTER_ENERGY_PER_TOKEN)
CPU_MEDIAN = "vLLM CPU median"
# Latency as vllm bench serve reports it (load/latency.py), per phase: a percentile of each
# over the window's load requests (TTFT, TPOT, E2EL) or over all its inter-token gaps (ITL),
# in ms, e.g. "p99 ITL"; and with load.slo the share of requests meeting it, in %.
LATENCY_PERCENTILES = (50, 90, 99)
LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}
GOODPUT = "goodput"


def latency(percentile: int, name: str) -> str:
    """A latency percentile's metric (e.g. ``latency(99, "itl")`` is "p99 ITL")."""
    return f"p{percentile} {LATENCY_NAMES[name]}"


LATENCY_METRICS = tuple(latency(p, name) for name in LATENCY_NAMES for p in LATENCY_PERCENTILES)


def zone_mean(host: str, zone: str) -> str:
    """The mean of ``zone`` on ``host`` over the load window (e.g. "head TSOC mean")."""
    return f"{host} {zone} mean"


def cpu_median(host: str) -> str:
    """The median vLLM CPU of ``host`` over the load window (e.g. "head vLLM CPU median")."""
    return f"{host} {CPU_MEDIAN}"


AT_REST = " at rest"  # a metric of each arm's idle window after its restart (timings.idle_s)


def at_rest(metric: str) -> str:
    """``metric`` over the idle window after the restart (e.g. "head vLLM CPU median at rest")."""
    return metric + AT_REST


def power(host: str) -> str:
    """The mean power of ``host``'s total (e.g. "head power"), measured at rest."""
    return f"{host} power"


def rest_host(metric: str) -> str | None:
    """The host an ``at_rest`` metric names (a zone mean, vLLM CPU median or power); None
    for any other name."""
    if not metric.endswith(AT_REST):
        return None
    base = metric.removesuffix(AT_REST)
    host, _, rest = base.partition(" ")
    return host if rest == "power" else host_of(base)


def ttft_after(gap_s: float) -> str:
    """The median time to first token of a phase's wake-up probes after ``gap_s`` of idle
    (e.g. "TTFT after 0.1 s idle")."""
    return f"TTFT after {gap_s:g} s idle"


def wakeup_penalty(gap_s: float, step: bool = False) -> str:
    """A phase's wake-up penalty after ``gap_s`` of idle: its probes' median TTFT after the
    gap less its back-to-back probes' (e.g. "wake-up penalty after 0.01 s"), or with ``step``
    the same of the first decode step ("first-step wake-up penalty after 0.01 s")."""
    return f"{'first-step ' if step else ''}wake-up penalty after {gap_s:g} s"


def gap_of(metric: str) -> float | None:
    """The idle gap a ``ttft_after`` or ``wakeup_penalty`` name names; None for any other name."""
    found = re.fullmatch(r"TTFT after (\S+) s idle", metric) or re.fullmatch(
        r"(?:first-step )?wake-up penalty after (\S+) s", metric
    )
    try:
        return float(found[1]) if found else None
    except ValueError:
        return None


def host_of(metric: str) -> str | None:
    """The host a per-host metric (``zone_mean``, ``cpu_median``) names; None for any other
    name (a run metric, or one that is neither)."""
    host, _, rest = metric.partition(" ")
    zone, _, mean = rest.rpartition(" ")
    return host if rest == CPU_MEDIAN or (mean == "mean" and re.fullmatch(r"\S+", zone)) else None
