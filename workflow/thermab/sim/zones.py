"""The zone model of a simulated GB10 node: node load in, zone temperatures out (pure).

Inputs (:class:`Load`), all of this node only and in GB10 units:

- ``cpu_cores``: the node's server processes' CPU, in cores (what the agent reports as
  ``vllm_cpu_pct`` / 100);
- ``held_cores``: the part of it held by threads that never sleep (a spinning reader keeps
  its core busy for as long as it spins), and ``held_on``: how much of that runs on each
  of the two CPU clusters (cluster 0 = cores 0-9, cluster 1 = cores 10-19);
- ``gpu_busy``: the share of the time the node's GPU had a batch to run.

Each zone is two first-order states above its ambient, a fast one (the die near the heat)
and a slow one (package and heat sink), so a zone rises fast then creeps, and cools the
same way::

    spread = c_per_core * (cpu_cores - held_cores) + c_at_gpu_busy * gpu_busy
    fast  -> fast_share * spread + c_per_core * held_cores     (tau_fast_s)
    slow  -> (1 - fast_share) * spread                         (tau_slow_s)
    T = ambient_c + fast + slow

In the steady state a zone sits ``c_per_core * cpu_cores + c_at_gpu_busy * gpu_busy``
above ambient.  Held cores heat the fast state only: their heat is local to the die.

A zone with a ``hot_core`` (TS1P, the sensor of cluster 1's performance cores) reads the
hottest core of its cluster.  While a held thread runs on that cluster (``cluster``), that
is the thread's own core: a second pair of states with the same inputs, its own
``fast_share``, and ``c_per_held_core`` more heat per held core; otherwise the zone reads
as above.  In the study's stock phase TS1P jumps between ~93 °C and dips to ~85 °C from
one 30-s sample to the next: the scheduler moves the spinning threads between the
clusters (TS0P and TUNC rise a little at the dips).  The patched phase has no such thread
and TS1P creeps like the other zones.

Parameters are in the study's seconds; :func:`step` takes the simulated time step and the
time compression (the default config runs the 30-minute load phases in 60 s).  All of
them come from :mod:`thermab.sim.fit` (calibration.json), fitted to the study's chart data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SOC_ZONE = "TSOC"  # reads the hottest of the other zones, as on GB10


@dataclass(frozen=True)
class Load:
    cpu_cores: float = 0.0
    gpu_busy: float = 0.0
    held_cores: float = 0.0
    held_on: tuple[float, float] = (0.0, 0.0)  # held cores on cluster 0, cluster 1


def targets(zone: dict, load: Load) -> tuple[float, float]:
    """The fast and slow states' targets (°C above ambient) under ``load``."""
    spread = zone["c_per_core"] * (load.cpu_cores - load.held_cores) + zone["c_at_gpu_busy"] * load.gpu_busy
    return (zone["fast_share"] * spread + zone["c_per_core"] * load.held_cores, (1.0 - zone["fast_share"]) * spread)


def hot_core_targets(zone: dict, load: Load) -> tuple[float, float]:
    """The targets of the core a held thread runs on (``zone`` has a ``hot_core``)."""
    core = zone["hot_core"]
    fast, slow = targets(dict(zone, fast_share=core["fast_share"]), load)
    return fast + core["c_per_held_core"] * load.held_cores, slow


def initial_states(zones: dict, temps: dict) -> dict:
    """States that read ``temps`` (a restarted daemon continues from the written values),
    the excess over ambient split between fast and slow as a steady load would split it."""
    states = {}
    for name, zone in zones.items():
        excess = temps.get(name, zone["ambient_c"]) - zone["ambient_c"]
        states[name] = [zone["fast_share"] * excess, (1.0 - zone["fast_share"]) * excess]
        if "hot_core" in zone:
            states[name + ".hot_core"] = list(states[name])
    return states


def _advance(state: list, fast: float, slow: float, zone: dict, dt: float) -> None:
    state[0] += (fast - state[0]) * (1.0 - math.exp(-dt / zone["tau_fast_s"]))
    state[1] += (slow - state[1]) * (1.0 - math.exp(-dt / zone["tau_slow_s"]))


def step(states: dict, zones: dict, load: Load, dt_s: float, compression: float) -> None:
    """Advance every state by ``dt_s`` simulated seconds, exactly for a load held constant
    over the step (so any tick length gives the same curve)."""
    dt = dt_s * compression
    for name, zone in zones.items():
        _advance(states[name], *targets(zone, load), zone, dt)
        if "hot_core" in zone:
            _advance(states[name + ".hot_core"], *hot_core_targets(zone, load), zone, dt)


def temperatures(states: dict, zones: dict, load: Load = Load()) -> dict:
    """Zone readings (noise aside), TSOC included (the hottest zone)."""
    temps = {}
    for name, zone in zones.items():
        temps[name] = zone["ambient_c"] + sum(states[name])
        if "hot_core" in zone and load.held_on[zone["cluster"]] > 0:
            temps[name] = max(temps[name], zone["ambient_c"] + sum(states[name + ".hot_core"]))
    temps[SOC_ZONE] = max(temps.values())
    return temps
