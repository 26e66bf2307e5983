"""The glue between a Snakemake ``script:`` job and the package: logging and the run.

Job output goes both to the rule's ``log:`` file and to the terminal, so progress of a
long phase is visible while it runs and kept afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import thermab
from thermab import config as thermab_config, layout
from thermab.errors import ThermabError, exit_status
from thermab.experiment import guardian, plan
from thermab.experiment.cluster import ClusterRun


class _Tee:
    def __init__(self, *streams: TextIO):
        self.streams = streams
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:  # a line written from one thread reaches each stream whole
            for stream in self.streams:
                stream.write(text)
                stream.flush()
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


TERMINATED = 128 + signal.SIGTERM  # the exit status a job stopped by SIGTERM ends with


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def logged(log_path: str) -> Iterator[None]:
    """Send stdout and stderr to the log and the terminal; a failure's traceback too,
    once.  A failure of the package's own (``thermab.errors``: a preflight naming each
    host's problem, a phase that failed and why) says it all in its message and is printed
    without a traceback; anything else is a bug and keeps it."""
    check_checkout()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    # Snakemake stops jobs with SIGTERM: turn it into an exception so every `finally`
    # runs (Locust is stopped, files are closed) instead of the process vanishing
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with open(log_path, "a") as log:
        tee = _Tee(log, sys.__stderr__)
        with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
            try:
                yield
            except ThermabError as error:
                print(error)
                raise SystemExit(exit_status(error)) from None
            except SystemExit:
                raise
            except BaseException:
                traceback.print_exc()
                # printed above, to the log too: exit rather than have Python print it again
                raise SystemExit(1) from None


def progress(message: str, where: str = "") -> None:
    # one write of the whole line: hosts are connected from threads, and print() writes the
    # text and its newline apart, so two hosts' lines could run together
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {where}{message}\n")
    sys.stdout.flush()


CHECKOUT_ENV = "THERMAB_CHECKOUT"  # set by workflow/rules/common.smk to the checkout's package


def check_checkout() -> None:
    """Stop a job whose imported ``thermab`` is not the checkout's own (a stale or
    non-editable install would run other code than the Snakefile was written for)."""
    expected = os.environ.get(CHECKOUT_ENV)
    imported = Path(thermab.__file__).resolve().parent
    if expected and Path(expected).resolve() != imported:
        raise SystemExit(
            f"this job imports thermab from {imported}, not from the checkout "
            f"({expected}): run `pip install -e .` in the checkout, or use its environment"
        )


def invocation() -> dict:
    """How Snakemake was started (``plan.INVOCATION_ENV``, set by workflow/rules/common.smk):
    run.json's ``configfiles`` and ``cores``; {} for a job started otherwise."""
    text = os.environ.get(plan.INVOCATION_ENV)
    return json.loads(text) if text else {}


def run_for(snakemake, load_s: int | None = None) -> ClusterRun:
    """The cluster run of this job's ``{cluster}`` and ``{order}`` wildcards; its progress
    lines name the run, since several clusters may print at once.  ``load_s``: a phase
    job's load window (the rule's params), its config's ``timings.load_s`` for the job (one
    shorter than the config's makes the job speed-only: ``plan.speed_only``)."""
    wildcards = snakemake.wildcards
    run_dir = layout.run_dir(wildcards.cluster, wildcards.order).path
    where = f"[{wildcards.cluster}/{wildcards.order}] "
    config = thermab_config.view(snakemake.config)
    return ClusterRun(
        config if load_s is None else plan.with_load_s(config, load_s),
        wildcards.cluster,
        wildcards.order,
        run_dir,
        Path.cwd(),
        lambda message: progress(message, where),
        speed_only=load_s is not None and plan.speed_only(config, load_s),
    )


@contextlib.contextmanager
def put_back_if_terminated(run: ClusterRun) -> Iterator[ClusterRun]:
    """A job that has hosts up (monitor start, baseline, phase), stopped by SIGTERM, puts
    every host back itself before it exits: Snakemake stops its jobs so when it is stopped,
    and a scheduler cancelling or timing out the job sends it to every process of the job,
    with SIGKILL after a grace (KillWait); the guardian, which acts once the controller has
    gone, may not outlive that. Used inside ``logged``, which turns SIGTERM into SystemExit."""
    try:
        yield run
    except SystemExit as stop:
        if stop.code != TERMINATED:
            raise
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the shutdown short
        run.progress("terminated (SIGTERM): restoring and stopping every host now")
        problems = run.shutdown(
            "job terminated (SIGTERM: its controller stopping, or a scheduler cancelling or timing out its batch job)"
        )
        if not run.still_patched():
            guardian.release(run.run_dir)  # everything is put back; else the guardian tries again
        for problem in problems:
            run.progress(f"WARNING {problem}")
        raise
