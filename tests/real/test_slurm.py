"""The fleet on a real one-node SLURM (tests/support/slurm.py), through config/profiles/slurm
(tier 3, real): the same result files as a local run, no telemetry holes, and a
controller's batch job cancelled mid-load leaves every host restored, nothing running, and
its events saying so.  One SLURM run of the short fleet (tests/support/fleet.py: two clusters,
15-s loads), compared with the local run test_fleet.py checks too (conftest.py's
``local_fleet``); a few minutes in all."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pandas as pd
import pytest

from support.command_line import snakemake_command
from support.fleet import snakemake
from support.paths import REPO
from support.processes import processes_in, wait_until
from support.sim_runs import CONFIGS, SHM, ports_file
from support.slurm import start_slurm

PROFILE = REPO / "config/profiles/slurm"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    pytest.importorskip(
        "snakemake_executor_plugin_slurm",
        reason="no SLURM executor plugin: pip install -e '.[slurm]' to run the SLURM tier",
    )
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def result_files(workdir: Path) -> set[str]:
    return {str(p.relative_to(workdir)) for p in (workdir / "results").rglob("*") if p.is_file()}


def completeness_notes(summary: Path) -> list[list[str]]:
    """The rows (host, source, ..., note) of summary.md's telemetry completeness table."""
    section = summary.read_text().split("## Telemetry completeness", 1)[1]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]  # past the header and its rule


@pytest.fixture(scope="module")
def fleet_runs(local_fleet, slurm, tmp_path_factory):
    config, local = local_fleet
    batch = tmp_path_factory.mktemp("batch")
    result = snakemake(batch, [str(config)], "--profile", str(PROFILE), "all", env=slurm.env)
    assert result.returncode == 0, result.stderr[-4000:]
    return local, batch


def test_the_fleet_through_slurm_gives_the_local_run_s_files(fleet_runs, slurm):
    local, batch = fleet_runs
    assert result_files(batch) == result_files(local)
    for table in ("zones", "cpu", "performance", "validity", "energy", "variance"):
        for cluster in ("sim-a", "sim-b"):
            path = f"results/{cluster}/AB/tables/{table}.csv"
            assert list(pd.read_csv(batch / path).columns) == list(pd.read_csv(local / path).columns), path
    assert set(pd.read_csv(batch / "results/fleet/AB/fleet.csv")["cluster"]) == {"sim-a", "sim-b"}
    # the analysis went to SLURM (ingest, analyze, tables, summary, evidence, figures per cluster and the fleet report)
    states = [state for _id, _name, state in slurm.jobs()]
    assert len(states) >= 7 and set(states) == {"COMPLETED"}, states
    for directory in (local, batch):
        for cluster in ("sim-a", "sim-b"):
            assert not list((directory / f"results/{cluster}/patch-state").rglob("state.json"))
    assert wait_until(lambda: processes_in(batch) == [], timeout=30), processes_in(batch)


# "power" pools RAPL (5 s) and hwmon power (1 s) under one interval, so a local run notes a
# gap there too: the batch run must note nothing a local run does not
AGENT_CADENCE = ("thermal", "cpu", "freq")


def test_no_telemetry_hole_through_slurm(fleet_runs):
    local, batch = fleet_runs
    for cluster in ("sim-a", "sim-b"):
        rows = completeness_notes(batch / f"results/{cluster}/AB/summary.md")
        assert {(row[0], row[1]) for row in rows} >= {
            (host, source) for host in ("head", "worker") for source in AGENT_CADENCE
        }
        holes = [row for row in rows if row[1] in AGENT_CADENCE and (row[-1] or row[4] in ("", "0"))]
        assert holes == [], f"{cluster}: {holes}"
        local_rows = completeness_notes(local / f"results/{cluster}/AB/summary.md")
        assert {(row[0], row[1]): bool(row[-1]) for row in rows} == {
            (row[0], row[1]): bool(row[-1]) for row in local_rows
        }
        events = [json.loads(line) for line in (batch / f"results/{cluster}/AB/events.jsonl").read_text().splitlines()]
        assert not [e for e in events if e["event"] == "note" and "agent_restarted" in e.get("detail", {})], (
            "each host's agent ran the whole run, never restarted"
        )
        assert [e["event"] for e in events].count("run_start") == 1


def test_scancel_during_a_load_restores_every_host(slurm, tmp_path):
    """The controller itself in a batch job (a site that keeps long processes off its
    login nodes): scancel of the run's jobs mid-load sends SIGTERM to every process of the
    job, SIGKILL 30 s later; the guardian restores within that grace."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    command = " ".join(
        snakemake_command(
            workdir, "--profile", PROFILE, "all", configfiles=[*CONFIGS, ports_file(tmp_path)], cores=None
        )
    )
    submitted = slurm.run(
        "sbatch",
        "--parsable",
        "--job-name=thermab-controller",
        "--cpus-per-task=1",
        f"--chdir={workdir}",
        f"--output={workdir / 'controller.log'}",
        f"--wrap={command}",
    )
    job = submitted.stdout.strip().split(";")[0]
    run_dir = workdir / "results/sim/AB"
    events_path = run_dir / "events.jsonl"

    def loading() -> bool:
        return events_path.exists() and '"load_start"' in events_path.read_text()

    try:
        assert wait_until(loading, timeout=300, poll_s=0.5), (workdir / "controller.log").read_text()[-3000:]
        time.sleep(3)  # in the middle of a load, the hosts patched
        running = [job_id for job_id, _name, state in slurm.jobs() if state in ("RUNNING", "PENDING")]
        assert job in running
        slurm.run("scancel", *running)
        assert wait_until(lambda: processes_in(workdir) == [], timeout=90, poll_s=0.5), processes_in(workdir)
    finally:
        slurm.run("scancel", job, check=False)
    assert dict((j, s) for j, _n, s in slurm.jobs())[job] == "CANCELLED"
    assert not list((workdir / "results/sim/patch-state").rglob("state.json")), "nothing left patched"
    preflight = json.loads((run_dir / "preflight.json").read_text())
    for host in ("head", "worker"):
        current = (workdir / ".thermab/sim/sim" / host / SHM).read_bytes()
        assert hashlib.sha256(current).hexdigest() == preflight["hosts"][host]["sha256"], host
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    names = [e["event"] for e in events]
    after = names[names.index("load_start") :]
    assert "abort" in after and "load_end" not in after, names
    assert sorted(e["host"] for e in events[names.index("abort") :] if e["event"] == "restored") == [
        "head",
        "worker",
    ], "the interrupted run's own events say each host was restored"
    abort = events[names.index("abort")]
    assert "SIGTERM" in abort["detail"]["reason"], "the job put the hosts back itself, within the grace"
    assert not (run_dir / "phases/rep1-A/phase.json").exists()
