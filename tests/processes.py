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
        f"{pid}: {cmdline[:160]}"
        for pid, cmdline, cwd in live_processes()
        if str(workdir) in cmdline or cwd.startswith(str(workdir))
    ]
