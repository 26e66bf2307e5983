"""A real one-node SLURM for the tests: munged, slurmctld and slurmd from Debian's packages
with a private config, key, state and ports, started directly (there is no systemd) and
stopped by PID.  The node is this machine (its CPUs, 127.0.0.1); clients find the cluster
through ``SLURM_CONF``.  Skips, saying why, where SLURM cannot start."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.ports import free_port
from support.processes import stop_process

DAEMONS = ("munged", "slurmctld", "slurmd")
PARTITION = "thermab-test"  # not `debug` or another stock name: the profile must find the default itself
# The executor plugin drops SLURM_* from what its nested srun and sbatch inherit
# (SLURM_CONF included), so they read SLURM's default config: that path links to ours
# while the tier runs, and only where the machine has no config of its own.
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")


def _binary(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}",) if os.path.exists(p)), None)


@dataclass
class Slurm:
    directory: Path
    conf: Path
    node: str
    cpus: int
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment a SLURM client of this cluster (sbatch, squeue, Snakemake) needs."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def jobs(self) -> list[tuple[str, str, str]]:
        """(job id, name, state) of every job the controller still knows."""
        out = self.run("squeue", "--states=all", "--noheader", "--format=%i|%j|%T").stdout
        return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]

    def stop(self) -> None:
        for process in reversed(self.processes):  # slurmd, slurmctld, then munged
            stop_process(process, grace_s=15)
        if DEFAULT_CONF.is_symlink() and DEFAULT_CONF.resolve() == self.conf.resolve():
            DEFAULT_CONF.unlink()


def _wait(what: str, process: subprocess.Popen, log: Path, ready, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"{what} exited at start: {log.read_text()[-600:] if log.exists() else ''}")
        if ready():
            return
        time.sleep(0.2)
    process.kill()
    pytest.skip(f"{what} was not ready within {timeout:.0f} s: {log.read_text()[-600:] if log.exists() else ''}")


def start_slurm(directory: Path, cpus: int = 2) -> Slurm:
    binaries = {name: _binary(name) for name in (*DAEMONS, "sbatch", "squeue", "sinfo")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: install slurmctld slurmd slurm-client munge to run the SLURM tier")
    if os.geteuid() != 0:
        pytest.skip("the SLURM tier runs its daemons as root (slurmd starts jobs as their user)")
    if DEFAULT_CONF.is_symlink() and not DEFAULT_CONF.exists():
        DEFAULT_CONF.unlink()  # left by a tier that was killed: its directory has gone
    if DEFAULT_CONF.exists() or DEFAULT_CONF.is_symlink():
        pytest.skip(f"{DEFAULT_CONF} exists: the tier does not run beside this machine's own SLURM config")
    directory.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge"):
        (directory / sub).mkdir(exist_ok=True)
    (directory / "munge").chmod(0o700)
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = directory / "munge" / "munge.socket"
    slurm = Slurm(directory, directory / "slurm.conf", socket.gethostname().split(".")[0], cpus)
    log = directory / "munged.log"
    munged = subprocess.Popen(
        [
            binaries["munged"],
            "--foreground",
            "--force",
            f"--socket={munge_socket}",
            f"--key-file={key}",
            f"--pid-file={directory / 'munge' / 'munged.pid'}",
            f"--seed-file={directory / 'munge' / 'seed'}",
            f"--log-file={log}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    slurm.processes.append(munged)
    try:
        _wait("munged", munged, log, munge_socket.exists, timeout=15)
        # KillWait: a cancelled or timed-out job gets SIGTERM, then SIGKILL this much later
        # (Debian's and SLURM's default); MinJobAge keeps an ended job in squeue for the
        # profile's status checks and the tier's count of them: an hour, as the default 300 s
        # forgot the first analysis jobs of a fleet run before its end on a busy machine
        slurm.conf.write_text(f"""ClusterName=thermab
SlurmctldHost={slurm.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={directory / "state"}
SlurmdSpoolDir={directory / "spool"}
SlurmctldPidFile={directory / "slurmctld.pid"}
SlurmdPidFile={directory / "slurmd.pid"}
SlurmctldLogFile={directory / "slurmctld.log"}
SlurmdLogFile={directory / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
KillWait=30
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName={slurm.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 State=UNKNOWN
PartitionName={PARTITION} Nodes={slurm.node} Default=YES MaxTime=INFINITE State=UP
""")
        DEFAULT_CONF.parent.mkdir(parents=True, exist_ok=True)
        DEFAULT_CONF.symlink_to(slurm.conf)
        for daemon in ("slurmctld", "slurmd"):
            log = directory / f"{daemon}.log"
            process = subprocess.Popen(
                [binaries[daemon], "-D", "-f", str(slurm.conf)],
                env=slurm.env,
                stdout=open(directory / f"{daemon}.out", "w"),
                stderr=subprocess.STDOUT,
            )
            slurm.processes.append(process)
            if daemon == "slurmctld":
                _wait(daemon, process, log, lambda: slurm.run("sinfo", check=False).returncode == 0)
            else:
                _wait(
                    daemon,
                    process,
                    log,
                    lambda: "idle" in slurm.run("sinfo", "--noheader", "--format=%T", check=False).stdout,
                )
    except BaseException:
        slurm.stop()
        raise
    return slurm
