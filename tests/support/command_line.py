"""``python -m thermab`` as a user runs it, for the tests of the command line."""

import os
import subprocess
import sys

from support.paths import REPO


def run_thermab(*args, cwd=None) -> subprocess.CompletedProcess:
    """``python -m thermab ARGS`` in ``cwd`` (the checkout by default), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "thermab", *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd or REPO
    )


def one_line_error(result: subprocess.CompletedProcess, *named: str) -> str:
    """The one line of a user error (exit status 2, no traceback), which names each of ``named``."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for name in named:
        assert str(name) in lines[0], lines[0]
    return lines[0]


def snakemake_command(workdir, *args, configfiles=(), cores: int | None = 1, snakefile=REPO / "Snakefile") -> list[str]:
    """``python -m snakemake`` as a user runs the checkout's workflow (or ``snakefile``'s) in
    ``workdir`` on ``cores`` (None: a ``--profile`` in ``args`` sets them): ``configfiles``
    (merged in their order) and then ``args`` (targets, --config ...)."""
    configs = ["--configfile", *map(str, configfiles)] if configfiles else []
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(snakefile),
        "--directory",
        str(workdir),
        *configs,
        *(["--cores", str(cores)] if cores is not None else []),
        *map(str, args),
    ]


def run_snakemake(workdir, *args) -> subprocess.CompletedProcess:
    """``snakemake_command`` on one core, run to its end with its output captured; the
    checkout's package first on the path, as its jobs import it."""
    return subprocess.run(
        snakemake_command(workdir, *args),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
    )
