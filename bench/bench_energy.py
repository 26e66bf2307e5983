"""How accurate is the energy of a load window, sampled every 1, 5 or 15 s?

Synthetic power traces with a known integral (ground truth at 1 ms), idle outside the load
window and under load inside it, so that power steps at the window's edges as it does in a
phase:

- ``steps``: the load level changes every 5-60 s between 150 and 350 W (batch size moving);
- ``spikes``: 200 W with 0.5-s spikes of +300 W, one every 10 s on average;
- ``ripple``: 300 W ± 100 W at a 1-s period.

Each is sampled the two ways the agent reads power, and turned into the window's energy by
the package's own code (``telemetry.power.counter_power``, ``analysis.energy``'s mean rule,
energy = mean_w × window_s):

- ``reading``: the instantaneous power at each sample (hwmon ``power*_input``, IPMI);
- ``counter``: a cumulative energy counter read at each sample (RAPL, hwmon ``energy*_input``,
  NVML), Δenergy/Δt at ingest.

Sample times follow the agent's clock: the next sample is due one interval after the last
one was taken, and the loop wakes up to 50 ms late, so the phase drifts; ``--ideal-clock``
samples strictly periodically instead (the worst case for a ripple at the sampling period).
Prints, per trace, interval and window length, the mean and the largest |error| in % over
``--trials`` random traces and sampling phases, and which intervals stay within 1 %.

    python bench/bench_energy.py [--trials 100] [--windows 60 1800] [--ideal-clock] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

import numpy as np  # noqa: E402

from thermab.analysis.energy import time_weighted_mean  # noqa: E402
from thermab.telemetry.power import counter_power  # noqa: E402

DT = 0.001  # ground-truth resolution (s)
MARGIN_S = 60.0  # idle before and after the window
IDLE_W = 80.0
INTERVALS = (1.0, 5.0, 15.0)
LATE_S = 0.05  # the agent's loop wakes up to this late (its sleep floor)


def trace(kind: str, window_s: float, rng: np.random.Generator) -> np.ndarray:
    """Power at every DT over [0, window_s + 2 MARGIN_S); the load window is [MARGIN_S, MARGIN_S + window_s)."""
    t = np.arange(0.0, window_s + 2 * MARGIN_S, DT)
    inside = (t >= MARGIN_S) & (t < MARGIN_S + window_s)
    load = np.empty_like(t)
    if kind == "steps":
        edges = np.cumsum(rng.uniform(5, 60, size=int(window_s / 5) + 2)) + MARGIN_S
        levels = rng.uniform(150, 350, size=len(edges) + 1)
        load = levels[np.searchsorted(edges, t)]
    elif kind == "spikes":
        load[:] = 200.0
        starts = MARGIN_S + np.sort(rng.uniform(0, window_s, size=rng.poisson(window_s / 10)))
        for first in (starts / DT).astype(int):
            load[first : first + round(0.5 / DT)] += 300.0
    elif kind == "ripple":
        load = 300.0 + 100.0 * np.sin(2 * np.pi * t / 1.0 + rng.uniform(0, 2 * np.pi))
    else:
        raise ValueError(kind)
    return np.where(inside, load, IDLE_W)


def sample_times(interval: float, total_s: float, rng: np.random.Generator, ideal: bool) -> np.ndarray:
    count = int(total_s / interval) + 2
    steps = np.full(count, interval) if ideal else interval + rng.uniform(0, LATE_S, size=count)
    times = rng.uniform(0, interval) + np.concatenate([[0.0], np.cumsum(steps)])
    return times[times < total_s - DT]


def window_energy(t: np.ndarray, watts: np.ndarray, start: float, end: float) -> float:
    """energy_j of the definition: the time-weighted mean of the samples inside × the window."""
    inside = (t >= start) & (t < end)
    return time_weighted_mean(t[inside], watts[inside]) * (end - start)


def errors(kind: str, window_s: float, interval: float, trials: int, ideal: bool, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    found = {"reading": [], "counter": []}
    for _ in range(trials):
        power = trace(kind, window_s, rng)
        energy = np.concatenate([[0.0], np.cumsum(power) * DT])  # J at each DT boundary
        start, end = MARGIN_S, MARGIN_S + window_s
        truth = energy[round(end / DT)] - energy[round(start / DT)]
        times = sample_times(interval, len(power) * DT, rng, ideal)
        index = np.minimum((times / DT).astype(int), len(power) - 1)
        found["reading"].append(window_energy(times, power[index], start, end) / truth - 1)
        counter_uj = np.round(np.interp(times, np.arange(len(energy)) * DT, energy) * 1e6)
        middle, watts, _ = counter_power(times, counter_uj, 1e-6, None)
        found["counter"].append(window_energy(middle, watts, start, end) / truth - 1)
    return {method: 100 * np.abs(np.array(values)) for method, values in found.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--windows", type=float, nargs="+", default=[60.0, 1800.0], help="window lengths (s)")
    parser.add_argument("--ideal-clock", action="store_true", help="strictly periodic samples")
    parser.add_argument("--quick", action="store_true", help="3 trials of the 60-s window: that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.windows = 3, [60.0]
    clock = "ideal clock" if args.ideal_clock else f"agent clock (up to {LATE_S * 1000:.0f} ms late)"
    print(f"|error| of the window energy in %, mean / max over {args.trials} trials, {clock}\n")
    header = (
        "| trace | interval | "
        + " | ".join(f"{method} {window:g} s" for window in args.windows for method in ("reading", "counter"))
        + " |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    within = {}
    for kind in ("steps", "spikes", "ripple"):
        for interval in INTERVALS:
            cells = []
            for window in args.windows:
                result = errors(
                    kind, window, interval, args.trials, args.ideal_clock, seed=int(interval * 1000 + window)
                )
                for method in ("reading", "counter"):
                    cells.append(f"{result[method].mean():.2f} / {result[method].max():.2f}")
                    key = (method, window, interval)
                    within[key] = within.get(key, True) and result[method].max() <= 1.0
            print(f"| {kind} | {interval:g} s | " + " | ".join(cells) + " |")
    print()
    for method in ("reading", "counter"):
        for window in args.windows:
            ok = [f"{i:g} s" for i in INTERVALS if within[(method, window, i)]]
            print(f"{method}, {window:g}-s window: every trial within 1 % at {', '.join(ok) or 'none of 1, 5, 15 s'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
