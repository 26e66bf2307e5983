"""Stopping what a test started, by PID: SIGTERM, a grace period, then SIGKILL."""

import subprocess


def stop_process(process: subprocess.Popen, grace_s: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
