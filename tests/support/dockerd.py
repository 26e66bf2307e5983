"""A real Docker engine for the tests: a private dockerd (own socket and data root),
started and stopped by PID, with an image built from a local busybox rootfs (no registry
is reachable).  Skips, saying why, where the engine cannot start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.processes import stop_process

IMAGE = "thermab-test:local"


@dataclass
class Dockerd:
    host: str  # DOCKER_HOST value
    process: subprocess.Popen

    def docker(self, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", *args],
            env={**os.environ, "DOCKER_HOST": self.host},
            capture_output=True,
            check=check,
            input=input,
            timeout=120,
        )

    def stop(self) -> None:
        stop_process(self.process, grace_s=30)


def _rootfs_tar(directory: Path) -> bytes:
    busybox = shutil.which("busybox")
    if not busybox:
        pytest.skip("no busybox: install busybox-static to build the test image")
    root = directory / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in ("sh", "cat", "base64", "printf", "sleep", "mkdir", "ls", "rm", "sed", "test"):
        (root / "bin" / applet).symlink_to("busybox")
    archive = directory / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    return archive.read_bytes()


def start_dockerd(directory: Path) -> Dockerd:
    if not shutil.which("dockerd") or not shutil.which("docker"):
        pytest.skip("no dockerd/docker: install docker.io to run the real-Docker tier")
    directory.mkdir(parents=True, exist_ok=True)
    socket_path = directory / "docker.sock"
    log = open(directory / "dockerd.log", "w")
    process = subprocess.Popen(
        [
            "dockerd",
            "--data-root",
            str(directory / "data"),
            "--exec-root",
            str(directory / "exec"),
            "-H",
            f"unix://{socket_path}",
            "--pidfile",
            str(directory / "docker.pid"),
            "--bridge",
            "none",
            "--iptables=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    engine = Dockerd(f"unix://{socket_path}", process)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"dockerd exited at start: {(directory / 'dockerd.log').read_text()[-600:]}")
        if socket_path.exists() and engine.docker("info", check=False).returncode == 0:
            break
        time.sleep(0.5)
    else:
        engine.stop()
        pytest.skip("dockerd did not answer within 60 s")
    imported = engine.docker("import", "-", IMAGE, check=False, input=_rootfs_tar(directory))
    if imported.returncode != 0:
        engine.stop()
        pytest.skip(f"docker import failed: {imported.stderr.decode()[-300:]}")
    return engine
