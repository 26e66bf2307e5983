"""Whole runs of the workflow on the simulated cluster, shared by the e2e tier and the SLURM
tier: the short config they run, a cluster on ports of its own, the run's events, and the
check that a run left nothing running or patched."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import yaml

from support.paths import DATA, REPO
from support.ports import free_ports
from support.processes import processes_in

# the default config with the tests' short timings over it (a --configfile replaces the default)
CONFIGS = [str(REPO / "config/config.yaml"), str(DATA / "e2e-config.yaml")]
SHM = "usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py"


def own_ports(head_port: int, worker_port: int) -> dict:
    """The e2e cluster's overrides that put it on ports of its own (``ports.free_ports(2)``),
    so it never meets another run's servers."""
    start = "{python} -m thermab.sim.vllm serve --node {root} --role %s --port %d --model sim-deepseek --detach"
    return {
        "sim": {
            "endpoint": f"http://127.0.0.1:{head_port}",
            "hosts": {
                "worker": {"server": {"start": start % ("worker", worker_port)}},
                "head": {"server": {"start": start % ("head", head_port) + f" --peer-port {worker_port}"}},
            },
        }
    }


def ports_file(workdir: Path) -> str:
    """A config file, merged after CONFIGS, that puts the working directory's cluster on free
    ports of its own: made once, so every invocation in the directory (a rerun, a resume)
    finds its servers where the first left them."""
    path = workdir / "ports.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump({"clusters": own_ports(*free_ports(2))}))
    return str(path)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_event(run_dir: Path, name: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in events(run_dir):
            if event["event"] == name:
                return event
        time.sleep(0.3)
    pytest.fail(f"no {name} event within {timeout} s")


def assert_clean(workdir: Path, run_dir: Path) -> None:
    deadline = time.monotonic() + 30
    while processes_in(workdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_in(workdir) == []
    for host in ("head", "worker"):
        current = (workdir / ".thermab/sim/sim" / host / SHM).read_bytes()
        if (run_dir / "preflight.json").exists():
            original = json.loads((run_dir / "preflight.json").read_text())["hosts"][host]["sha256"]
            assert hashlib.sha256(current).hexdigest() == original, f"{host}'s file is not its original"
        else:  # a failed preflight is deleted by Snakemake; it changed nothing
            assert b"        busy_loop_s: float = 1,\n" in current
    assert not list((workdir / "results/sim/patch-state").rglob("state.json"))
