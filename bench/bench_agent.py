"""How much the telemetry agent costs the host it measures.

1. Per source: builds a GB10-like fixture tree (7 zones, 20 cpufreq policies), times each
   source's ``sample()`` (CPU time, not wall time) over many rounds, and prints the cost
   per sample and the CPU share at the default intervals. The per-process source scans
   the real /proc of this machine.
2. Live: starts ``--processes`` extra (sleeping) processes, runs the real agent detached
   for ``--seconds`` at the default intervals on the fixture tree, and prints the agent's
   own CPU (utime+stime from /proc, in 10-ms ticks: run long enough to resolve it) as a
   share of one core. Target: <= 0.05 %. ``--agent FILE`` runs another agent.py there
   (an older one, for before/after); ``--profile`` runs it under cProfile and prints where
   its time went.

    python bench/bench_agent.py [--rounds 200] [--seconds 60] [--processes 500] [--agent FILE] [--profile]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402

from thermab.telemetry import agent as agent_module  # noqa: E402
from thermab.telemetry.agent import CpuFrequency, ProcessCpu, SystemCpu, ThermalZones  # noqa: E402

DEFAULT_INTERVALS = {"thermal": 15.0, "cpu": 6.0, "freq": 15.0, "system": 6.0}


def gb10_tree(root: Path) -> None:
    for index, name in enumerate(["TSOC", "TS0E", "TS0P", "TS1E", "TS1P", "TGPU", "TUNC"]):
        zone = root / f"sys/class/thermal/thermal_zone{index}"
        (zone / "device").mkdir(parents=True)
        (zone / "device/path").write_text(f"\\_TZ_.{name}\n")
        (zone / "type").write_text("acpitz\n")
        (zone / "temp").write_text("75000\n")
        (zone / "trip_point_0_temp").write_text("104800\n")
    for cpu in range(20):
        policy = root / f"sys/devices/system/cpu/cpufreq/policy{cpu}"
        policy.mkdir(parents=True)
        (policy / "scaling_cur_freq").write_text("3900000\n")
        (policy / "cpuinfo_avg_freq").write_text("3978000\n")


def live(root: Path, seconds: float, processes: int, agent_file: str, profile: bool) -> None:
    sleepers = [subprocess.Popen(["sleep", str(seconds + 60)]) for _ in range(processes)]
    out = root / "agent-out"
    out.mkdir()
    (root / "agent.json").write_text(json.dumps({"out_dir": str(out), "sys_root": str(root)}))
    profiler = ["-m", "cProfile", "-o", str(root / "agent.prof")] if profile else []
    agent = subprocess.Popen([sys.executable, *profiler, agent_file, "--config", str(root / "agent.json")])
    try:
        time.sleep(2)  # past start-up (imports, discovery), which a long run amortises
        ticks_before = _cpu_ticks(agent.pid)
        time.sleep(seconds)
        ticks = _cpu_ticks(agent.pid) - ticks_before
    finally:
        agent.terminate()
        agent.wait()
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    total = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit()) + processes
    share = ticks / os.sysconf("SC_CLK_TCK") / seconds * 100
    print(f"live agent {agent_file}{' (under cProfile)' if profile else ''}, default intervals, {seconds:.0f} s, "
          f"about {total} processes on the host: {ticks / os.sysconf('SC_CLK_TCK'):.2f} CPU-s = {share:.3f} % "
          "of one core (target <= 0.05 %)")
    if profile:
        import pstats
        pstats.Stats(str(root / "agent.prof")).sort_stats("tottime").print_stats(12)


def _cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--agent", default=agent_module.__file__, help="the agent.py to run live")
    parser.add_argument("--profile", action="store_true", help="run the live agent under cProfile")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gb10_tree(root)
        sources = [ThermalZones(str(root)), CpuFrequency(str(root)), ProcessCpu(), SystemCpu()]
        total_share = 0.0
        print(f"{'source':<8} {'cpu ms/sample':>14} {'interval s':>11} {'host CPU share':>15}")
        for source in sources:
            source.discover()
            source.sample()
            start = time.process_time()
            for _ in range(args.rounds):
                source.sample()
            per_sample = (time.process_time() - start) / args.rounds
            share = per_sample / DEFAULT_INTERVALS[source.name]
            total_share += share
            print(f"{source.name:<8} {per_sample * 1000:>14.3f} {DEFAULT_INTERVALS[source.name]:>11.0f} "
                  f"{share * 100:>14.4f}%")
        processes = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
        print(f"total agent CPU at default intervals: {total_share * 100:.4f} % of one core "
              f"({processes} processes scanned per cpu sample, {args.rounds} rounds)")
    with tempfile.TemporaryDirectory() as tmp:
        gb10_tree(Path(tmp))
        live(Path(tmp), args.seconds, args.processes, args.agent, args.profile)


if __name__ == "__main__":
    main()
