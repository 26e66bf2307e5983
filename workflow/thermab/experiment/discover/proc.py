"""Pure parsing of what one read of a host's ``/proc`` gives: the processes whose command
line mentions vllm, which of them is a ``vllm serve``, and the systemd service a cgroup names."""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    argv: tuple[str, ...]
    cgroup: str
    cwd: str | None  # None where /proc/PID/cwd is not ours to read
    ns_pids: tuple[int, ...] = ()  # its pid in each pid namespace, this /proc's first (NSpid)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    @property
    def namespaced(self) -> bool:
        """In a pid namespace below this /proc's: a container's."""
        return len(self.ns_pids) > 1

    @property
    def inner_pid(self) -> int:
        """Its pid as its own (the container's) /proc numbers it."""
        return self.ns_pids[-1] if self.ns_pids else self.pid


# Every process whose cmdline mentions vllm: pid, cmdline (NUL-separated, as the kernel
# keeps it), status (PPid, NSpid), cgroup, working directory; fields end in \037, records
# in \036. Shell builtins and coreutils only: a host need not have Python for this.
PROCESS_SCAN = r"""for f in $(grep -l -i vllm /proc/[0-9]*/cmdline 2>/dev/null); do
d=${f%/cmdline}; printf '%s\037' "${d#/proc/}"; cat "$d/cmdline" 2>/dev/null; printf '\037'
cat "$d/status" 2>/dev/null; printf '\037'; cat "$d/cgroup" 2>/dev/null; printf '\037'
(cd "$d/cwd" 2>/dev/null && pwd -P); printf '\036'; done"""


def parse_processes(text: str) -> list[Process]:
    processes = []
    for record in text.split("\x1e"):
        fields = record.split("\x1f")
        if len(fields) != 5 or not fields[0].strip().isdigit():
            continue
        pid, cmdline, status, cgroup, cwd = fields
        argv = tuple(cmdline.rstrip("\0").split("\0")) if cmdline.strip("\0") else ()
        ppid = re.search(r"^PPid:\s*(\d+)", status, re.MULTILINE)
        nspid = re.search(r"^NSpid:\s*([\d\s]+?)\s*$", status, re.MULTILINE)
        if not argv or not ppid:
            continue  # a kernel thread, or a process that ended while it was read
        processes.append(
            Process(
                int(pid),
                int(ppid.group(1)),
                argv,
                cgroup,
                cwd.strip() or None,
                tuple(int(n) for n in nspid.group(1).split()) if nspid else (),
            )
        )
    return processes


def is_server(argv: tuple[str, ...]) -> bool:
    """A `vllm serve`-shaped command: the ``vllm`` command (or a module named ``…vllm``) then
    ``serve``, or a module under ``vllm.entrypoints``; only its first words count, so a
    shell wrapping the command (``sh -c "vllm serve …"``) is not taken for the server."""
    for i, arg in enumerate(argv[:4]):
        following = argv[i + 1 : i + 3]
        if arg == "-m" and following:
            module = following[0]
            if module.startswith("vllm.entrypoints.") or (
                module.rsplit(".", 1)[-1] == "vllm" and following[1:] == ("serve",)
            ):
                return True
        if posixpath.basename(arg) == "vllm" and following[:1] == ("serve",):
            return True
    return False


def option(argv: tuple[str, ...], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def ancestors(process: Process, by_pid: dict[int, Process]) -> list[Process]:
    found, seen = [], {process.pid}
    while process.ppid in by_pid and process.ppid not in seen:
        process = by_pid[process.ppid]
        seen.add(process.pid)
        found.append(process)
    return found


def systemd_service(cgroup: str) -> str | None:
    """The systemd service a process's cgroup names: ``NAME.service``, or ``--user
    NAME.service`` under a user's manager; None outside any service."""
    match = re.search(r"/([^/\s]+\.service)$", cgroup, re.MULTILINE)
    if not match:
        return None
    return f"--user {match.group(1)}" if "/user@" in cgroup else match.group(1)
