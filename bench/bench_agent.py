"""How much the telemetry agent costs the host it measures.

1. Per source: builds a GB10-like fixture tree (7 zones, 20 cpufreq policies), times each
   source's ``sample()`` (CPU time, not wall time) over many rounds, and prints the cost
   per sample and the CPU share at the default intervals. The per-process source scans
   the real /proc of this machine.
2. Live: starts ``--processes`` extra (sleeping) processes, and ``--followers`` vLLM-like
   ones of ``--follower-threads`` threads each (which the pattern is then set to match:
   the cost of following, whatever else runs here), waits ``--settle`` s so that they are
   old to the agent, as a host's processes are to an agent started for a run, then runs
   the real agent detached
   for ``--seconds`` at the default intervals on the fixture tree, and prints the agent's
   own CPU time as a share of one core: the scheduler's account of all its threads, in ns
   (``/proc/PID/task/*/schedstat``), and the 10-ms utime+stime beside it. The clock starts
   once the agent has written its first cpu sample (start-up is a fixed cost a long run
   amortises). Target: <= 0.05 %. ``--repeat`` runs each agent that many times and prints
   the median and spread; ``--agent FILE`` (repeatable) runs another agent.py there (an
   older one, for before/after), the runs alternating; ``--profile`` runs it under cProfile
   (with a CPU-time timer) and prints where its time went; ``--process-pattern`` sets the
   live agent's pattern (one matching nothing on a host that runs vLLM-like processes
   measures the scan alone).

    python bench/bench_agent.py [--rounds 200] [--seconds 60] [--processes 500] [--repeat 3]
                                [--agent FILE ...] [--profile] [--process-pattern RE]
                                [--followers N] [--follower-threads T] [--settle S] [--quick]
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
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

from thermab.telemetry import agent as agent_module  # noqa: E402
from thermab.telemetry.agent import CpuFrequency, ProcessCpu, SystemCpu, ThermalZones  # noqa: E402

# the agent under cProfile with a CPU-time timer: the default (wall time) would charge the
# waits between samples to select, which cost the host nothing
PROFILED = """import cProfile, runpy, sys, time
out = sys.argv.pop(1)
sys.argv = sys.argv[1:]
profiler = cProfile.Profile(time.process_time)
try:
    profiler.runcall(runpy.run_path, sys.argv[0], run_name="__main__")
except SystemExit:
    pass
profiler.dump_stats(out)
"""

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


# a vLLM-like process to follow: threads that wake often enough to be busy at every cpu
# sample (vLLM's engine and workers hold tens of threads), using a few % of a core in all
FOLLOWER = """import sys, threading, time
def wake():
    while True:
        time.sleep(0.2)
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=wake, daemon=True).start()
wake()
"""
FOLLOWER_MARK = "thermab-bench-follower"


def start_processes(processes: int, followers: int, threads: int) -> list[subprocess.Popen]:
    """The host's extra processes: sleepers, and vLLM-like ones to follow."""
    started = [subprocess.Popen(["sleep", "86400"]) for _ in range(processes)]
    return started + [
        subprocess.Popen([sys.executable, "-c", FOLLOWER, str(threads), FOLLOWER_MARK]) for _ in range(followers)
    ]


def live(root: Path, seconds: float, agent_file: str, profile: bool, pattern: str | None, followers: int) -> float:
    """One live run; returns the agent's CPU share of one core in %."""
    out = root / "agent-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    settings = {"out_dir": str(out), "sys_root": str(root)}
    if pattern is not None:
        settings["process_pattern"] = pattern
    (root / "agent.json").write_text(json.dumps(settings))
    profiler = ["-c", PROFILED, str(root / "agent.prof")] if profile else []
    agent = subprocess.Popen([sys.executable, *profiler, agent_file, "--config", str(root / "agent.json")])
    try:
        # past start-up (imports, discovery, the first scan of every process), which a long
        # run amortises: the agent has written agent.json and its first cpu sample
        deadline = time.monotonic() + 60
        while not (out / "cpu.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        ns_before, ticks_before = _cpu_ns(agent.pid), _cpu_ticks(agent.pid)
        time.sleep(seconds)
        ns, ticks = _cpu_ns(agent.pid) - ns_before, _cpu_ticks(agent.pid) - ticks_before
    finally:
        agent.terminate()
        agent.wait()
    total = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
    share = ns / 1e9 / seconds * 100
    print(
        f"live agent {agent_file}{' (under cProfile)' if profile else ''}, default intervals, {seconds:.0f} s, "
        f"{followers} followed, about {total} processes on the host: {ns / 1e6:.1f} ms CPU = {share:.4f} % of one core "
        f"(utime+stime {ticks / os.sysconf('SC_CLK_TCK'):.2f} s; target <= 0.05 %)",
        flush=True,
    )
    if profile:
        import pstats

        pstats.Stats(str(root / "agent.prof")).sort_stats("tottime").print_stats(15)
        pstats.Stats(str(root / "agent.prof")).sort_stats("cumulative").print_stats(25)
    return share


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process, in ns (the scheduler's own account, the first
    field of /proc/PID/task/TID/schedstat): the ticks of /proc/PID/stat are 10 ms."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended
    return total


def _cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument(
        "--agent",
        action="append",
        help="an agent.py to run live (again for another: the runs alternate); default this one",
    )
    parser.add_argument("--repeat", type=int, default=3, help="live runs of each agent")
    parser.add_argument("--profile", action="store_true", help="run the live agent under cProfile")
    parser.add_argument(
        "--process-pattern",
        help="the live agent's pattern (default the agent's): one that "
        "matches nothing here measures the scan alone, without the processes it follows",
    )
    parser.add_argument(
        "--followers",
        type=int,
        default=0,
        help="start this many vLLM-like processes (a few %% "
        "of a core in all) and set the pattern to theirs: what following costs, whatever else runs",
    )
    parser.add_argument("--follower-threads", type=int, default=30, help="threads of each followed process")
    parser.add_argument(
        "--settle",
        type=float,
        default=ProcessCpu.rescan_s + 5,
        help="seconds the extra processes run before the first live agent starts",
    )
    parser.add_argument("--quick", action="store_true", help="a few rounds and one short live run: that it runs")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.processes, args.repeat, args.settle = 5, 3, 10, 1, 0
        args.followers, args.follower_threads = 1, 2
    agents = args.agent or [agent_module.__file__]
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
            print(
                f"{source.name:<8} {per_sample * 1000:>14.3f} {DEFAULT_INTERVALS[source.name]:>11.0f} "
                f"{share * 100:>14.4f}%"
            )
        processes = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
        print(
            f"total agent CPU at default intervals: {total_share * 100:.4f} % of one core "
            f"({processes} processes scanned per cpu sample, {args.rounds} rounds)"
        )
    shares: dict[str, list[float]] = {agent: [] for agent in agents}
    started = start_processes(args.processes, args.followers, args.follower_threads)
    try:
        # a host's processes are old to an agent started for a run; young ones it looks at
        # again as they age (each time their age doubles, up to rescan_s)
        time.sleep(args.settle)
        with tempfile.TemporaryDirectory() as tmp:
            gb10_tree(Path(tmp))
            for _ in range(args.repeat):
                for agent in agents:
                    pattern = args.process_pattern or (FOLLOWER_MARK if args.followers else None)
                    shares[agent].append(live(Path(tmp), args.seconds, agent, args.profile, pattern, args.followers))
    finally:
        for process in started:
            process.kill()
            process.wait()
    for agent, values in shares.items():
        print(
            f"{agent}: {len(values)} runs of {args.seconds:.0f} s, % of one core: median "
            f"{statistics.median(values):.4f}, min {min(values):.4f}, max {max(values):.4f} "
            f"({', '.join(f'{v:.4f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
