"""The shortened simulated fleet that test_fleet.py and the SLURM tier share (the
``local_fleet`` fixture of conftest.py runs it once a session): the sim-fleet example with
short phases (4-s baseline, 15-s loads) and ports of its own."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import yaml

from support.command_line import snakemake_command
from support.paths import REPO
from support.ports import free_ports

SHORT = {
    "timings": {"baseline_s": 4, "load_s": 15, "cooldown_below_c": 60, "cooldown_max_s": 4, "startup_timeout_s": 60}
}


def short_fleet(directory: Path) -> Path:
    """config/examples/sim-fleet.yaml with shorter phases and ports of its own."""
    config = yaml.safe_load((REPO / "config/examples/sim-fleet.yaml").read_text())
    config.update(SHORT)
    text = yaml.safe_dump(config)
    # each cluster's head and worker, as the example numbers them, on free ports instead
    for example, free in zip(("18511", "18512", "18611", "18612"), free_ports(4), strict=True):
        assert example in text, f"config/examples/sim-fleet.yaml has no port {example} any more"
        text = text.replace(example, str(free))
    path = directory / "short-fleet.yaml"
    path.write_text(text)
    return path


def snakemake(workdir: Path, configs: list[str], *args: str, env=None, timeout: float = 1800):
    command = snakemake_command(workdir, *args, configfiles=configs, cores=None)
    # the timeout only ends a hung run: on two cores shared with other work a fleet run took
    # 15 min (twice the usual)
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    (workdir / "snakemake.log").write_text(result.stdout + result.stderr)
    (workdir / "wall_s").write_text(f"{time.monotonic() - started:.0f}")  # the measured time, for docs/fleet.md
    return result


def run_local(directory: Path) -> tuple[Path, Path]:
    """The short fleet run here, both clusters at once: (its config, its working directory)."""
    config, workdir = short_fleet(directory), directory / "local"
    workdir.mkdir()
    result = snakemake(workdir, [str(config)], "--cores", "4", "--keep-going", "all")
    assert result.returncode == 0, result.stderr[-4000:]
    return config, workdir
