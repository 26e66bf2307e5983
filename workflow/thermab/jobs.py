"""The glue between a Snakemake ``script:`` job and the package: logging and the run.

Job output goes both to the rule's ``log:`` file and to the terminal, so progress of a
long phase is visible while it runs and kept afterwards."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Iterator, TextIO

from thermab.run import Run


class _Tee:
    def __init__(self, *streams: TextIO):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def logged(log_path: str) -> Iterator[None]:
    """Send stdout and stderr to the log and the terminal; a failure's traceback too."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    # Snakemake stops jobs with SIGTERM: turn it into an exception so every `finally`
    # runs (Locust is stopped, files are closed) instead of the process vanishing
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with open(log_path, "a") as log:
        tee = _Tee(log, sys.__stderr__)
        with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
            try:
                yield
            except BaseException:
                traceback.print_exc()
                raise


def say(message: str, where: str = "") -> None:
    print(f"{time.strftime('%H:%M:%S')} {where}{message}", flush=True)


def run_for(snakemake) -> Run:
    """The Run of this job's ``{cluster}`` and ``{order}`` wildcards; its progress lines
    name the run, since several clusters may print at once."""
    wildcards = snakemake.wildcards
    run_dir = Path("results") / wildcards.cluster / wildcards.order
    where = f"[{wildcards.cluster}/{wildcards.order}] "
    return Run(snakemake.config, wildcards.cluster, wildcards.order, run_dir, Path.cwd(),
               lambda message: say(message, where))
