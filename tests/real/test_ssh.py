"""The SSH transport against a real OpenSSH sshd on 127.0.0.1 (paramiko, pinned host key):
known_hosts as users keep them, host certificates, a jump host, clock offsets, and a
preflight over SSH, passing and failing."""

import base64
import getpass
import json
import subprocess
import time
from pathlib import Path

import paramiko
import pytest
import yaml

from support.command_line import snakemake_command
from support.known_hosts import hashed
from support.paths import REPO
from support.ports import free_port
from support.processes import processes_in
from support.sshd import start_sshd
from thermab.config import HostSpec, validate, view
from thermab.experiment import check_config, lease, preflight
from thermab.experiment.cluster import ClusterRun
from thermab.experiment.patch import Patcher
from thermab.hosts import clock
from thermab.hosts.host import Host
from thermab.hosts.ssh import RefusedError, SshTransport
from thermab.hosts.transport import CommandError

OTHER_KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
# a security-key entry (paramiko has no such type): type, 32-byte key, application
SK_KEY = base64.b64encode(
    b"".join(len(part).to_bytes(4, "big") + part for part in (b"sk-ssh-ed25519@openssh.com", bytes(range(32)), b"ssh:"))
).decode()
LOOPBACK_OFFSET_S = 0.020


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    # the sessions import this checkout's thermab (simulated nodes run the controller's Python)
    server = start_sshd(tmp_path_factory.mktemp("sshd"), extra_config=f"SetEnv PYTHONPATH={REPO / 'workflow'}")
    yield server
    server.stop()


def users_known_hosts(*pinned) -> bytes:
    """A known_hosts as users keep one: comments, hashed names, markers, a key type
    paramiko lacks; with the given sshds pinned under hashed names."""
    lines = [
        "# kept by hand; ssh-keyscan output appended below",
        "",
        f"{hashed('gitlab.example.com')} ssh-ed25519 {OTHER_KEY}",
        f"bastion.example.com,10.1.2.3 sk-ssh-ed25519@openssh.com {SK_KEY} yubikey",
        f"@cert-authority *.lab.example.com ssh-ed25519 {OTHER_KEY}",
        f"@revoked * ssh-ed25519 {OTHER_KEY}",
    ]
    for server in pinned:
        key_type, data = server.host_key_pub.read_text().split()[:2]
        lines.append(f"{hashed(f'[127.0.0.1]:{server.port}')} {key_type} {data}")
    return ("\n".join(lines) + "\n").encode()


def transport(sshd, **overrides):
    options = dict(
        port=sshd.port,
        user=getpass.getuser(),
        key_file=str(sshd.client_key),
        known_hosts=str(sshd.known_hosts),
        connect_timeout=5,
        retries=1,
    )
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
    other.write_text(
        f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    with pytest.raises(RefusedError, match="CHANGED"):
        transport(sshd, known_hosts=str(other), host_key_policy="accept-new").run("true")


def test_accept_new_pins_and_reports_the_key(sshd, tmp_path):
    fresh = tmp_path / "known_hosts"
    said = []
    ssh = transport(sshd, known_hosts=str(fresh), host_key_policy="accept-new", progress=said.append)
    assert ssh.run("echo ok").stdout == "ok\n"
    ssh.close()
    assert "127.0.0.1" in fresh.read_text() and any("accepted and appended" in s for s in said)
    assert transport(sshd, known_hosts=str(fresh)).run("echo again").stdout == "again\n"


def test_unreachable_host_names_the_host():
    ssh = SshTransport("ghost", "127.0.0.1", port=1, connect_timeout=2, retries=2, progress=lambda _m: None)
    with pytest.raises(Exception, match="ghost.*cannot reach 127.0.0.1:1: connection refused"):
        ssh.run("true")


def test_patcher_over_ssh_with_a_hostile_path(sshd, tmp_path):
    directory = tmp_path / "it's a $(touch pwned) dir"
    directory.mkdir()
    target = directory / "shm_broadcast.py"
    target.write_text("x = 1\n        busy_loop_s: float = 1,\n")
    spec = HostSpec("node1", "c", "ssh", {"address": "127.0.0.1"})
    host = Host(spec, transport(sshd))
    setting = {
        "file": str(target),
        "anchor": r"busy_loop_s: float = [0-9.]+",
        "replacement": "busy_loop_s: float = {value}",
    }
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
    pid = deploy.start_agent(
        host, "c-AB", {"process_pattern": "no-such-xyz", "intervals": {"system": 0.2, "cpu": 0.2, "thermal": 0.2}}
    )
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
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) >= 8 and max(gaps) < 1.0, "no samples lost across the cut"


def test_the_users_known_hosts_is_only_ever_read_or_appended(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    users = tmp_path / "home/.ssh/known_hosts"
    users.parent.mkdir(parents=True)
    users.write_bytes(users_known_hosts(sshd))
    pinned = users.read_bytes()
    ssh = transport(sshd, known_hosts=None, own_known_hosts=tmp_path / "own")
    assert ssh.run("echo pinned").stdout == "pinned\n", "a hashed pin among every kind of line is found"
    ssh.close()
    assert users.read_bytes() == pinned and not (tmp_path / "own").exists()

    unpinned = users_known_hosts()
    users.write_bytes(unpinned)
    said = []
    ssh = transport(
        sshd, known_hosts=None, own_known_hosts=tmp_path / "own", host_key_policy="accept-new", progress=said.append
    )
    ssh.run("true")
    ssh.close()
    key_type, data = sshd.host_key_pub.read_text().split()[:2]
    line = f"[127.0.0.1]:{sshd.port} {key_type} {data}\n"
    assert users.read_bytes() == unpinned, "accept-new never writes the user's own file"
    assert (tmp_path / "own").read_text() == line, "it pins into thermab's file, one OpenSSH line"
    assert any("SHA256:" in s and "appended to" in s for s in said)
    assert transport(sshd, known_hosts=None, own_known_hosts=tmp_path / "own").run("echo again").stdout == "again\n"

    named = tmp_path / "named_known_hosts"
    named.write_bytes(unpinned)
    transport(sshd, known_hosts=str(named), own_known_hosts=tmp_path / "other", host_key_policy="accept-new").run(
        "true"
    )
    assert named.read_bytes() == unpinned + line.encode(), "a file the config names: appended to, nothing else"


def test_a_revoked_host_key_is_refused(sshd, tmp_path):
    key_type, data = sshd.host_key_pub.read_text().split()[:2]
    revoked = tmp_path / "known_hosts"
    revoked.write_bytes(users_known_hosts(sshd) + f"@revoked * {key_type} {data}\n".encode())
    for policy in ("strict", "accept-new"):
        with pytest.raises(RefusedError, match=r"node1: .*\(SHA256:[A-Za-z0-9+/]+\) is marked @revoked"):
            transport(sshd, known_hosts=str(revoked), host_key_policy=policy).run("true")


def test_a_host_certificate_from_a_trusted_authority_needs_no_pin(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "ca")], check=True)
    server = start_sshd(tmp_path / "sshd", host_ca=tmp_path / "ca")
    try:
        ca = (tmp_path / "ca.pub").read_text().split()[:2]
        known = tmp_path / "known_hosts"
        known.write_bytes(users_known_hosts() + f"@cert-authority [127.0.0.1]:* {ca[0]} {ca[1]}\n".encode())
        before = known.read_bytes()
        ssh = transport(server, known_hosts=str(known))
        assert ssh.run("echo certified").stdout == "certified\n"
        assert ssh.client().get_transport().host_key_type == "ssh-ed25519-cert-v01@openssh.com"
        ssh.close()
        assert known.read_bytes() == before
        known.write_bytes(before + f"@revoked * {ca[0]} {ca[1]}\n".encode())
        with pytest.raises(RefusedError, match="@revoked"):
            transport(server, known_hosts=str(known)).run("true")
    finally:
        server.stop()


def test_loopback_clock_offsets_are_within_20_ms(sshd):
    ssh = transport(sshd)
    try:
        offset = clock.measure(ssh)
    finally:
        ssh.close()
    assert offset.samples == clock.SAMPLES and 0 < offset.uncertainty_s
    assert abs(offset.offset_s) <= LOOPBACK_OFFSET_S


def test_through_a_jump_host(sshd, tmp_path):
    target = start_sshd(tmp_path / "target")
    with open(sshd.directory / "authorized_keys", "a") as authorized:  # one key for both hops
        authorized.write(target.client_key.with_suffix(".pub").read_text())
    try:
        known = tmp_path / "known_hosts"
        known.write_bytes(users_known_hosts(sshd, target))
        ssh = transport(target, known_hosts=str(known), jump=f"{getpass.getuser()}@127.0.0.1:{sshd.port}")
        assert ssh.run("echo through").stdout == "through\n"
        assert isinstance(ssh.client().get_transport().sock, paramiko.Channel), "carried by the jump host"
        assert abs(clock.measure(ssh).offset_s) <= LOOPBACK_OFFSET_S
        ssh.close()
        closed = transport(target, port=free_port(), known_hosts=str(known), jump=f"127.0.0.1:{sshd.port}")
        with pytest.raises(
            Exception,
            match=r"node1: jump host 127.0.0.1:\d+ cannot reach 127.0.0.1:\d+: "
            "Connect failed$",
        ):
            closed.run("true")
    finally:
        target.stop()


def simulated_over_ssh(tmp_path: Path, ssh_settings: dict) -> dict:
    """The default study with both simulated nodes reached through SSH (as a user on real nodes runs it)."""
    raw = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cluster = raw["clusters"]["sim"]
    for name, host in cluster["hosts"].items():
        host.update(transport="ssh", address="127.0.0.1", root=str(tmp_path / "sim" / name), **ssh_settings)
    cluster["endpoint"] = f"http://127.0.0.1:{free_port()}"
    raw["clusters"] = {"sim": cluster}
    return raw


def test_a_preflight_over_ssh_leaves_known_hosts_as_it_was_and_records_offsets(sshd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    known = tmp_path / "known_hosts"
    known.write_bytes(users_known_hosts(sshd))
    before = known.read_bytes()
    settings = {"port": sshd.port, "key_file": str(sshd.client_key), "known_hosts": str(known)}
    config = view(validate(simulated_over_ssh(tmp_path, settings)))
    run_dir = tmp_path / "results/sim/AB"
    run = ClusterRun(config, "sim", "AB", run_dir, tmp_path, progress=lambda _m: None)
    report = preflight.preflight(run, run_dir / "preflight.json", run_dir / "run.json")
    # the run ends here: the endpoint's lease lies outside tmp_path, as every run's does
    assert lease.give_back(run.lease_sites, lease.run_id(run_dir)) == []
    for host in run.hosts:
        host.close()
    assert known.read_bytes() == before
    assert set(report.clock_offset_s) == {"head", "worker"}
    for name, offset in report.clock_offset_s.items():
        assert abs(offset) <= LOOPBACK_OFFSET_S and report.clock_offset_uncertainty_s[name] > 0
    assert report.hosts["head"]["agent_python"].startswith("/") and report.safety.abort_at_c
    assert not (run_dir / "guardian.json").exists() and processes_in(tmp_path) == [], "nothing started"


def test_check_config_hosts_over_ssh_reports_each_host_and_writes_nothing_there(sshd, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    known = tmp_path / "known_hosts"
    known.write_bytes(users_known_hosts(sshd))
    agent_dir = tmp_path / "agent"
    settings = {"port": sshd.port, "key_file": str(sshd.client_key), "known_hosts": str(known)}
    config = view(validate(simulated_over_ssh(tmp_path, {**settings, "agent_dir": str(agent_dir)})))
    assert check_config.local_problems(config) == []
    assert check_config.check_hosts(config, tmp_path) == []
    out = capsys.readouterr().out
    for name in ("head", "worker"):
        assert f"preflight {name}: ok" in out and f"{name}: reached (Linux" in out and f"{name}: power: rapl:" in out
    assert not agent_dir.exists(), "the agent's discovery ran from its stdin"
    assert not (tmp_path / "results").exists() and processes_in(tmp_path) == [], "nothing written or started"


def test_a_preflight_over_ssh_to_a_closed_port_fails_fast_and_cleanly(tmp_path):
    closed = free_port()
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(simulated_over_ssh(tmp_path, {"port": closed}), sort_keys=False))
    command = snakemake_command(tmp_path, "results/sim/AB/preflight.json", configfiles=[override])
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    (tmp_path / "snakemake.log").write_text(output)
    # refused, not timed out: the message below names the refusal (no wall-clock bound here:
    # the machine is shared; bench/ owns timings)
    assert result.returncode != 0, f"succeeded after {took:.1f} s"
    assert "Traceback" not in output
    message = output[output.index("preflight failed") :]
    for host in ("worker", "head"):
        assert f"host {host}: cannot reach 127.0.0.1:{closed}: connection refused" in message
    assert output.count("preflight failed") == 1, "said once"
    retries = [line for line in output.splitlines() if "retrying in" in line]
    assert retries and all(line.count("[sim/AB] ") == 1 for line in retries), (
        "retries are shown as the run's progress, a line each though hosts connect side by side"
    )
    assert "zones of worker, head could not be read" in output
    run_dir = tmp_path / "results/sim/AB"
    failed = json.loads((run_dir / "logs/preflight-failed.json").read_text())
    assert len(failed["problems"]) == 2 and not failed["hosts"]["head"]["reachable"]
    assert not (run_dir / "guardian.json").exists() and not (run_dir / "logs/guardian.log").exists()
    assert not (run_dir / "events.jsonl").exists(), "no abort event: nothing happened"


def test_a_host_without_the_agents_python_is_named_with_the_setting_to_change(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = simulated_over_ssh(tmp_path, {})
    for host in raw["clusters"]["sim"]["hosts"].values():
        host.update(transport="local", agent_python="no-such-python")
        del host["address"]
    run_dir = tmp_path / "results/sim/AB"
    run = ClusterRun(view(validate(raw)), "sim", "AB", run_dir, tmp_path, progress=lambda _m: None)
    with pytest.raises(
        preflight.PreflightError,
        match=r"host worker: the agent's Python \(no-such-python\) "
        r"does not run: .*set agent_python",
    ):
        preflight.preflight(run, run_dir / "preflight.json", run_dir / "run.json")
    failed = json.loads((run_dir / "logs/preflight-failed.json").read_text())
    assert failed["hosts"]["head"]["sha256"], "the other checks still ran"
