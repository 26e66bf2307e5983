"""The simulated node's own knobs: a detached start whose server refuses its settings
reports it (non-zero, the log's last line) instead of a pid of a process already gone; a
node of too few or too many cores is refused in one line, and two cores place every thread."""

import os
import signal
import subprocess

import pytest

from thermab.sim import cpu, node, vllm


def test_a_detached_start_that_dies_at_once_says_why_and_leaves_no_pid(tmp_path):
    root = tmp_path / "head"
    node.create_node(root, "head", cores=4)
    command = vllm.serve_command(root, 1, "--role", "head", "--peer-port", "2", "--model", "m")
    environ = {**os.environ, "THERMAB_SIM_DRAFT_ACCEPTANCE": "2"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environ)
    assert result.returncode == 1 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "THERMAB_SIM_DRAFT_ACCEPTANCE='2' is not a probability" in lines[0], lines
    assert "ended before it started (exit status 2" in lines[0]
    assert node.running_pid(root, "vllm") is None and not node.pid_file(root, "vllm").exists()


def test_a_detached_daemon_that_reports_its_start_is_left_running(tmp_path, monkeypatch):
    root = tmp_path / "n"
    node.create_node(root, "worker", cores=2)
    (tmp_path / "sleeper.py").write_text(
        "import time\nfrom thermab.sim import node\nnode.report_started()\ntime.sleep(120)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    pid = node.start_detached(root, "sleeper", "sleeper", [], confirm=True)
    try:
        assert node._alive(pid) and node.pid_file(root, "sleeper").read_text() == f"{pid}\n"
    finally:
        os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize("cores", ["0", "1", "-3", "20000"])
def test_a_simulated_node_of_too_few_or_too_many_cores_is_refused_in_one_line(tmp_path, capsys, cores):
    with pytest.raises(SystemExit) as caught:
        node.main(["create", str(tmp_path / "n"), "--role", "head", "--cores", cores])
    lines = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(lines) == 1 and "--cores" in lines[0]
    assert not (tmp_path / "n").exists(), "nothing made"


def test_a_two_core_simulated_node_places_its_threads(tmp_path):
    node.create_node(tmp_path / "n", "head", cores=2)
    account = cpu.Account(tmp_path / "n")
    assert {account.thread(f"t{i}").core for i in range(20)} <= {0, 1}
