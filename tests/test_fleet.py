"""Two simulated clusters at once (tier 2): both complete with separate results, their
phases overlap in time, and the fleet report compares them."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from processes import processes_in
from test_e2e_sim import REPO

pytestmark = pytest.mark.e2e


def load_windows(run_dir: Path) -> list[tuple[float, float]]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    starts = [e["t"] for e in events if e["event"] == "load_start"]
    ends = [e["t"] for e in events if e["event"] == "load_end"]
    return list(zip(starts, ends))


def test_two_simulated_clusters_run_concurrently(tmp_path):
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
               str(tmp_path), "--configfile", str(REPO / "config/examples/sim-fleet.yaml"), "--cores", "4",
               "--keep-going", "all"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    (tmp_path / "snakemake.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    a, b = tmp_path / "results/sim-a/AB", tmp_path / "results/sim-b/AB"
    for run_dir in (a, b):
        assert (run_dir / "summary.md").exists() and (run_dir / "report.html").exists()
        assert json.loads((run_dir / "run.json").read_text())["cluster"] == run_dir.parent.name
    overlapping = [(x, y) for x in load_windows(a) for y in load_windows(b) if x[0] < y[1] and y[0] < x[1]]
    assert overlapping, "the clusters' load phases overlapped in time"
    fleet = pd.read_csv(tmp_path / "results/fleet/AB/fleet.csv")
    assert set(fleet["cluster"]) == {"sim-a", "sim-b"}
    assert {"head TSOC mean", "head vLLM CPU median", "output throughput"} <= set(fleet["metric"])
    assert "sim-a" in (tmp_path / "results/fleet/AB/fleet.md").read_text()
    for name in ("sim-a", "sim-b"):
        assert not list((tmp_path / f"results/{name}/patch-state").rglob("state.json"))
    assert_clean_all(tmp_path)


def assert_clean_all(workdir: Path) -> None:
    deadline = time.monotonic() + 30
    while processes_in(workdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_in(workdir) == []
