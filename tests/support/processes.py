"""Stopping what a test started, by PID: SIGTERM, a grace period, then SIGKILL; and waiting
for what a test expects to happen."""

import subprocess
import time


def wait_until(condition, timeout: float = 30.0, poll_s: float = 0.1) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return False


def stop_process(process: subprocess.Popen, grace_s: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def live_processes():
    """(pid, cmdline, cwd) of every live process but this one (zombies are dead)."""
    import os
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            yield int(entry.name), cmdline, cwd


def processes_in(workdir) -> list[str]:
    """Every live process whose command line or working directory lies in ``workdir``."""
    return [
        f"{pid}: {cmdline}"
        for pid, cmdline, cwd in live_processes()
        if str(workdir) in cmdline or cwd.startswith(str(workdir))
    ]


# The suite's other lanes run ssh and Docker tests against this machine, which lease it for a
# few seconds each: a real-vLLM test waits for them rather than skipping.
TEST_LEASE_WAIT_S = 600


def machine_lease_problem() -> str | None:
    """Why a run against this machine itself (a host without a root) cannot take its lease
    now, or None. A lease left by an earlier test session that was killed (its controller
    gone, its run under pytest's temporary directories) is that session's own leftover, and
    is broken here, saying so; one a live test run holds is waited for (up to
    TEST_LEASE_WAIT_S); any other holder is a run of somebody's, and is left alone."""
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from thermab.experiment.lease import HOLDER_BYTES, LEASE, parse_holder

    lease = Path(LEASE)
    deadline = time.monotonic() + TEST_LEASE_WAIT_S
    while True:
        if not lease.exists() and not lease.is_symlink():
            return None
        holder_file = lease / "holder"
        try:
            found = (
                parse_holder(holder_file.read_bytes()[:HOLDER_BYTES]) if holder_file.is_file() else "no holder record"
            )
        except FileNotFoundError:  # given back while we read it
            continue
        if isinstance(found, str):
            return f"{LEASE} is damaged ({found}): python -m thermab lease RUN_DIR --break frees it"
        a_test_s = Path(found.run_dir).is_relative_to(tempfile.gettempdir()) and "pytest-" in found.run_dir
        if found.stale() and a_test_s:
            shutil.rmtree(lease)
            print(f"broke the lease a killed test session left on this machine: {found.describe()}")
            return None
        if not a_test_s or time.monotonic() > deadline:
            return f"this machine is leased to another run: {found.describe()}"
        time.sleep(2)


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_as_a_terminal_job(command: list[str], **popen) -> subprocess.Popen:
    """``command`` in a process group of its own with SIGINT at its default, as a job a user
    starts from a terminal: ``os.killpg(pid, SIGINT)`` is then their Ctrl-C, even where the
    suite itself runs with SIGINT ignored (a shell starts its background jobs so, and every
    child inherits an ignored signal)."""
    return subprocess.Popen(command, start_new_session=True, preexec_fn=_default_sigint, **popen)
