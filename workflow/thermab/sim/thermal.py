"""Thermal model daemon of a simulated GB10 node: the node's own load in, sysfs readings out.

::

    python -m thermab.sim.thermal --node ROOT [--detach]
    python -m thermab.sim.thermal stop --node ROOT

``--detach`` runs the daemon in a new session (pid in ROOT/run/thermal.pid, log in
ROOT/run/thermal.log); ``stop`` ends it (exit 0 when it was not running).

Every ``thermal.tick_s`` the daemon reads the node's load, from this node alone:

- CPU, in GB10 cores: :class:`thermab.telemetry.agent.ProcessCpu`, the telemetry agent's own reader,
  over the node's /proc view (ROOT/proc, written by the node's processes, see
  :mod:`thermab.sim.cpu`) and ``process_pattern`` from sim.json.  Its ``vllm_cpu_pct`` is
  what the agent reports for the node, the sum of its thread rows (``thread COMM TID
  cpuN``, every thread here), which the model uses (:class:`NodeLoad`): each at most one
  core, those busy at least ``HELD_SHARE`` of the last two ticks held, on the cluster of
  their core (which decides whether TS1P reads a hot core).
- GPU: the share of the tick the emulated GPU was busy (the rate of ROOT/run/gpu_busy_s).

It advances the zone model (:mod:`thermab.sim.zones`) by the tick times
``time_compression`` and writes each zone's reading, plus Gaussian noise (``noise_c``:
its idle value, growing to its load value with the GPU's busy share, as the study's
readings spread under load), at GB10's 0.1 °C by rename; TSOC reads the hottest zone.
Cpufreq files get ``performance_khz`` on ``performance_policies`` and ``efficiency_khz``
elsewhere, ± ``jitter_khz``.  The daemon also removes the /proc views of processes that
are gone (:func:`thermab.sim.node.prune`).

The same inputs drive the node's power counters and meter (:mod:`thermab.sim.power_meters`), and
its smart plug at the wall (:mod:`thermab.sim.plug`).

The zone parameters are the fit of the study's chart data (:mod:`thermab.sim.fit`), in the
study's seconds; sim.json carries them with the time compression (30: the default
config's 60-s load phases are the study's 30 minutes).
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from pathlib import Path

from thermab.sim import node, plug, power_meters, zones
from thermab.telemetry.agent import ProcessCpu

STATUS_EVERY_S = 10.0
HELD_SHARE = 0.8  # a spinning reader keeps its core ~100 % busy; GPU-waiting threads stay ≤ 60 %


def read_temps(root: Path, zone_params: dict) -> dict:
    """Current zone temperatures (a restarted daemon continues from them), else ambient."""
    temps = {}
    for index, name in enumerate(node.ZONES):
        if name not in zone_params:
            continue
        try:
            temps[name] = int((node.zone_dir(root, index) / "temp").read_text()) / 1000.0
        except (OSError, ValueError):
            temps[name] = zone_params[name]["ambient_c"]
    return temps


class NodeLoad:
    """The zone model's input from successive ProcessCpu samples of the node's /proc view.

    A thread uses at most one core: a larger delta means the view was written late (this
    machine is shared and a process's writer can lag), so the excess is carried into the
    following ticks instead of heating the node in a spike; the total over time is kept.
    For the same reason a thread holds its core when its share averaged over the last two
    ticks is ``HELD_SHARE`` or more: a late view makes one tick look idler and the next
    busier, not both."""

    def __init__(self, cores: int):
        self.cores = cores
        self.carry = {}  # (comm, tid) -> core-seconds per tick not yet counted
        self.last = {}  # (comm, tid) -> its share in the last tick, as read

    def __call__(self, cpu_rows: list, gpu_busy: float) -> zones.Load:
        used, held_on = 0.0, [0.0, 0.0]
        carry, last = {}, {}
        for sensor, value, _ in cpu_rows:
            if not sensor.startswith("thread "):
                continue
            _, comm, tid, core = sensor.rsplit(" ", 3)
            key = (comm, tid)
            last[key] = value / 100.0
            share = last[key] + self.carry.get(key, 0.0)
            carry[key] = max(0.0, share - 1.0)
            share = min(share, 1.0)
            used += share
            if (last[key] + self.last.get(key, 0.0)) / 2 >= HELD_SHARE:
                held_on[int(core[3:]) * 2 // self.cores] += share
        self.carry, self.last = carry, last
        return zones.Load(cpu_cores=used, gpu_busy=gpu_busy, held_cores=sum(held_on), held_on=tuple(held_on))


def write_temps(root: Path, temps: dict, noise_c: float) -> dict:
    """Write the readings (TSOC: the hottest noisy reading, as its sensor is); return them."""
    shown = {name: value + random.gauss(0.0, noise_c) for name, value in temps.items() if name != zones.SOC_ZONE}
    shown[zones.SOC_ZONE] = max(shown.values())
    for index, name in enumerate(node.ZONES):
        node.write_atomic(node.zone_dir(root, index) / "temp", node.millidegrees(shown[name]))
    return shown


def write_clocks(root: Path, settings: dict) -> None:
    clocks = settings["clocks"]
    performance = set(settings["performance_policies"])
    for cpu in range(settings["cores"]):
        base = clocks["performance_khz" if cpu in performance else "efficiency_khz"]
        directory = node.policy_dir(root, cpu)
        names = ("scaling_cur_freq", "cpuinfo_avg_freq") if cpu in performance else ("scaling_cur_freq",)
        for name in names:
            khz = base + random.randint(-clocks["jitter_khz"], clocks["jitter_khz"])
            node.write_atomic(directory / name, "%d\n" % khz)


class GpuBusy:
    """Share of wall time the emulated GPU was busy, from the run/gpu_busy_s counter."""

    def __init__(self, root: Path):
        self.path = node.run_dir(root) / "gpu_busy_s"
        self.previous = self.read()

    def read(self) -> float:
        try:
            return float(self.path.read_text())
        except (OSError, ValueError):
            return 0.0

    def rate(self, dt: float) -> float:
        current = self.read()
        # A counter that went down was reset (file removed): count that tick as idle.
        busy = max(0.0, current - self.previous) / dt
        self.previous = current
        return min(1.0, busy)


def run(root: Path) -> None:
    settings = node.load_settings(root)
    model = settings["thermal"]
    zone_params = model["zones"]
    noise = model["noise_c"]
    cpu = ProcessCpu(settings["process_pattern"], proc_root=str(node.proc_dir(root)))
    cpu.top_threads = None  # every thread: the node's CPU is their sum
    cpu.sample()  # the first sample only sets the baseline
    node_load = NodeLoad(settings["cores"])
    gpu = GpuBusy(root)
    states = zones.initial_states(zone_params, read_temps(root, zone_params))
    meter = power_meters.PowerMeter(root, settings["power"], node.write_atomic)
    meter.start()
    plug.serve(root, meter)  # the node's smart plug reads the same power at the wall
    last = last_status = time.monotonic()
    while True:
        time.sleep(model["tick_s"])
        now = time.monotonic()
        dt, last = now - last, now
        node.prune(root)
        load = node_load(cpu.sample(), gpu.rate(dt))
        zones.step(states, zone_params, load, dt, settings["time_compression"])
        temps = zones.temperatures(states, zone_params, load)
        shown = write_temps(root, temps, noise["idle"] + (noise["load"] - noise["idle"]) * load.gpu_busy)
        meter.follow(load.cpu_cores, load.gpu_busy)  # the same heat input drives the power counters
        write_clocks(root, settings)
        if now - last_status >= STATUS_EVERY_S:
            last_status = now
            print(
                "cpu %.2f cores (held %.2f on cluster 0, %.2f on 1), gpu busy %.2f, %s"
                % (
                    load.cpu_cores,
                    *load.held_on,
                    load.gpu_busy,
                    " ".join("%s %.1f" % (name, shown[name]) for name in node.ZONES),
                ),
                flush=True,
            )


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m thermab.sim.thermal",
        description=__doc__.splitlines()[0],
        epilog="stop the daemon: python -m thermab.sim.thermal stop --node ROOT",
    )
    if argv[:1] == ["stop"]:
        parser.add_argument("stop")
        parser.add_argument("--node", type=Path, required=True)
        args = parser.parse_args(argv)
        print("stopped" if node.stop(args.node, "thermal") else "not running")
        return 0
    parser.add_argument("--node", type=Path, required=True)
    parser.add_argument("--detach", action="store_true", help="run in a new session and return")
    args = parser.parse_args(argv)
    root = args.node.resolve()
    try:
        node.load_settings(root)
    except FileNotFoundError as error:
        parser.error(str(error))
    if args.detach:
        # Starting twice must not orphan the first daemon: callers may "ensure it is on".
        pid = node.running_pid(root, "thermal")
        print(pid or node.start_detached(root, "thermal", "thermab.sim.thermal", ["--node", str(root)]))
        return 0

    def handler(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)
    node.claim_pid_file(root, "thermal")
    try:
        run(root)
    finally:
        node.release_pid_file(root, "thermal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
