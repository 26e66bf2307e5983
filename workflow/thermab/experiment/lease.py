"""A run's hold on its hosts: one lease per host, so that two runs never drive one host.

A run takes the lease of every host at preflight, before anything changes on any host,
takes it again as the same run in every job that brings hosts up (a Snakemake rerun, the
next look of ``until: decided``, a retried phase), and gives it back wherever it puts its
hosts back (``ClusterRun.shutdown``: the end of the run, a failed phase, an interrupt, the
guardian, ``restore``).  A lease that outlives its run is broken on purpose only
(``python -m thermab lease RUN_DIR --break``, ``lease_command``).

On the host the lease is a directory made with mkdir, which of two runs only one makes, at
LEASE for every run (under the host's root where it has one, as its other files): no
setting of a run moves it where another run would not look.  Its ``holder`` file says who
holds it (user, controller host, since when, run directory and id, the controller's pid);
an empty file named after the run id lets the run find its own lease again and give it back
in one command.  The run id is made once per run directory (its ``run-id`` file)."""

from __future__ import annotations

import base64
import dataclasses
import getpass
import json
import os
import posixpath
import re
import secrets
import shlex
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from thermab.config import read_bounded
from thermab.errors import HostError, StageFailed, UserError
from thermab.experiment import controller
from thermab.hosts.host import Host
from thermab.hosts.transport import TransportError
from thermab.layout import RunDir

LEASE = "/tmp/thermab-lease"  # world-writable on every host, so any user's run meets any other's
HOLDER_BYTES = 4096  # a holder record thermab writes is a few hundred bytes
RUN_ID = re.compile(r"[0-9a-f]{16}")
HOLDER_FIELDS = {"user": str, "controller": str, "since": str, "run_dir": str, "run_id": str, "pid": int}


class LeaseError(StageFailed):
    """A host is held by another run, or its lease is damaged; the message, one line, names
    each host, its holder and the command that breaks the lease."""


@dataclass(frozen=True)
class Holder:
    user: str
    controller: str  # the host name of the machine running the run's Snakemake
    since: str  # UTC, ISO 8601
    run_dir: str  # absolute, on the controller
    run_id: str
    pid: int  # the controller's

    def stale(self) -> bool:
        """Its controller is known to be gone: it ran on this machine and its pid is no more."""
        return self.controller == socket.gethostname() and not controller.alive(self.pid)

    def describe(self) -> str:
        gone = f", gone from {self.controller}: stale" if self.stale() else ""
        return (
            f"{self.user}@{self.controller} since {self.since}, run {self.run_dir} "
            f"(id {self.run_id}, controller pid {self.pid}{gone})"
        )


def parse_holder(data: bytes) -> Holder | str:
    """The holder a lease's file records, or why the file is none thermab wrote."""
    if not data.strip():
        return "its holder record is empty"
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return "its holder record is not JSON"
    if not isinstance(record, dict):
        return "its holder record is not a JSON object"
    for key, kind in HOLDER_FIELDS.items():
        value = record.get(key)
        # bool is an int to Python, not a pid; a control character would break the one line
        if type(value) is not kind or (kind is str and not (value and value.isprintable())):
            return f"its holder record has no valid '{key}'"
    if not RUN_ID.fullmatch(record["run_id"]) or record["pid"] <= 0:
        return "its holder record has no valid 'run_id' or 'pid'"
    return Holder(**{key: record[key] for key in HOLDER_FIELDS})


@dataclass(frozen=True)
class Lease:
    """A host's lease as found: free, held (``holder``), or damaged (``damage`` says how)."""

    host: str
    path: str
    holder: Holder | None = None
    damage: str | None = None

    @property
    def free(self) -> bool:
        return self.holder is None and self.damage is None

    def describe(self) -> str:
        if self.damage:
            return f"damaged: {self.path}: {self.damage}"
        return f"held by {self.holder.describe()}" if self.holder else "free"


def run_id(run_dir: Path, create: bool = True) -> str | None:
    """The run directory's id, made on first use (``create``); None where it has none."""
    path = RunDir(run_dir).run_id
    if create and not path.exists():
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        made = path.with_name(f".{path.name}.{os.getpid()}")
        made.write_text(secrets.token_hex(8) + "\n")
        try:
            os.link(made, path)  # of two jobs making it at once, the first one's stands
        except FileExistsError:
            pass
        finally:
            made.unlink()
    if not create and not path.exists():
        return None
    text = read_bounded(path, 64).decode(errors="replace").strip()
    if not RUN_ID.fullmatch(text):
        raise UserError(f"{path}: not a run id (16 hex digits); remove it and the run takes a new one")
    return text


def holder_for(run_dir: Path, controller_pid: int | None = None) -> Holder:
    """This run as a holder: its user, controller, now, run directory, id and controller."""
    return Holder(
        user=getpass.getuser(),
        controller=socket.gethostname(),
        since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        run_dir=str(Path(run_dir).resolve()),
        run_id=run_id(run_dir),
        pid=controller_pid or controller.controller_pid(),
    )


def lease_path(host: Host) -> str:
    return host.path(LEASE)


# What the directory at $d holds, as the first line of the answer; the holder's bytes follow
# in base64.  `[ -f ]` first: a FIFO or a directory where the holder should be is not read.
_DESCRIBE = (
    'if [ -L "$d" ] || { [ -e "$d" ] && ! [ -d "$d" ]; }; then echo notdir; '
    'elif ! [ -e "$d" ]; then echo free; '
    f'elif [ -f "$d/holder" ]; then echo holder; head -c {HOLDER_BYTES + 1} "$d/holder" | base64; '
    'elif [ -e "$d/holder" ] || [ -L "$d/holder" ]; then echo notfile; '
    "else echo noholder; fi"
)
_DAMAGE = {
    "notdir": "not a directory (a file or a link where the lease should be)",
    "notfile": "its holder record is not a regular file",
    "noholder": "no holder record in it (being taken at this very moment, or left so)",
}


def _found(host: Host, path: str, answer: list[str]) -> Lease:
    state = answer[0] if answer else ""
    if state == "free":
        return Lease(host.name, path)
    if state in _DAMAGE:
        return Lease(host.name, path, damage=_DAMAGE[state])
    if state != "holder":
        raise TransportError(host.name, f"unexpected answer about the lease at {path}: {state[:80]!r}")
    data = base64.b64decode("".join(answer[1:]))
    if len(data) > HOLDER_BYTES:
        return Lease(host.name, path, damage=f"its holder record is over {HOLDER_BYTES} bytes")
    holder = parse_holder(data)
    return Lease(host.name, path, damage=holder) if isinstance(holder, str) else Lease(host.name, path, holder)


def _on_host(host: Host, script: str, input: str | None = None):
    """Run ``script`` on the host itself (never in its container: the lease is the host's)
    with ``$d`` the lease's directory; the lease's path and the result."""
    path = lease_path(host)
    return path, host.run(f"d={shlex.quote(path)}; {script}", check=False, input=input)


# the holder record, base64 on stdin, written into $d whole: a reader finds the old or the new
_WRITE_HOLDER = 'base64 -d > "$d/.holder.$$" && mv -f -- "$d/.holder.$$" "$d/holder"'


def _record(holder: Holder) -> str:
    return base64.b64encode(json.dumps(dataclasses.asdict(holder)).encode()).decode()


def take(host: Host, mine: Holder) -> tuple[str, Lease]:
    """Take the host's lease for ``mine``'s run: ('taken', the lease), ('again', …) where the
    run holds it already (its holder brought up to date), or ('held', what holds it).
    Nothing is read before the take: mkdir makes the lease or finds it made."""
    marker = shlex.quote(f"run-{mine.run_id}")
    parent = shlex.quote(posixpath.dirname(lease_path(host)))
    path, result = _on_host(
        host,
        f"mkdir -p -- {parent}; "
        f'if made=$(mkdir -- "$d" 2>&1); then : > "$d"/{marker} && {_WRITE_HOLDER} && echo taken; '
        f'elif [ -d "$d" ] && ! [ -L "$d" ] && [ -f "$d"/{marker} ]; then echo again; {_DESCRIBE}; '
        f'elif [ -e "$d" ] || [ -L "$d" ]; then echo held; {_DESCRIBE}; '
        'else echo "$made" >&2; exit 1; fi',
        input=_record(mine),
    )
    answer = result.stdout.splitlines()
    if not result.ok or not answer:
        raise TransportError(host.name, f"cannot take the lease at {path}: {result.stderr.strip()[-200:]}")
    if answer[0] == "taken":
        return "taken", Lease(host.name, path, mine)
    found = _found(host, path, answer[1:])
    if answer[0] == "held":
        return "held", found
    if found.holder is None or (found.holder.controller, found.holder.pid) != (mine.controller, mine.pid):
        # a later invocation of the run: its record names the controller now running it
        kept = dataclasses.replace(mine, since=found.holder.since) if found.holder else mine
        _on_host(host, f'[ -f "$d"/{marker} ] && {_WRITE_HOLDER}', input=_record(kept))
        found = Lease(host.name, path, kept)
    return "again", found


def read(host: Host) -> Lease:
    """The host's lease as it is, changing nothing."""
    path, result = _on_host(host, _DESCRIBE)
    return _found(host, path, result.stdout.splitlines())


def release(host: Host, run: str) -> None:
    """Give back the host's lease if run ``run`` holds it; another run's is left alone."""
    _, result = _on_host(host, f'if [ -f "$d"/{shlex.quote("run-" + run)} ]; then rm -rf -- "$d"; fi')
    if not result.ok:
        raise TransportError(host.name, f"cannot give back the lease at {lease_path(host)}: {result.stderr.strip()}")


def break_lease(host: Host) -> Lease:
    """Break the host's lease, whoever holds it; returns what it was."""
    path, result = _on_host(host, f'{_DESCRIBE}; rm -rf -- "$d"')
    found = _found(host, path, result.stdout.splitlines())
    if not result.ok:
        raise TransportError(host.name, f"cannot break the lease at {path}: {result.stderr.strip()[-200:]}")
    return found


def break_command(run_dir: Path) -> str:
    return f"python -m thermab lease {shlex.quote(str(run_dir))} --break"


def refusal(refused: list[Lease], run_dir: Path) -> str:
    """One line: each host refused, with its holder (hosts one run holds named together) or
    its damage, and the command that breaks the leases."""
    by_holder: dict[str, list[str]] = {}
    for lease in refused:
        by_holder.setdefault(lease.describe(), []).append(lease.host)
    parts = [f"{'hosts' if len(hosts) > 1 else 'host'} {', '.join(hosts)}: {what}" for what, hosts in by_holder.items()]
    return (
        f"refused: {'; '.join(parts)}; nothing was changed; `{break_command(run_dir)}` breaks "
        "the lease once no run is using the host"
    )


def take_all(hosts: list[Host], run_dir: Path, controller_pid: int | None = None) -> tuple[list[Host], dict[str, str]]:
    """Every host's lease for this run, side by side (unreachable hosts wait out their
    timeouts together).  Returns the hosts whose lease this call took (not those the run held
    already) and, by name, the hosts not reached with why.  Where another run holds a host
    or its lease is damaged, gives back what it took and raises LeaseError, nothing changed."""
    mine = holder_for(run_dir, controller_pid)

    def attempt(host: Host) -> tuple[str, Lease] | TransportError:
        try:
            return take(host, mine)
        except TransportError as error:
            return error

    with ThreadPoolExecutor(len(hosts)) as pool:
        outcomes = dict(zip(hosts, pool.map(attempt, hosts), strict=True))
    unreached = {host.name: str(got) for host, got in outcomes.items() if isinstance(got, TransportError)}
    found = {host: got for host, got in outcomes.items() if not isinstance(got, TransportError)}
    taken = [host for host, (outcome, _) in found.items() if outcome == "taken"]
    refused = [lease for outcome, lease in found.values() if outcome == "held"]
    if refused:
        give_back(taken, mine.run_id)
        raise LeaseError(refusal(refused, run_dir))
    return taken, unreached


def hold(hosts: list[Host], run_dir: Path) -> None:
    """Every host's lease held by this run (taken, or held already) before a job changes
    anything; a host not reached or held by another run stops the job, nothing changed."""
    taken, unreached = take_all(hosts, run_dir)
    if unreached:
        give_back(taken, run_id(run_dir))
        raise HostError("; ".join(unreached.values()))


def give_back(hosts: Iterable[Host], run: str | None) -> list[str]:
    """Release each host's lease that run ``run`` holds (none where the run has no id);
    returns the problems met, every host tried."""
    problems = []
    for host in hosts if run else ():
        try:
            release(host, run)
        except TransportError as error:
            problems.append(str(error))
    return problems
