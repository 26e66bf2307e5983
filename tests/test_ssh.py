"""The SSH transport against a real OpenSSH sshd on 127.0.0.1 (paramiko, pinned host key)."""

import getpass

import pytest

from thermab.config import HostSpec
from thermab.hosts.host import Host
from thermab.experiment.patch import Patcher
from thermab.hosts.ssh import RefusedError, SshTransport
from thermab.hosts.transport import CommandError
from sshd import start_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def transport(sshd, **overrides):
    options = dict(port=sshd.port, user=getpass.getuser(), key_file=str(sshd.client_key),
                   known_hosts=str(sshd.known_hosts), connect_timeout=5, retries=1)
    options.update(overrides)
    return SshTransport("node1", "127.0.0.1", **options)


def test_run_put_get_over_a_pinned_key(sshd, tmp_path):
    ssh = transport(sshd)
    try:
        assert ssh.run("echo hello; echo err >&2").stdout == "hello\n"
        source = tmp_path / "a.txt"
        source.write_text("payload")
        ssh.put(source, str(tmp_path / "remote.txt"))
        ssh.get(str(tmp_path / "remote.txt"), tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "payload"
        with pytest.raises(CommandError) as error:
            ssh.run("echo boom >&2; exit 3")
        assert "node1" in str(error.value) and "exit 3" in str(error.value) and "boom" in str(error.value)
    finally:
        ssh.close()


def test_unknown_host_key_is_refused(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(RefusedError, match="node1.*not pinned"):
        transport(sshd, known_hosts=str(empty)).run("true")


def test_changed_host_key_is_refused_even_with_accept_new(sshd, tmp_path):
    other = tmp_path / "known_hosts"
    other.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    with pytest.raises(RefusedError, match="CHANGED"):
        transport(sshd, known_hosts=str(other), host_key_policy="accept-new").run("true")


def test_accept_new_pins_and_reports_the_key(sshd, tmp_path):
    fresh = tmp_path / "known_hosts"
    said = []
    ssh = transport(sshd, known_hosts=str(fresh), host_key_policy="accept-new", progress=said.append)
    assert ssh.run("echo ok").stdout == "ok\n"
    ssh.close()
    assert "127.0.0.1" in fresh.read_text() and any("accepted and saved" in s for s in said)
    assert transport(sshd, known_hosts=str(fresh)).run("echo again").stdout == "again\n"


def test_unreachable_host_names_the_host():
    ssh = SshTransport("ghost", "127.0.0.1", port=1, connect_timeout=2, retries=2, progress=lambda _m: None)
    with pytest.raises(Exception, match="ghost.*cannot reach"):
        ssh.run("true")


def test_patcher_over_ssh_with_a_hostile_path(sshd, tmp_path):
    directory = tmp_path / "it's a $(touch pwned) dir"
    directory.mkdir()
    target = directory / "shm_broadcast.py"
    target.write_text("x = 1\n        busy_loop_s: float = 1,\n")
    spec = HostSpec("node1", "c", "ssh", {"address": "127.0.0.1"})
    host = Host(spec, transport(sshd))
    setting = {"file": str(target), "anchor": r"busy_loop_s: float = [0-9.]+", "replacement": "busy_loop_s: float = {value}"}
    patcher = Patcher(host, setting, tmp_path / "state")
    patcher.apply("0.002")
    assert "busy_loop_s: float = 0.002," in target.read_text()
    patcher.restore()
    assert target.read_text() == "x = 1\n        busy_loop_s: float = 1,\n"
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.rglob("pwned"))


def test_cut_connection_reconnects_and_the_detached_agent_keeps_logging(sshd, tmp_path):
    import csv
    import os
    import signal
    import subprocess
    import time

    from thermab.telemetry import deploy

    spec = HostSpec("node1", "c", "ssh", {"address": "127.0.0.1", "agent_dir": str(tmp_path / "agent")})
    said = []
    host = Host(spec, transport(sshd, progress=said.append))
    pid = deploy.start_agent(host, "c-AB", {"process_pattern": "no-such-xyz",
                                            "intervals": {"system": 0.2, "cpu": 0.2, "thermal": 0.2}})
    try:
        time.sleep(1.0)
        connection_before = host.transport._client
        sessions = subprocess.run(["pgrep", "-P", str(sshd.process.pid)], capture_output=True, text=True)
        children = [int(p) for p in sessions.stdout.split()]
        assert children, "the controller's SSH session has its own sshd child"
        for child in children:
            os.kill(child, signal.SIGKILL)  # cut the session mid-phase
        time.sleep(1.0)
        assert deploy.agent_pid(host, "c-AB") == pid, "reconnected, and the agent survived the cut"
        assert host.transport._client is not connection_before, "a new connection replaced the cut one"
        time.sleep(0.5)
    finally:
        deploy.stop_agent(host, "c-AB")
    with open(tmp_path / "agent/c-AB/system.csv") as handle:
        times = [float(row["t"]) for row in csv.DictReader(handle) if row["sensor"] == "loadavg_1m"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 8 and max(gaps) < 1.0, "no samples lost across the cut"
