"""A real OpenSSH server on 127.0.0.1 for the tests, started and stopped by PID.

Skips (with the reason) where sshd cannot start, e.g. when openssh-server is missing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.ports import free_port
from support.processes import stop_process

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    host_key_pub: Path
    client_key: Path
    known_hosts: Path
    process: subprocess.Popen
    directory: Path

    def stop(self) -> None:
        stop_process(self.process, grace_s=10)


def start_sshd(directory: Path, extra_config: str = "", host_ca: Path | None = None) -> Sshd:
    """``extra_config``: more sshd_config lines (e.g. ``SetEnv`` for the sessions);
    ``host_ca``: a CA private key that signs the host key, which sshd then presents as a
    host certificate for 127.0.0.1."""
    if not os.path.exists(SSHD):
        pytest.skip(f"no sshd at {SSHD}: install openssh-server to run the real-SSH tier")
    directory.mkdir(parents=True, exist_ok=True)
    host_key, client_key = directory / "host_ed25519", directory / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    if host_ca is not None:
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-s",
                str(host_ca),
                "-I",
                "thermab-test",
                "-h",
                "-n",
                "127.0.0.1",
                "-V",
                "-5m:+1h",
                str(host_key.with_suffix(".pub")),
            ],
            check=True,
        )
        extra_config += f"\nHostCertificate {host_key}-cert.pub\n"
    authorized = directory / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {directory}/sshd.pid
AuthorizedKeysFile {authorized}
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
LogLevel ERROR
{extra_config}
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    log = open(directory / "sshd.log", "w")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"sshd exited at start: {(directory / 'sshd.log').read_text()[-500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        process.kill()
        pytest.skip("sshd did not listen within 10 s")
    known_hosts = directory / "known_hosts"
    key_type, key_data = (directory / "host_ed25519.pub").read_text().split()[:2]
    known_hosts.write_text(f"[127.0.0.1]:{port} {key_type} {key_data}\n")
    return Sshd(port, host_key.with_suffix(".pub"), client_key, known_hosts, process, directory)
