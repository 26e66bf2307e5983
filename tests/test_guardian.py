"""The dead-man switch: when the controller dies mid-run, every host is restored."""

import subprocess
import sys
import time
from pathlib import Path

import yaml

from thermab.experiment import events
from thermab.experiment import guardian
from thermab.telemetry import deploy
from thermab.config import validate
from thermab.experiment.cluster import ClusterRun

ROOT = Path(__file__).resolve().parents[1]
STOCK = "class SpinCondition:\n    def __init__(self,\n        busy_loop_s: float = 1,\n    ): pass\n"
FILE = "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py"


def local_cluster_config(tmp_path: Path) -> dict:
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw["clusters"] = {"t": {"head": "head", "endpoint": "http://127.0.0.1:9", "end_state": "stopped", "hosts": {
        "head": {"transport": "local", "root": str(tmp_path / "head"), "agent_dir": str(tmp_path / "agent"),
                 "process_pattern": "no-such-process-xyz"}}}}
    return validate(raw)


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_guardian_restores_and_stops_when_the_controller_dies(tmp_path):
    target = tmp_path / "head" / FILE.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text(STOCK)
    run = ClusterRun(local_cluster_config(tmp_path), "t", "AB", tmp_path / "results/t/AB", tmp_path)
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
    assert wait_for(lambda: not guardian.alive(guardian_pid)), "the guardian finishes its shutdown and exits"
    assert target.read_text() == STOCK, "the file is byte-identical to its original"
    assert not run.patcher(run.hosts[0]).is_patched
    assert not guardian.alive(agent)
    names = [e["event"] for e in events.read(run.run_dir)]
    assert names.index("abort") < names.index("restored"), "the abort is marked when it happens"
    assert (run.run_dir / "monitor/head/agent.json").exists(), "the logs were pulled before stopping"
    log = (run.run_dir / "logs/guardian.log").read_text()
    assert "controller" in log and "shutdown complete" in log


def test_released_guardian_does_nothing(tmp_path):
    run = ClusterRun(local_cluster_config(tmp_path), "t", "AB", tmp_path / "results/t/AB", tmp_path)
    run.write_session()
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid = guardian.ensure(run.run_dir, watch=controller.pid)
        guardian.release(run.run_dir)
        assert wait_for(lambda: not guardian.alive(pid))
    finally:
        controller.kill()
        controller.wait()
    assert not any(e["event"] == "abort" for e in events.read(run.run_dir))
