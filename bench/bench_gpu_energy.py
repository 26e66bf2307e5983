"""GPU energy on real hardware: the agent beside a GPU load, counter against sampled power.

Records: runs the real agent (``gpu_power`` every ``--interval`` s: nvidia-smi's ``power.draw``
and the energy counter, from nvidia-smi's ``total_energy_consumption`` or else NVML) while
this script idles, keeps the GPU busy with a torch bf16 matmul loop, then idles again, and
keeps the agent's ``gpu_power.csv`` in ``--out``.  Needs an NVIDIA GPU with torch.

Analyses (also a recording made earlier: ``--from DIR``): over the span from the first to
the last counter reading, the energy from the counter (last minus first) against the
energy of the sampled ``power.draw`` readings by the analysis' rule (time-weighted mean of
the readings × the span), also with only every 5th and 15th reading kept (every phase of
the decimation); and the mean power idle and under load, from each.

    python bench/bench_gpu_energy.py [--idle 10] [--load 40] [--interval 1] --out DIR
    python bench/bench_gpu_energy.py --from DIR
    python bench/bench_gpu_energy.py --quick        # the H200 recording of bench/data, analysed
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from thermab.analysis.energy import time_weighted_mean  # noqa: E402
from thermab.telemetry import (
    agent as agent_module,  # noqa: E402
    power,  # noqa: E402
)


def gpu_load(seconds: float) -> int:
    """bf16 8192³ products back to back for ``seconds``; returns how many."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    count, end = 0, time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        count += 10
    return count


def record(args) -> Path:
    print(
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,power.limit", "--format=csv"],
            capture_output=True,
            text=True,
        ).stdout
    )
    work = Path(tempfile.mkdtemp(prefix="thermab-gpu-energy-"))
    (work / "agent.json").write_text(
        json.dumps(
            {
                "out_dir": str(work),
                "stop_file": str(work / "stop"),
                # only the power sources, so nothing else shares the sampling loop
                "intervals": {
                    **{name: 0 for name in ("thermal", "hwmon", "freq", "cpu", "system", "gpu")},
                    **{name: args.interval for name in ("gpu_power", "rapl", "hwmon_power", "ipmi")},
                },
            }
        )
    )
    agent = subprocess.Popen([sys.executable, agent_module.__file__, "--config", str(work / "agent.json")])
    time.sleep(args.idle)
    load_start = time.time()
    products = gpu_load(args.load)
    load_end = time.time()
    time.sleep(args.idle)
    (work / "stop").touch()
    agent.wait(timeout=30)
    print(f"matmul products: {products} in {load_end - load_start:.1f} s")
    meta = json.loads((work / "agent.json").read_text())
    print("agent sources:", meta["sources"], "discovered:", json.dumps(meta["discovered"]))
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / "gpu_power.csv", args.out / "gpu_power.csv")
    return args.out


def analyse(directory: Path, interval: float) -> None:
    raw = pd.read_csv(directory / "gpu_power.csv", dtype={"value": "float64"}, keep_default_na=False, na_values=[""])
    print("rows:", len(raw), "missing:", raw[raw["value"].isna()]["reason"].value_counts().to_dict())
    raw = raw.dropna(subset=["value"])
    readings = raw[raw["sensor"] == "gpu0 W"].sort_values("t")
    counter = raw[raw["sensor"] == "gpu0 mJ"].sort_values("t")
    t_w, w = readings["t"].to_numpy(), readings["value"].to_numpy()
    gaps = np.diff(t_w)
    print(f"power.draw readings: {len(t_w)}, interval median {np.median(gaps):.3f} s, max {gaps.max():.3f} s")
    if counter.empty:
        print("no energy counter: neither nvidia-smi nor NVML reported one")
        return
    t_c, raw_mj = counter["t"].to_numpy(), counter["value"].to_numpy()
    middle, watts, resets = power.counter_power(t_c, raw_mj, power.JOULES_PER_UNIT["mJ"], None)
    print(f"counter readings: {len(t_c)}, resets {resets}")
    span = t_c[-1] - t_c[0]
    counter_j = (raw_mj[-1] - raw_mj[0]) * power.JOULES_PER_UNIT["mJ"]
    print(f"\nspan: first to last counter reading, {span:.1f} s")
    print(f"counter energy: {counter_j:.1f} J (mean {counter_j / span:.1f} W)")
    near = (t_w >= t_c[0] - interval / 2) & (t_w <= t_c[-1] + interval / 2)
    t_s, w_s = t_w[near], w[near]
    for step in (1, 5, 15):
        found = [time_weighted_mean(t_s[offset::step], w_s[offset::step]) * span for offset in range(step)]
        errors = [(j / counter_j - 1) * 100 for j in found]
        print(
            f"power.draw every {step * interval:g} s: {min(found):.1f} to {max(found):.1f} J, "
            f"{min(errors):+.3f} to {max(errors):+.3f} % against the counter ({step} phase(s))"
        )
    loaded = np.flatnonzero(w >= 0.9 * w.max())
    first, last = t_w[loaded[0]], t_w[loaded[-1]]
    print(f"\nunder load (readings >= 90 % of the largest): {last - first:.0f} s")
    for name, low, high in (
        ("idle before", -np.inf, first - 2),
        ("load", first + 1, last - 1),
        ("idle after", last + 2, np.inf),
    ):
        from_readings = w[(t_w >= low) & (t_w < high)]
        from_counter = watts[(middle >= low) & (middle < high)]
        print(
            f"{name}: power.draw {from_readings.mean():.1f} W (n = {len(from_readings)}), "
            f"counter {from_counter.mean():.1f} W (n = {len(from_counter)})"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=10.0, help="idle seconds before and after the load")
    parser.add_argument("--load", type=float, default=40.0, help="seconds of matmul load")
    parser.add_argument("--interval", type=float, default=1.0, help="agent sampling interval (s)")
    parser.add_argument("--out", type=Path, help="where to keep the recording")
    parser.add_argument("--from", dest="recording", type=Path, help="analyse this recording, record nothing")
    parser.add_argument("--quick", action="store_true", help="analyse the H200 recording of bench/data (no GPU)")
    args = parser.parse_args(argv)
    if args.quick:
        args.recording = Path(__file__).resolve().parent / "data/h200-gpu-energy"
    if args.recording is None and args.out is None:
        parser.error("--out DIR to record, or --from DIR to analyse a recording")
    analyse(args.recording or record(args), args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
