"""Power of a simulated node: a RAPL-like powercap tree and an hwmon power meter whose
readings follow the node's modelled heat input (the two inputs of :mod:`thermab.sim.thermal`).

::

    ROOT/sys/class/powercap/intel-rapl:0/     name package-0, energy_uj, max_energy_range_uj
    ROOT/sys/class/powercap/intel-rapl:0:0/   name core    (the CPU cores, inside the package)
    ROOT/sys/class/powercap/intel-rapl:0:1/   name uncore  (the GPU, inside the package, as an
                                              Intel client chip's graphics are)
    ROOT/sys/class/powercap/intel-rapl:0:2/   name dram    (beside the package: dram-0)
    ROOT/sys/class/hwmon/hwmon0/              name power_meter, power1_label "node",
                                              power1_input (µW): package + DRAM + the platform

Each thermal tick hands :meth:`PowerMeter.follow` the cores the node's processes used and the
share of the tick its emulated GPU was busy; a thread of the meter advances the counters every
``STEP_S`` at the power those inputs give (finer than the tick, so that an agent reading the
counters every second sees energy, not the tick's steps).  Every domain's power is linear
in the inputs::

    core    = core_idle_w + w_per_core * cpu
    uncore  = uncore_idle_w + w_at_gpu_busy * gpu
    package = core + uncore + package_rest_w
    dram    = dram_idle_w + dram_w_at_gpu_busy * gpu
    node    = package + dram + platform_w
    wall    = node / PSU_EFFICIENCY + WALL_BASE_W     (the node's plug, thermab.sim.plug)

and each counter advances by its power × dt, wrapping to 0 past ``max_energy_range_uj``.  The
range is 2³² − 1 µJ (about 4.3 kJ, some 45 s at load), far below a real package's 262 kJ, so
that every run sees counters wrap.  Gains are GB10-like orders of magnitude (a 140 W SoC, a
Cortex-X925 core at 3.9 GHz some 5 W); the spin of the stock arm costs the head its ~1.9
cores of the study (402 % against 212 %), 9.5 W of the cluster's ~207 W of packages and
DRAM under load (4.6 %), while the emulated GPU's 70 W dominate both arms.  The study
measured no power, so ``w_per_core`` is the one figure here that a GB10 would have to
confirm: the arms' J/token gap scales with it (-4.2 % at 5 W, -2.1 % at 2.5 W, -0.7 % at
1 W in the default study's 16 phases; docs/statistics.md, "Why J/token divides by the tokens
generated in the window").
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

WRAP_UJ = 2**32 - 1
STEP_S = 0.1
POWER_MODEL = {
    "core_idle_w": 2.0,
    "w_per_core": 5.0,
    "uncore_idle_w": 4.0,
    "w_at_gpu_busy": 70.0,
    "package_rest_w": 6.0,
    "dram_idle_w": 2.0,
    "dram_w_at_gpu_busy": 6.0,
    "platform_w": 12.0,
}
# the node's smart plug (thermab.sim.plug) reads the node through its power supply, which
# loses a tenth of what it delivers at these loads (80 PLUS Gold is 90 % efficient at half load), and a
# fixed base the node's own meters do not see (fans, NIC, the BMC)
PSU_EFFICIENCY = 0.9
WALL_BASE_W = 8.0
# zone directory -> RAPL zone name, in the order powercap numbers them
ZONES = {"intel-rapl:0": "package-0", "intel-rapl:0:0": "core", "intel-rapl:0:1": "uncore", "intel-rapl:0:2": "dram"}
METER_LABEL = "node"


def power_model(role: str) -> dict:
    """The power parameters written to a node's sim.json (the same for both roles: what
    differs between head and worker is the load they carry)."""
    return dict(POWER_MODEL)


def zone_dir(root: Path, zone: str) -> Path:
    return Path(root) / "sys/class/powercap" / zone


def meter_dir(root: Path) -> Path:
    return Path(root) / "sys/class/hwmon/hwmon0"


def watts(model: dict, cpu_cores: float, gpu_busy: float) -> dict:
    """Power of every domain (by RAPL zone name, and ``node``) at these inputs."""
    core = model["core_idle_w"] + model["w_per_core"] * cpu_cores
    uncore = model["uncore_idle_w"] + model["w_at_gpu_busy"] * gpu_busy
    package = core + uncore + model["package_rest_w"]
    dram = model["dram_idle_w"] + model["dram_w_at_gpu_busy"] * gpu_busy
    return {
        "package-0": package,
        "core": core,
        "uncore": uncore,
        "dram": dram,
        "node": package + dram + model["platform_w"],
        "wall": (package + dram + model["platform_w"]) / PSU_EFFICIENCY + WALL_BASE_W,
    }


def create_tree(root: Path, write_missing) -> None:
    """The powercap zones and the hwmon meter, idle; ``write_missing(path, text)`` keeps what
    exists (a counter keeps counting across a re-create)."""
    for zone, name in ZONES.items():
        directory = zone_dir(root, zone)
        write_missing(directory / "name", name + "\n")
        write_missing(directory / "max_energy_range_uj", "%d\n" % WRAP_UJ)
        write_missing(directory / "energy_uj", "0\n")
    idle = watts(POWER_MODEL, 0.0, 0.0)["node"]
    write_missing(meter_dir(root) / "name", "power_meter\n")
    write_missing(meter_dir(root) / "power1_label", METER_LABEL + "\n")
    write_missing(meter_dir(root) / "power1_input", "%d\n" % round(idle * 1e6))


class PowerMeter:
    """Advances the counters and the meter of one node, continuing from the files (a restarted
    thermal daemon does not reset them)."""

    def __init__(self, root: Path, model: dict, write_atomic):
        self.root, self.model, self.write_atomic = Path(root), model, write_atomic
        self.inputs = (0.0, 0.0)  # (cpu cores, gpu busy) of the last thermal tick
        # the plug's reading and its energy counter (from 0 when the daemon starts, as a plug's
        # after a power cut): what thermab.sim.plug serves
        self.wall_w, self.wall_wh = watts(model, 0.0, 0.0)["wall"], 0.0
        self.energy_uj = {}
        for zone in ZONES:
            try:
                self.energy_uj[zone] = float(int((zone_dir(root, zone) / "energy_uj").read_text()))
            except (OSError, ValueError):
                self.energy_uj[zone] = 0.0

    def advance(self, cpu_cores: float, gpu_busy: float, dt: float) -> dict:
        """Add ``dt`` seconds at the power these inputs give; returns that power."""
        power = watts(self.model, cpu_cores, gpu_busy)
        for zone, name in ZONES.items():
            self.energy_uj[zone] = (self.energy_uj[zone] + power[name] * dt * 1e6) % (WRAP_UJ + 1)
            self.write_atomic(zone_dir(self.root, zone) / "energy_uj", "%d\n" % self.energy_uj[zone])
        self.write_atomic(meter_dir(self.root) / "power1_input", "%d\n" % round(power["node"] * 1e6))
        self.wall_w, self.wall_wh = power["wall"], self.wall_wh + power["wall"] * dt / 3600.0
        return power

    def follow(self, cpu_cores: float, gpu_busy: float) -> None:
        """The inputs of the latest thermal tick, which the counters follow from now on."""
        self.inputs = (cpu_cores, gpu_busy)

    def start(self) -> threading.Thread:
        """Advance every STEP_S on a daemon thread, for as long as the process runs."""

        def loop():
            last = time.monotonic()
            while True:
                time.sleep(STEP_S)
                now = time.monotonic()
                self.advance(*self.inputs, now - last)
                last = now

        thread = threading.Thread(target=loop, name="power meter", daemon=True)
        thread.start()
        return thread
