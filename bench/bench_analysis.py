"""How long ingest and ``analyze`` take, and how much memory, on long runs.

Writes synthetic run directories as the workflow leaves them before ingest: the agent's
CSVs (``t,sensor,value,reason`` per source under ``monitor/{host}/``, rows in sampling
order, 1 Hz for 2 hosts x 20 sensors: 7 zones, the vLLM CPU and 12 core clocks), the
per-phase request files (50 000 requests per 24 h) with each phase's validity.json, events
(AB phases of 30 min load + 30 min rest) and run.json.  Then, each in a child process of its own, ingest
(``telemetry.ingest.ingest``) and ``python -m thermab analyze`` on what ingest wrote; it
prints their wall time, CPU time and peak memory: the child's own high-water mark of
resident memory (VmHWM, read by the child as it exits), since the maximum resident set
that getrusage and wait4 report counts the parent's memory at the fork.
Targets, up to a week (168 h): <= 10 s and <= 1 GB each.

    python bench/bench_analysis.py [--hours 1 6 24 168] [--repeat 3] [--quick]

With ``--repeat`` each child runs that many times: the tables show the fastest wall time
and the largest peak, the lines below them every wall time (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from thermab.contracts import REQUEST_COLUMNS  # noqa: E402  (the checkout's, as the children use)
from thermab.load import validity  # noqa: E402

ZONES = ["TSOC", "TS0E", "TS0P", "TS1E", "TS1P", "TGPU", "TUNC"]
# agent source file -> its sensors (the kinds follow from the agent's registry at ingest)
SOURCES = {"thermal": ZONES, "cpu": ["vllm_cpu_pct"], "freq": [f"cpu{i}" for i in range(12)]}
LEVELS = {"thermal": (50.0, 35.0), "cpu": (20.0, 300.0), "freq": (3900.0, 0.0)}  # idle, rise under load
PHASE_S = 3600  # 30 min load + 30 min rest
T0 = 1.7e9  # the agent's clock: Unix time
# every child reports its own peak as it exits: VmHWM, which starts afresh at exec
PEAK = """import atexit, sys
def peak():
    with open("/proc/self/status") as status:
        sys.stderr.write("\\npeak kB " + next(l for l in status if l.startswith("VmHWM")).split()[1] + "\\n")
atexit.register(peak)
"""
INGEST = (
    PEAK
    + """from pathlib import Path
from thermab.telemetry import ingest
run = Path(sys.argv[1])
ingest.ingest(run, sorted(run.glob("phases/*.parquet")), run / "tidy/telemetry.parquet", run / "tidy/requests.parquet")
"""
)
ANALYZE = (
    PEAK
    + """import runpy
sys.argv = ["thermab", "analyze", sys.argv[1]]
runpy.run_module("thermab", run_name="__main__")
"""
)


def fixed3(values: np.ndarray) -> pa.Array:
    """Non-negative numbers as the agent writes them ("%.3f"), formatted by Arrow (fast)."""
    digits = pc.utf8_lpad(pc.cast(pa.array(np.round(values * 1000).astype("int64")), pa.string()), 4, "0")
    return pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(digits, 0, -3), pc.utf8_slice_codeunits(digits, -3, 1 << 30), "."
    )


def write_run(run_dir: Path, hours: float, requests_total: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    seconds = int(hours * 3600)
    t = T0 + np.arange(seconds, dtype="float64")
    events, windows = [{"t": T0, "event": "run_start", "order": "AB"}], []
    for index, start in enumerate(range(0, seconds - PHASE_S + 1, PHASE_S)):
        arm, rep = "AB"[index % 2], index // 2 + 1
        windows.append((T0 + start + 60.0, T0 + start + 60.0 + 1800, arm, rep))
        events += [
            {"t": T0 + start + 60.0, "event": "load_start", "order": "AB", "rep": rep, "arm": arm},
            {"t": T0 + start + 1860.0, "event": "load_end", "order": "AB", "rep": rep, "arm": arm},
        ]
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "preflight.json").write_text(json.dumps({"clock_offset_s": {"head": 0.0, "worker": 0.0}}))
    loaded = np.zeros(seconds, dtype=bool)
    for start, end, _arm, _rep in windows:
        loaded[int(start - T0) : int(end - T0)] = True
    for host in ("head", "worker"):
        (run_dir / "monitor" / host).mkdir(parents=True)
        for source, sensors in SOURCES.items():
            idle, rise = LEVELS[source]
            # one sample of every sensor per second, rows in sampling order as the agent appends them
            values = idle + rise * loaded[:, None] + rng.normal(0, 0.5, (seconds, len(sensors)))
            table = pa.table(
                {
                    "t": fixed3(np.repeat(t, len(sensors))),
                    "sensor": pa.array(np.tile(np.array(sensors, dtype=object), seconds), pa.string()),
                    "value": fixed3(values.ravel()),
                    "reason": pa.array(np.full(seconds * len(sensors), "")),
                }
            )
            path = run_dir / "monitor" / host / f"{source}.csv"
            path.write_text("t,sensor,value,reason\n")
            with open(path, "ab") as handle:
                pa_csv.write_csv(table, handle, pa_csv.WriteOptions(include_header=False, quoting_style="none"))
    (run_dir / "phases").mkdir()
    per_window = max(requests_total // max(len(windows), 1), 1)
    for index, (start, end, arm, rep) in enumerate(windows):
        starts = np.sort(rng.uniform(start, end, per_window))
        requests = pd.DataFrame(
            {
                "order": "AB",
                "rep": rep,
                "arm": arm,
                "users": 4,
                "kind": "load",
                "user": rng.integers(1, 5, per_window),
                "tag": [f"r{rep}{arm}{i}" for i in range(per_window)],
                "t_start": starts,
                "t_first_token": starts + 0.3,
                "t_end": starts + 18.0,
                "prompt_tokens": 1400,
                "completion_tokens": 400,
                "cached_tokens": 0,
                "ok": True,
                "error": "",
                "max_gap_s": rng.uniform(0.02, 0.2, per_window),
                "stall_gaps": 0,
                "usage_source": "usage",
                "token_arrivals": 400,
                "token_span_s": 17.6,
            }
        ).reindex(columns=list(REQUEST_COLUMNS))  # the contract's columns, in its order (one it gains: empty)
        requests = requests.astype(REQUEST_COLUMNS)
        requests.to_parquet(run_dir / "phases" / f"{index:04d}.parquet")
        # and its validity.json, as the load stage writes it beside the records
        report = validity.validity_report(
            requests, (start, end), users=4, max_tokens=400, prompt_tokens=1400, probe_n=0, stall_gap_s=1.0
        )
        (run_dir / "phases" / f"{index:04d}").mkdir()
        (run_dir / "phases" / f"{index:04d}" / "validity.json").write_text(
            json.dumps({"order": "AB", "rep": rep, "arm": arm, **report})
        )
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "cluster": "bench",
                "order": "AB",
                "repeats": len(windows) // 2,
                "arms": {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}},
                "reference_arm": "A",
                "setting": "busy_loop_s",
                "head": "head",
                "hosts": ["head", "worker"],
                "thresholds_c": [85, 90, 92, 95],
                "trip_point_c": 104.8,
                "reference_lines_c": [96, 87],
                "stall_gap_s": 1.0,
                "timeline_zone": "TSOC",
                "max_tokens": 400,
                "load_s": 1800,
            }
        )
    )


def measure(command: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak MB) of one child process: CPU from its rusage (wait4), peak
    from its own report."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "workflow"), os.environ.get("PYTHONPATH")])),
    }
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _pid, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        errors = stderr.read().decode()
        if child.returncode:
            raise RuntimeError(f"{command[:3]} failed:\n{errors[-2000:]}")
    peak_kb = int(errors.rsplit("peak kB ", 1)[1].split()[0])
    return wall, usage.ru_utime + usage.ru_stime, peak_kb / 1024


def repeated(command: list[str], repeat: int) -> tuple[float, float, float, list[float]]:
    """Fastest wall, its CPU s, largest peak MB, and every wall time."""
    runs = [measure(command) for _ in range(repeat)]
    fastest = min(runs)
    return fastest[0], fastest[1], max(r[2] for r in runs), [r[0] for r in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1, 6, 24, 168])
    parser.add_argument("--requests-per-24h", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each child; the fastest is shown")
    parser.add_argument("--quick", action="store_true", help="a 2-hour run once (seconds): that the bench runs")
    args = parser.parse_args()
    if args.quick:
        args.hours, args.repeat = [2], 1
    analysis, ingest, spread = [], [], []
    for hours in args.hours:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            write_run(run_dir, hours, int(args.requests_per_24h * hours / 24))
            csv_files = list((run_dir / "monitor").glob("*/*.csv"))
            csv_rows = sum(_lines(p) - 1 for p in csv_files)  # less the header
            csv_mb = sum(p.stat().st_size for p in csv_files) / 1e6
            wall, cpu, peak, walls = repeated([sys.executable, "-c", INGEST, str(run_dir)], args.repeat)
            ingest.append(f"{hours:>6g} {csv_rows:>15,} {csv_mb:>7.0f} {wall:>14.2f} {cpu:>6.2f} {peak:>8.0f}")
            spread.append(f"# {hours:g} h ingest wall s: " + " ".join(f"{w:.2f}" for w in walls))
            rows = pq.read_metadata(run_dir / "tidy/telemetry.parquet").num_rows
            requests = pq.read_metadata(run_dir / "tidy/requests.parquet").num_rows
            wall, cpu, peak, walls = repeated([sys.executable, "-c", ANALYZE, str(run_dir)], args.repeat)
            analysis.append(f"{hours:>6g} {rows:>15,} {requests:>9,} {wall:>15.2f} {peak:>8.0f}")
            spread.append(
                f"# {hours:g} h analyze wall s: "
                + " ".join(f"{w:.2f}" for w in walls)
                + f" (CPU s of the fastest: {cpu:.2f})"
            )
    print(f"{'hours':>6} {'telemetry rows':>15} {'requests':>9} {'analyze wall s':>15} {'peak MB':>8}")
    print("\n".join(analysis))
    print()
    print(f"{'hours':>6} {'agent CSV rows':>15} {'CSV MB':>7} {'ingest wall s':>14} {'CPU s':>6} {'peak MB':>8}")
    print("\n".join(ingest))
    print()
    print("\n".join(spread))
    print("targets up to 168 h: <= 10 s and <= 1024 MB for each of ingest and analyze")


def _lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))


if __name__ == "__main__":
    main()
