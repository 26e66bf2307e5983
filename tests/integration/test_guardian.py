"""The dead-man switch: when the controller dies mid-run, every host is restored."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from support.paths import REPO as ROOT
from support.processes import wait_until
from thermab.config import validate, view
from thermab.experiment import events, guardian
from thermab.experiment.cluster import ClusterRun, exit_status
from thermab.telemetry import deploy

STOCK = "class SpinCondition:\n    def __init__(self,\n        busy_loop_s: float = 1,\n    ): pass\n"
FILE = "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py"


def local_cluster_config(tmp_path: Path) -> dict:
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw["clusters"] = {
        "t": {
            "head": "head",
            "endpoint": "http://127.0.0.1:9",
            "end_state": "stopped",
            "hosts": {
                "head": {
                    "transport": "local",
                    "root": str(tmp_path / "head"),
                    "agent_dir": str(tmp_path / "agent"),
                    "process_pattern": "no-such-process-xyz",
                }
            },
        }
    }
    return validate(raw)


def test_guardian_restores_and_stops_when_the_controller_dies(tmp_path):
    target = tmp_path / "head" / FILE.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text(STOCK)
    run = ClusterRun(view(local_cluster_config(tmp_path)), "t", "AB", tmp_path / "results/t/AB", tmp_path)
    run.write_session()
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        guardian_pid = guardian.ensure(run.run_dir, watch=controller.pid)
        assert guardian.ensure(run.run_dir, watch=controller.pid) == guardian_pid, "one guardian per controller"
        host = run.hosts[0]
        agent = deploy.start_agent(host, run.session, run.agent_settings(host))
        run.patcher(host).apply("0.002")
        assert "busy_loop_s: float = 0.002," in target.read_text()
    finally:
        controller.kill()
        controller.wait()
    assert wait_until(lambda: not guardian.alive(guardian_pid)), "the guardian finishes its shutdown and exits"
    assert target.read_text() == STOCK, "the file is byte-identical to its original"
    assert not run.patcher(run.hosts[0]).is_patched
    assert not guardian.alive(agent)
    names = [e["event"] for e in events.read(run.run_dir)]
    assert names.index("abort") < names.index("restored"), "the abort is marked when it happens"
    assert (run.run_dir / "monitor/head/agent.json").exists(), "the logs were pulled before stopping"
    log = (run.run_dir / "logs/guardian.log").read_text()
    assert "controller" in log and "shutdown complete" in log


def test_released_guardian_does_nothing(tmp_path):
    run = ClusterRun(view(local_cluster_config(tmp_path)), "t", "AB", tmp_path / "results/t/AB", tmp_path)
    run.write_session()
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid = guardian.ensure(run.run_dir, watch=controller.pid)
        guardian.release(run.run_dir)
        assert wait_until(lambda: not guardian.alive(pid))
    finally:
        controller.kill()
        controller.wait()
    assert not any(e["event"] == "abort" for e in events.read(run.run_dir))


def patched_run_with_broken_stop(tmp_path: Path) -> tuple[ClusterRun, Path, int]:
    """A patched host with a running agent, whose config carries a stop command with a stray
    brace: validation refuses that today, but a session written before, or by a bug, may not."""
    target = tmp_path / "head" / FILE.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text(STOCK)
    config = local_cluster_config(tmp_path)
    config["clusters"]["t"]["hosts"]["head"]["server"] = {"stop": "echo ${HOSTNAME}", "start": "true"}
    run = ClusterRun(view(config), "t", "AB", tmp_path / "results/t/AB", tmp_path)
    run.write_session()
    host = run.hosts[0]
    agent = deploy.start_agent(host, run.session, run.agent_settings(host))
    run.patcher(host).apply("0.002")
    return run, target, agent


def test_shutdown_restores_first_and_goes_on_past_a_broken_stop_command(tmp_path):
    run, target, agent = patched_run_with_broken_stop(tmp_path)
    problems = run.shutdown("test abort")
    assert target.read_text() == STOCK, "the file is restored, from the kept bytes"
    assert [p for p in problems if p.startswith("stop the server on head: KeyError")], problems
    assert len(problems) == 1, "every other step ran and succeeded"
    assert wait_until(lambda: not guardian.alive(agent)), "the agent is stopped after the failed step"
    assert (run.run_dir / "monitor/head/agent.json").exists(), "and its logs pulled"
    names = [e["event"] for e in events.read(run.run_dir)]
    assert names.index("abort") < names.index("restored")
    assert run.still_patched() == []
    assert exit_status(problems, run.still_patched()) == 1


def test_restore_command_says_what_failed_in_its_exit_status(tmp_path):
    run, target, agent = patched_run_with_broken_stop(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "thermab", "restore", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert "PROBLEM stop the server on head" in result.stderr and "Traceback" not in result.stderr
    assert target.read_text() == STOCK
    assert wait_until(lambda: not guardian.alive(agent))
    # a host whose original cannot be written back keeps its state, and the status says so
    run.patcher(run.hosts[0]).apply("0.002")
    target.chmod(0o444)
    target.parent.chmod(0o555)
    try:
        if os.access(target, os.W_OK):
            return  # root ignores the modes: the unwritable case cannot be made here
        result = subprocess.run(
            [sys.executable, "-m", "thermab", "restore", str(tmp_path / "results")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        target.parent.chmod(0o755)
        target.chmod(0o644)
    assert result.returncode == 3 and "STILL PATCHED t/head" in result.stderr


def test_a_terminated_guardian_restores_at_once(tmp_path):
    """SIGTERM is what a scheduler sends every process of a job it cancels or times out,
    the guardian included, SIGKILL following: the guardian restores within that grace,
    even while its controller lives on."""
    target = tmp_path / "head" / FILE.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text(STOCK)
    run = ClusterRun(view(local_cluster_config(tmp_path)), "t", "AB", tmp_path / "results/t/AB", tmp_path)
    run.write_session()
    controller = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
    )
    try:
        pid = guardian.ensure(run.run_dir, watch=controller.pid)
        run.patcher(run.hosts[0]).apply("0.002")
        os.kill(pid, signal.SIGTERM)
        assert wait_until(lambda: not guardian.alive(pid), timeout=guardian.TERM_WAIT_S + 20)
        assert controller.poll() is None, "the controller still runs"
    finally:
        controller.kill()
        controller.wait()
    assert target.read_text() == STOCK
    aborts = [e for e in events.read(run.run_dir) if e["event"] == "abort"]
    assert len(aborts) == 1 and "SIGTERM" in aborts[0]["detail"]["reason"]
    assert [e["host"] for e in events.read(run.run_dir) if e["event"] == "restored"] == ["head"]
    assert not (run.run_dir / guardian.PID_FILE).exists()


def test_restore_puts_back_the_interrupted_run_of_a_cluster_with_several(tmp_path):
    """AB ended cleanly; BA was interrupted mid-phase, its guardian killed with the
    controller (its file left): restore puts the hosts back and writes the abort and
    restored events into BA's own events.jsonl, none into AB's."""
    target = tmp_path / "head" / FILE.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text(STOCK)
    config = view(local_cluster_config(tmp_path))
    ab = ClusterRun(config, "t", "AB", tmp_path / "results/t/AB", tmp_path)
    ab.write_session()
    ab.event("run_start")
    ab.event("patch_applied", rep=1, arm="B", host="head", detail=ab.patcher(ab.hosts[0]).apply("0.002"))
    assert ab.shutdown("completed") == []
    ab.event("run_end", detail={"problems": []})
    ba = ClusterRun(config, "t", "BA", tmp_path / "results/t/BA", tmp_path)
    ba.write_session()
    ba.event("run_start")
    agent = deploy.start_agent(ba.hosts[0], ba.session, ba.agent_settings(ba.hosts[0]))
    ba.event("patch_applied", rep=1, arm="B", host="head", detail=ba.patcher(ba.hosts[0]).apply("0.002"))
    (ba.run_dir / guardian.PID_FILE).write_text('{"pid": 999999999, "watch": 999999998}')  # killed with it
    before_ab = (ab.run_dir / "events.jsonl").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "thermab", "restore", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert target.read_text() == STOCK
    assert wait_until(lambda: not guardian.alive(agent)), "BA's agent is stopped"
    assert (ab.run_dir / "events.jsonl").read_text() == before_ab, "the finished run is left as it was"
    names = [e["event"] for e in events.read(ba.run_dir)]
    assert names[-2:] == ["abort", "restored"] or names.index("abort") < names.index("restored"), names
    assert "ended cleanly" in result.stdout and str(ab.run_dir) in result.stdout
    assert not (ba.run_dir / guardian.PID_FILE).exists()
