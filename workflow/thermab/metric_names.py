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
RUN_METRICS = (OUTPUT_THROUGHPUT, PROBE_DECODE_SPEED, STALL_GAPS, CLUSTER_ENERGY_PER_TOKEN)  # one per run
CPU_MEDIAN = "vLLM CPU median"


def zone_mean(host: str, zone: str) -> str:
    """The mean of ``zone`` on ``host`` over the load window (e.g. "head TSOC mean")."""
    return f"{host} {zone} mean"


def cpu_median(host: str) -> str:
    """The median vLLM CPU of ``host`` over the load window (e.g. "head vLLM CPU median")."""
    return f"{host} {CPU_MEDIAN}"


def host_of(metric: str) -> str | None:
    """The host a per-host metric (``zone_mean``, ``cpu_median``) names; None for any other
    name (a run metric, or one that is neither)."""
    host, _, rest = metric.partition(" ")
    zone, _, mean = rest.rpartition(" ")
    return host if rest == CPU_MEDIAN or (mean == "mean" and re.fullmatch(r"\S+", zone)) else None
