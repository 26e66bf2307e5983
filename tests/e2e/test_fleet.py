"""Two simulated clusters at once (tier 2): both complete with separate results, their
phases overlap in time, and the fleet report compares them.  The short fleet of
tests/support/fleet.py, whose run the SLURM tier shares (conftest.py's ``local_fleet``)."""

import json
import time
from pathlib import Path

import pandas as pd

from support.processes import processes_in


def phase_windows(run_dir: Path) -> list[tuple[float, float]]:
    """Each phase from its server restart to its load's end: on a machine shared with other
    work Locust's start takes most of a short load, so the loads alone may just miss each
    other while the phases (restart, load) run side by side."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    starts = [e["t"] for e in events if e["event"] == "restart_start"]
    ends = [e["t"] for e in events if e["event"] == "load_end"]
    return list(zip(starts, ends, strict=True))


def test_two_simulated_clusters_run_concurrently(local_fleet):
    _config, tmp_path = local_fleet
    a, b = tmp_path / "results/sim-a/AB", tmp_path / "results/sim-b/AB"
    for run_dir in (a, b):
        assert (run_dir / "summary.md").exists() and (run_dir / "report.html").exists()
        assert json.loads((run_dir / "run.json").read_text())["cluster"] == run_dir.parent.name
    overlapping = [(x, y) for x in phase_windows(a) for y in phase_windows(b) if x[0] < y[1] and y[0] < x[1]]
    assert overlapping, "the clusters' phases overlapped in time"
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
