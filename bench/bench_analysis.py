"""How long ``analyze`` takes, and how much memory, on long runs.

Writes synthetic run directories (1 Hz samples of 2 hosts x 20 sensors: 7 zones, the vLLM
CPU and 12 core clocks; AB phases of 30 min load + 30 min rest; 50 000 requests for the
24-h run, proportionally fewer for shorter ones), then runs ``python -m thermab analyze``
on each in a child process and prints wall time and the child's peak memory.
Targets for 24 h: <= 10 s and <= 1 GB.

    python bench/bench_analysis.py [--hours 1 6 24]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
ZONES = ["TSOC", "TS0E", "TS0P", "TS1E", "TS1P", "TGPU", "TUNC"]
SENSORS = [("thermal", z) for z in ZONES] + [("cpu", "vllm_cpu_pct")] + [("freq", f"cpu{i}") for i in range(12)]
PHASE_S = 3600  # 30 min load + 30 min rest


def write_run(run_dir: Path, hours: float, requests_total: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    seconds = int(hours * 3600)
    t = np.arange(seconds, dtype="float64")
    (run_dir / "tidy").mkdir(parents=True)
    events, windows = [{"t": 0.0, "event": "run_start", "order": "AB"}], []
    for index, start in enumerate(range(0, seconds - PHASE_S + 1, PHASE_S)):
        arm, rep = "AB"[index % 2], index // 2 + 1
        windows.append((start + 60.0, start + 60.0 + 1800, arm, rep))
        events += [{"t": start + 60.0, "event": "load_start", "order": "AB", "rep": rep, "arm": arm},
                   {"t": start + 1860.0, "event": "load_end", "order": "AB", "rep": rep, "arm": arm}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    loaded = np.zeros(seconds, dtype=bool)
    for start, end, _arm, _rep in windows:
        loaded[int(start):int(end)] = True
    frames = []
    for host in ("head", "worker"):
        for kind, sensor in SENSORS:
            base = {"thermal": 50.0, "cpu": 20.0, "freq": 3900.0}[kind]
            rise = {"thermal": 35.0, "cpu": 300.0, "freq": 0.0}[kind]
            values = base + rise * loaded + rng.normal(0, 0.5, seconds)
            frames.append(pd.DataFrame({"t": t, "host": host, "kind": kind, "sensor": sensor, "value": values}))
    pd.concat(frames, ignore_index=True).astype(
        {"host": "string", "kind": "string", "sensor": "string"}).to_parquet(run_dir / "tidy/telemetry.parquet")
    per_window = max(requests_total // max(len(windows), 1), 1)
    rows = []
    for start, end, arm, rep in windows:
        starts = np.sort(rng.uniform(start, end, per_window))
        rows.append(pd.DataFrame({
            "order": "AB", "rep": rep, "arm": arm, "kind": "load", "user": rng.integers(1, 5, per_window),
            "tag": [f"r{rep}{arm}{i}" for i in range(per_window)], "t_start": starts,
            "t_first_token": starts + 0.3, "t_end": starts + 18.0, "prompt_tokens": 1400,
            "completion_tokens": 400, "cached_tokens": 0, "ok": True, "error": "",
            "max_gap_s": rng.uniform(0.02, 0.2, per_window), "stall_gaps": 0}))
    requests = pd.concat(rows, ignore_index=True)
    requests.astype({"prompt_tokens": "Int64", "completion_tokens": "Int64", "cached_tokens": "Int64"}).to_parquet(
        run_dir / "tidy/requests.parquet")
    (run_dir / "run.json").write_text(json.dumps({
        "cluster": "bench", "order": "AB", "repeats": len(windows) // 2,
        "arms": {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}},
        "reference_arm": "A", "setting": "busy_loop_s", "head": "head", "hosts": ["head", "worker"],
        "thresholds_c": [85, 90, 92, 95], "trip_point_c": 104.8, "reference_lines_c": [96, 87],
        "stall_gap_s": 1.0, "timeline_zone": "TSOC", "max_tokens": 400, "load_s": 1800}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1, 6, 24])
    parser.add_argument("--requests-per-24h", type=int, default=50_000)
    args = parser.parse_args()
    print(f"{'hours':>6} {'telemetry rows':>15} {'requests':>9} {'analyze wall s':>15} {'peak MB':>8}")
    for hours in args.hours:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            write_run(run_dir, hours, int(args.requests_per_24h * hours / 24))
            rows = pd.read_parquet(run_dir / "tidy/telemetry.parquet", columns=["t"]).shape[0]
            requests = pd.read_parquet(run_dir / "tidy/requests.parquet", columns=["t_end"]).shape[0]
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "thermab", "analyze", str(run_dir)], check=True,
                           capture_output=True, cwd=REPO)
            wall = time.perf_counter() - started
            peak_mb = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024
            print(f"{hours:>6g} {rows:>15,} {requests:>9,} {wall:>15.2f} {peak_mb:>8.0f}")
    print("targets for 24 h: <= 10 s, <= 1024 MB (peak is the largest child so far: it only grows)")


if __name__ == "__main__":
    main()
