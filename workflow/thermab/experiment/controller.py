"""The controller as this machine's processes show it: the Snakemake process driving a run,
and whether a process is still alive (the guardian watches one; a lease records one)."""

from __future__ import annotations

import os
from pathlib import Path


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def controller_pid() -> int:
    """The outermost Snakemake ancestor of this process, else our parent."""
    found, pid = 0, os.getppid()
    while pid > 1:
        if "snakemake" in cmdline(pid):
            found = pid
        pid = _parent(pid)
    return found or os.getppid()


def alive(pid: int) -> bool:
    """Running and not a zombie (an exited child not yet reaped is dead for our purpose)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"
