"""Each arm at rest (docs/design.md, "Each arm at rest"): the idle window after each restart
(``timings.idle_s``, between the marks ``idle_start`` and ``idle_end``), measured as the load
window is: per phase and host, the timeline zone's mean, the vLLM CPU median and the mean
power of the host's total, as metrics named ``... at rest`` (``metric_names.at_rest``) that
the variance table, the verdicts and the questions treat like the load's.  Pure functions."""

import pandas as pd

from thermab import metric_names as names
from thermab.analysis import energy, metrics
from thermab.analysis.model import Telemetry


def idle_windows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per phase with its idle window, in the columns of a load window."""
    return metrics.load_windows(events, "idle_start", "idle_end")


def rest_metrics(
    telemetry: Telemetry | pd.DataFrame, events: pd.DataFrame, hosts: list[str], zone: str
) -> pd.DataFrame:
    """The per-phase metrics of the idle windows, long (order, rep, arm, metric, unit, value)."""
    windows = idle_windows(events)
    if windows.empty:
        return metrics.no_metrics()
    zones, cpu = metrics.zone_stats(telemetry, windows), metrics.cpu_stats(telemetry, windows)
    totals = energy.host_totals(energy.energy_table(telemetry, windows, events, None, hosts))
    parts = []
    for host in hosts:
        zone_mean = zones[(zones["host"] == host) & (zones["sensor"] == zone)]
        parts.append(metrics.long(zone_mean, "mean_c", names.at_rest(names.zone_mean(host, zone)), "°C"))
        parts.append(
            metrics.long(cpu[cpu["host"] == host], "median_pct", names.at_rest(names.cpu_median(host)), "% of one core")
        )
        parts.append(metrics.long(totals[totals["host"] == host], "mean_w", names.at_rest(names.power(host)), "W"))
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"]).reset_index(drop=True)
