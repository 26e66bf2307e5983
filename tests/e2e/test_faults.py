"""Faults injected into real runs of the simulated workflow (tier 2): the interlock, a
server dying mid-load, an agent killed mid-load; and resuming after the failure. Each test
checks that nothing is lost and nothing is left patched or running."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from support.command_line import snakemake_command
from support.ports import free_ports
from support.sim_runs import CONFIGS, assert_clean, events, own_ports, wait_for_event


def run_workflow(workdir: Path, overrides: dict, *extra: str, background: bool = False):
    override_file = workdir / "override.yaml"
    override_file.write_text(yaml.safe_dump(overrides))
    command = snakemake_command(workdir, "all", *extra, configfiles=[*CONFIGS, override_file])
    log = open(workdir / f"snakemake-{time.time():.0f}.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return process if background else process.wait(timeout=900)


def test_thermal_interlock_stops_the_load_and_restores(tmp_path):
    code = run_workflow(
        tmp_path, {"safety": {"abort_at_c": 70}, "timings": {"load_s": 60}, "clusters": own_ports(*free_ports(2))}
    )
    run_dir = tmp_path / "results/sim/AB"
    assert code != 0, "an interlock abort fails the run"
    aborts = [e for e in events(run_dir) if e["event"] == "abort"]
    assert aborts and "thermal interlock" in aborts[0]["detail"]["reason"]
    assert "host head" in aborts[0]["detail"]["reason"] or "host worker" in aborts[0]["detail"]["reason"]
    # the first sample at or above the limit, from the pulled agent logs
    crossings = []
    for host in ("head", "worker"):
        with open(run_dir / f"monitor/{host}/thermal.csv") as handle:
            crossings += [float(r["t"]) for r in csv.DictReader(handle) if r["value"] and float(r["value"]) >= 70]
    first_crossing = min(crossings)
    records = [json.loads(line) for line in (run_dir / "phases/rep1-A/requests.jsonl").read_text().splitlines()]
    interval = 1.0  # monitor.intervals.thermal of the default config
    assert max(r["t_start"] for r in records) <= first_crossing + interval + 1.0, (
        "no request starts later than one sample interval plus 1 s after the limit was reached"
    )
    assert (run_dir / "phases/rep1-A/validity.json").exists(), "what was measured is kept"
    assert_clean(tmp_path, run_dir)


def test_interlock_too_close_to_the_trip_point_is_refused(tmp_path):
    code = run_workflow(tmp_path, {"safety": {"abort_at_c": 104}, "clusters": own_ports(*free_ports(2))})
    assert code != 0
    preflight_log = (tmp_path / "results/sim/AB/logs/preflight.log").read_text()
    assert "safety.abort_at_c" in preflight_log and "trip point" in preflight_log
    assert not (tmp_path / "results/sim/AB/monitor/started.json").exists(), "nothing started"
    assert_clean(tmp_path, tmp_path / "results/sim/AB")


def test_server_killed_mid_load_fails_the_phase_then_a_rerun_redoes_it(tmp_path):
    # one arm: the failed phase and its redo are what is checked; a phase after it would
    # only add a restart and a load to the rerun
    overrides = {"timings": {"load_s": 30}, "order": "A", "clusters": own_ports(*free_ports(2))}
    process = run_workflow(tmp_path, overrides, background=True)
    run_dir = tmp_path / "results/sim/A"
    try:
        wait_for_event(run_dir, "load_start")
        time.sleep(8)
        subprocess.run(
            [sys.executable, "-m", "thermab.sim.vllm", "stop", "--node", str(tmp_path / ".thermab/sim/sim/head")],
            check=True,
            timeout=60,
        )
        assert process.wait(timeout=300) != 0
    finally:
        if process.poll() is None:
            process.kill()
    aborts = [e for e in events(run_dir) if e["event"] == "abort" and e.get("arm") == "A"]
    assert aborts and "load requests failed" in aborts[0]["detail"]["reason"]
    records = [json.loads(line) for line in (run_dir / "phases/rep1-A/requests.jsonl").read_text().splitlines()]
    assert any(r["ok"] for r in records) and any(not r["ok"] for r in records), "both kept: done and failed"
    assert_clean(tmp_path, run_dir)
    baseline = run_dir / "phases/baseline/phase.json"
    baseline_mtime = baseline.stat().st_mtime
    assert run_workflow(tmp_path, overrides) == 0, "the rerun completes"
    assert baseline.stat().st_mtime == baseline_mtime, "the finished baseline is not redone"
    load_starts = [e for e in events(run_dir) if e["event"] == "load_start" and e["arm"] == "A"]
    assert len(load_starts) == 2, "the failed phase was redone"
    assert_clean(tmp_path, run_dir)


def test_agent_killed_mid_load_is_restarted_and_the_gap_marked(tmp_path):
    process = run_workflow(
        tmp_path, {"timings": {"load_s": 30}, "order": "A", "clusters": own_ports(*free_ports(2))}, background=True
    )
    run_dir = tmp_path / "results/sim/A"
    agent_dir = tmp_path / ".thermab/sim/sim/head/var/lib/thermab-agent/sim-A"
    try:
        wait_for_event(run_dir, "load_start")
        time.sleep(3)
        os.kill(int((agent_dir / "agent.pid").read_text()), signal.SIGKILL)
        killed_at = time.time()
        assert process.wait(timeout=300) == 0, "the run goes on"
    finally:
        if process.poll() is None:
            process.kill()
    notes = [e for e in events(run_dir) if e["event"] == "note" and e.get("host") == "head"]
    assert notes and "agent_restarted" in notes[0]["detail"]
    assert notes[0]["t"] - killed_at < 10, "restarted within a few seconds"
    starts = (run_dir / "monitor/head/agent_events.csv").read_text().count(",agent_start,")
    assert starts == 2, "the restart row marks the gap"
    assert_clean(tmp_path, run_dir)
