"""Real runs of the simulated workflow (tier 2) where what keeps a host safe is itself
broken: a server stop command the shutdown cannot format, and a head whose sensors go
silent mid-load. Nothing may stay patched, blind or running."""

from __future__ import annotations

import hashlib
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
from support.processes import live_processes, processes_in, start_as_a_terminal_job, wait_until
from support.sim_runs import CONFIGS, SHM, assert_clean, events, own_ports, wait_for_event

AGENT_DIR = ".thermab/sim/sim/{host}/var/lib/thermab-agent/sim-{order}"


def start_workflow(workdir: Path, overrides: dict) -> subprocess.Popen:
    override_file = workdir / "override.yaml"
    override_file.write_text(yaml.safe_dump(overrides))
    command = snakemake_command(workdir, "all", configfiles=[*CONFIGS, override_file])
    log = open(workdir / "snakemake.log", "w")
    # its own process group, so a SIGINT reaches Snakemake and its jobs as a Ctrl-C does
    return start_as_a_terminal_job(command, stdout=log, stderr=subprocess.STDOUT)


def test_a_stop_command_with_a_stray_brace_cannot_block_the_restore(tmp_path):
    """The session the guardian rebuilds the run from carries a stop command whose brace
    `format` cannot fill (validation refuses it in a config; a session written before, or
    by a bug, may still hold one). Ctrl-C mid-load: the guardian restores both files from
    the kept bytes, fails to stop the head's server and says so, and still stops the agents
    and the thermal models; `thermab restore` then exits 1 naming the failed step."""
    process = start_workflow(tmp_path, {"order": "A", "timings": {"load_s": 30}, "clusters": own_ports(*free_ports(2))})
    run_dir = tmp_path / "results/sim/A"
    try:
        wait_for_event(run_dir, "load_start")
        session = json.loads((run_dir / "session.json").read_text())
        head = session["config"]["clusters"]["sim"]["hosts"]["head"]
        head["server"]["stop"] = head["server"]["stop"] + " ${HOSTNAME}"
        (run_dir / "session.json").write_text(json.dumps(session))
        assert list((tmp_path / "results/sim/patch-state").rglob("state.json")), "the hosts are patched"
        interrupted_at = time.time()
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    guardian_log = run_dir / "logs/guardian.log"
    assert wait_until(lambda: guardian_log.exists() and "shutdown finished" in guardian_log.read_text(), timeout=120)
    log = guardian_log.read_text()
    assert "stop the server on head failed (KeyError: 'HOSTNAME')" in log
    assert "STILL PATCHED" not in log
    restored = [e for e in events(run_dir) if e["event"] == "restored"]
    assert {e["host"] for e in restored} == {"head", "worker"}
    preflight = json.loads((run_dir / "preflight.json").read_text())
    for host in ("head", "worker"):
        current = (tmp_path / ".thermab/sim/sim" / host / SHM).read_bytes()
        assert hashlib.sha256(current).hexdigest() == preflight["hosts"][host]["sha256"]
    print(f"restored {max(e['t'] for e in restored) - interrupted_at:.1f} s after the interrupt")
    assert wait_until(lambda: not [line for line in processes_in(tmp_path) if "guardian" in line], timeout=120), (
        "its work done"
    )
    left = processes_in(tmp_path)  # agents, thermal models and the worker's server are stopped
    assert all("thermab.sim.vllm serve" in line and "/head" in line for line in left), (
        f"only the head's server, whose stop failed, may run on (until its worker is gone): {left}"
    )
    result = subprocess.run(
        [sys.executable, "-m", "thermab", "restore"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    assert "PROBLEM stop the server on head" in result.stderr and "Traceback" not in result.stderr
    stop_servers_left(tmp_path)
    assert_clean(tmp_path, run_dir)


def stop_servers_left(workdir: Path) -> None:
    """The head's server this test's broken stop command could not stop: by its node's own
    stop, else by pid (a head whose worker went first may have dropped its pid file)."""
    subprocess.run(
        [sys.executable, "-m", "thermab.sim.vllm", "stop", "--node", str(workdir / ".thermab/sim/sim/head")],
        check=True,
        timeout=60,
    )
    for pid, cmdline, _cwd in live_processes():
        if str(workdir) in cmdline and "thermab.sim.vllm serve" in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_sensors_going_silent_mid_load_stop_the_load_naming_the_host(tmp_path):
    """The head's agent hangs (SIGSTOP: alive, so not restarted, but no reading comes) in
    the middle of the stock load: within safety.max_sensor_silence_s (default: 3 thermal
    intervals, at least 5 s) the load stops, the run ends naming the host, all restored."""
    process = start_workflow(tmp_path, {"order": "A", "timings": {"load_s": 60}, "clusters": own_ports(*free_ports(2))})
    run_dir = tmp_path / "results/sim/A"
    agent_pid = None
    try:
        wait_for_event(run_dir, "load_start")
        time.sleep(3)
        agent_pid = int((tmp_path / AGENT_DIR.format(host="head", order="A") / "agent.pid").read_text())
        os.kill(agent_pid, signal.SIGSTOP)
        silenced_at = time.time()
        assert process.wait(timeout=300) != 0, "a blind interlock fails the run"
    finally:
        if process.poll() is None:
            process.kill()
        if agent_pid is not None:
            try:
                os.kill(agent_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    aborts = [e for e in events(run_dir) if e["event"] == "abort"]
    assert aborts and aborts[0]["detail"]["reason"].startswith("blind: host head"), aborts
    ends = [e["t"] for e in events(run_dir) if e["event"] == "load_end"]
    assert not ends or ends[0] > aborts[0]["t"], "stopped before its end"
    print(f"abort {aborts[0]['t'] - silenced_at:.1f} s after the agent hung: {aborts[0]['detail']['reason']}")
    assert_clean(tmp_path, run_dir)
