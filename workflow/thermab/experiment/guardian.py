"""The dead-man switch: a detached process that watches the Snakemake process driving a
run and, if it goes away before the run has shut down cleanly (failure, Ctrl-C, kill),
performs the shutdown itself: restore every patched file, stop servers and agents.

Snakemake's ``onerror`` is not called on every kind of exit (an interrupt, a killed
controller), so the guarantee "no host left patched" cannot live inside Snakemake.

SIGTERM is not a release: it is what a batch scheduler sends every process of a job it
cancels or times out (SIGKILL follows after its KillWait, 30 s by default), controller and
guardian alike.  The guardian then gives the controller a moment to exit and does the
shutdown at once, inside that grace.  The run releases its guardian with SIGUSR1."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from thermab.experiment.controller import alive, cmdline, controller_pid
from thermab.layout import RunDir

PID_FILE = "guardian.json"
RELEASE = signal.SIGUSR1
TERM_WAIT_S = 10.0  # after a SIGTERM, how long the controller may take to exit first


def _read(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def ensure(run_dir: Path, watch: int | None = None) -> int:
    """Make sure a guardian watches the controller (by default the Snakemake process
    running this job); returns the guardian's pid."""
    run_dir = Path(run_dir).resolve()
    watch = watch or controller_pid()
    current = _read(run_dir)
    if (
        current
        and current["watch"] == watch
        and alive(current["pid"])
        and "thermab.experiment.guardian" in cmdline(current["pid"])
    ):
        return current["pid"]
    if current and alive(current["pid"]) and "thermab.experiment.guardian" in cmdline(current["pid"]):
        os.kill(current["pid"], RELEASE)  # it watches another controller: this one takes over
    guardian_log = RunDir(run_dir).log("guardian.log")
    guardian_log.parent.mkdir(parents=True, exist_ok=True)
    # the guardian starts with SIGTERM and the release held (a signal mask survives fork and
    # exec) until it has its handlers: one sent while it starts is kept, not fatal
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, RELEASE})
    try:
        with open(guardian_log, "a") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "thermab.experiment.guardian", "--run-dir", str(run_dir), "--watch", str(watch)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    (run_dir / PID_FILE).write_text(json.dumps({"pid": process.pid, "watch": watch}))
    return process.pid


def release(run_dir: Path) -> None:
    """The run shut down cleanly: the guardian is no longer needed."""
    current = _read(Path(run_dir))
    if current and alive(current["pid"]) and "thermab.experiment.guardian" in cmdline(current["pid"]):
        os.kill(current["pid"], RELEASE)
    (Path(run_dir) / PID_FILE).unlink(missing_ok=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="restore and stop a run when its controller exits")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--watch", required=True, type=int)
    args = parser.parse_args(argv)
    released, terminated = False, False

    def on_release(signum, frame):
        nonlocal released
        released = True

    def on_terminate(signum, frame):
        nonlocal terminated
        terminated = True

    signal.signal(RELEASE, on_release)
    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is for Snakemake
    # loaded now, not when needed: the checkout may change under a long run (an upgrade, a
    # half-done merge), and putting the hosts back must not depend on it then
    from thermab.experiment.cluster import ClusterRun, exit_status

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, RELEASE})
    while not released and not terminated and alive(args.watch):
        time.sleep(0.5)
    deadline = time.monotonic() + TERM_WAIT_S
    while terminated and not released and alive(args.watch) and time.monotonic() < deadline:
        time.sleep(0.1)
    if released:
        return 0

    def progress(message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} guardian: {message}", flush=True)

    reason = (
        f"SIGTERM to the guardian of controller {args.watch} (a scheduler cancelling or timing out "
        "its job, or a system shutdown)"
        if terminated
        else f"controller {args.watch} exited"
    )
    progress(f"{reason} before the run shut down: restoring and stopping")
    run = ClusterRun.from_session(args.run_dir, progress)
    problems = run.shutdown(reason)
    patched = run.still_patched()
    progress(
        "shutdown complete"
        if not problems
        else f"shutdown finished with {len(problems)} problem(s): " + "; ".join(problems)
    )
    if patched:
        progress(
            f"STILL PATCHED: {', '.join(patched)} (originals kept under patch-state/; "
            "`python -m thermab restore` tries again)"
        )
    if not problems and not patched:
        # kept while a step failed, so `restore` knows this run is not yet put back and tries again
        (args.run_dir / PID_FILE).unlink(missing_ok=True)
    return exit_status(problems, patched)


if __name__ == "__main__":
    sys.exit(main())
