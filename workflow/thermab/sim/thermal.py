"""Thermal model of a simulated GB10 node: measured load in, sysfs temperatures out.

::

    python -m thermab.sim.thermal --node ROOT [--detach]
    python -m thermab.sim.thermal stop --node ROOT

``--detach`` runs the daemon in a new session (pid in ROOT/run/thermal.pid, log in
ROOT/run/thermal.log); ``stop`` ends it (exit 0 when it was not running).

Every ``tick_s`` the daemon measures two inputs:

- ``cpu``: cores used by the node's server processes, with
  :class:`thermab.telemetry.agent.ProcessCpu` over ``process_pattern`` from sim.json (the pattern
  travels in a file, not on the command line, so the daemon never measures itself);
- ``gpu``: the share of the tick the emulated GPU was busy (the rate of ROOT/run/gpu_busy_s).

The same two inputs drive the node's power counters and meter (:mod:`thermab.sim.power`).
Each modelled zone moves toward its target with a first-order (RC) step::

    target = ambient_c + c_per_core * cpu + c_at_gpu_busy * gpu
    T     += (target - T) * min(1, dt / tau_s)

TSOC is not modelled: as on GB10 it reads the hottest other zone (in the study's data it
equals TS1P under load and TGPU at idle).  Values are written with Gaussian noise
(``noise_c``) at 0.1 °C resolution, by rename.  Cpufreq files get ``performance_khz`` on
``performance_policies`` and ``efficiency_khz`` elsewhere, ± ``jitter_khz``.

sim.json keys: ``thermal.tick_s``, ``thermal.noise_c``, ``thermal.zones.NAME.{ambient_c,
c_per_core, c_at_gpu_busy, tau_s}``, ``clocks.{performance_khz, efficiency_khz,
jitter_khz}``, ``performance_policies``, ``process_pattern``.

Calibration (defaults in :func:`thermab.sim.node.thermal_model`): ambients are the
study's head idle means (the worker's 2.9 °C lower, as published).  The model is linear
in two inputs, so the two arms fix the two gains of each zone.  Measured on this emulator
(2-core machine, 4 streams), the head uses ~1.1 cores with the GPU ~0.83 busy in the stock
arm and ~0.2 cores with the GPU ~0.88 busy patched.  TS1P, the cluster where the spinning
engine core runs, gets by far the largest CPU gain (12 °C per core), which turns the
~0.9-core gap into the study's 9.1 °C gap (89.5 vs 80.4 °C); TUNC, TGPU and the other
clusters get 2-4 °C per core and are driven mostly by the GPU term, reproducing their
published 0.5-2.5 °C gaps at ~67-74 °C.  The worker node (~0.14 cores, the same GPU
load) lands at 75-78 °C in both arms (published: ~77).  Time constants are compressed
~30x against GB10 (tau 10-15 s) so that a 60-s load phase heats visibly and a 30-s
cooldown cools.  Zone levels follow the measured inputs, so a busier or faster machine
shifts them by a few degrees; the arm gap comes from the spin.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from pathlib import Path

from thermab.telemetry.agent import ProcessCpu
from thermab.sim import node, power

STATUS_EVERY_S = 10.0


def read_temps(root: Path, zones) -> dict:
    """Current zone temperatures (a restarted daemon continues from them), else ambient."""
    temps = {}
    for index, name in enumerate(node.ZONES):
        if name not in zones:
            continue
        try:
            temps[name] = int((node.zone_dir(root, index) / "temp").read_text()) / 1000.0
        except (OSError, ValueError):
            temps[name] = zones[name]["ambient_c"]
    return temps


def step_temps(temps: dict, zones: dict, cpu_cores: float, gpu_busy: float, dt: float) -> None:
    for name, zone in zones.items():
        target = zone["ambient_c"] + zone["c_per_core"] * cpu_cores + zone["c_at_gpu_busy"] * gpu_busy
        temps[name] += (target - temps[name]) * min(1.0, dt / zone["tau_s"])


def write_temps(root: Path, temps: dict, noise_c: float) -> dict:
    shown = {name: value + random.gauss(0.0, noise_c) for name, value in temps.items()}
    shown[node.SOC_ZONE] = max(shown.values())
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
    zones = model["zones"]
    cpu = ProcessCpu(settings["process_pattern"])
    cpu.sample()  # the first sample only sets the baseline
    gpu = GpuBusy(root)
    temps = read_temps(root, zones)
    meter = power.PowerMeter(root, settings["power"], node.write_atomic)
    meter.start()
    last = last_status = time.monotonic()
    while True:
        time.sleep(model["tick_s"])
        now = time.monotonic()
        dt, last = now - last, now
        cpu_cores = {sensor: value for sensor, value, _ in cpu.sample()}["vllm_cpu_pct"] / 100.0
        gpu_busy = gpu.rate(dt)
        step_temps(temps, zones, cpu_cores, gpu_busy, dt)
        meter.follow(cpu_cores, gpu_busy)  # the same heat input drives the power counters
        shown = write_temps(root, temps, model["noise_c"])
        write_clocks(root, settings)
        if now - last_status >= STATUS_EVERY_S:
            last_status = now
            print("cpu %.2f cores, gpu busy %.2f, %s" % (cpu_cores, gpu_busy, " ".join(
                "%s %.1f" % (name, shown[name]) for name in node.ZONES)), flush=True)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m thermab.sim.thermal",
                                     description=__doc__.splitlines()[0],
                                     epilog="stop the daemon: python -m thermab.sim.thermal stop --node ROOT")
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
