"""A run's hold on its hosts and its server's endpoint: one lease per host and one on the
endpoint, so that two runs never drive one host, nor restart each other's server on one port.

A run takes every lease at preflight, before anything changes on any host, takes them again
as the same run in every job that brings hosts up (a Snakemake rerun, the next look of
``until: decided``, a retried phase), and gives them back wherever it puts its hosts back
(``ClusterRun.shutdown``: the end of the run, a failed phase, an interrupt, the guardian,
``restore``).  A lease that outlives its run is broken on purpose only (``python -m thermab
lease RUN_DIR --break``, ``lease_command``).

A lease is a directory made with mkdir, which of two runs only one makes.  A host's lies at
LEASE for every run (under the host's root where it has one, as its other files); the
endpoint's on the head host itself, never under a root (a port belongs to the machine, which
simulated nodes under their roots share), at ENDPOINT_LEASE with the port the config gives
the endpoint (whatever name its address goes by): no setting of a run moves either where another run would not look.
Its ``holder`` file says who holds it (user, controller host, since when, run directory and
id, the controller's pid); an empty file named after the run id lets the run find its own
lease again and give it back in one command.  The run id is made once per run directory (its
``run-id`` file).  What answers on the endpoint without a lease (a server started by hand)
is no lease's to find: the run meets it where it starts its servers
(``server.restart_servers``)."""

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

from thermab.config import endpoint_address, read_bounded
from thermab.errors import HostError, StageFailed, UserError
from thermab.experiment import controller
from thermab.hosts.host import Host
from thermab.hosts.transport import TransportError
from thermab.layout import RunDir

LEASE = "/tmp/thermab-lease"  # world-writable on every host, so any user's run meets any other's
ENDPOINT_LEASE = "/tmp/thermab-lease-port-"  # + the port; beside LEASE, in a directory every user can write
HOLDER_BYTES = 4096  # a holder record thermab writes is a few hundred bytes
RUN_ID = re.compile(r"[0-9a-f]{16}")
HOLDER_FIELDS = {"user": str, "controller": str, "since": str, "run_dir": str, "run_id": str, "pid": int}


class LeaseError(StageFailed):
    """A host or the endpoint is held by another run, or its lease is damaged; the message,
    one line, names each host and endpoint, its holder and the command that breaks the lease."""


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
class Site:
    """Where one lease lies and what it holds: ``host`` is the host whose shell reaches
    ``path``; ``endpoint`` the address:port it holds, where it holds the endpoint, not the host."""

    host: Host
    path: str
    endpoint: str | None = None

    @property
    def name(self) -> str:
        return f"endpoint {self.endpoint}" if self.endpoint else self.host.name


def host_site(host: Host) -> Site:
    return Site(host, host.path(LEASE))


def endpoint_site(head: Host, endpoint: str) -> Site:
    """The lease of the port the head's server listens on (``endpoint``, the cluster's URL),
    kept on the head host itself and named by the port alone: ``localhost``, ``127.0.0.1``
    and the head's own address reach one server there, which listens on every address."""
    address, port = endpoint_address(endpoint)
    return Site(head, f"{ENDPOINT_LEASE}{port}", f"{address}:{port}")


@dataclass(frozen=True)
class Lease:
    """A lease as found: free, held (``holder``), or damaged (``damage`` says how)."""

    site: Site
    holder: Holder | None = None
    damage: str | None = None

    @property
    def path(self) -> str:
        return self.site.path

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


def _found(site: Site, answer: list[str]) -> Lease:
    state = answer[0] if answer else ""
    if state == "free":
        return Lease(site)
    if state in _DAMAGE:
        return Lease(site, damage=_DAMAGE[state])
    if state != "holder":
        raise TransportError(site.host.name, f"unexpected answer about the lease at {site.path}: {state[:80]!r}")
    data = base64.b64decode("".join(answer[1:]))
    if len(data) > HOLDER_BYTES:
        return Lease(site, damage=f"its holder record is over {HOLDER_BYTES} bytes")
    holder = parse_holder(data)
    return Lease(site, damage=holder) if isinstance(holder, str) else Lease(site, holder)


def _on_site(site: Site, script: str, input: str | None = None):
    """Run ``script`` on the site's host itself (never in its container: the lease is the
    host's) with ``$d`` the lease's directory."""
    return site.host.run(f"d={shlex.quote(site.path)}; {script}", check=False, input=input)


# the holder record, base64 on stdin, written into $d whole: a reader finds the old or the new
_WRITE_HOLDER = 'base64 -d > "$d/.holder.$$" && mv -f -- "$d/.holder.$$" "$d/holder"'


def _record(holder: Holder) -> str:
    return base64.b64encode(json.dumps(dataclasses.asdict(holder)).encode()).decode()


def take(site: Site, mine: Holder) -> tuple[str, Lease]:
    """Take the site's lease for ``mine``'s run: ('taken', the lease), ('again', …) where the
    run holds it already (its holder brought up to date), or ('held', what holds it).
    Nothing is read before the take: mkdir makes the lease or finds it made."""
    marker = shlex.quote(f"run-{mine.run_id}")
    parent = shlex.quote(posixpath.dirname(site.path))
    result = _on_site(
        site,
        f"mkdir -p -- {parent}; "
        f'if made=$(mkdir -- "$d" 2>&1); then : > "$d"/{marker} && {_WRITE_HOLDER} && echo taken; '
        f'elif [ -d "$d" ] && ! [ -L "$d" ] && [ -f "$d"/{marker} ]; then echo again; {_DESCRIBE}; '
        f'elif [ -e "$d" ] || [ -L "$d" ]; then echo held; {_DESCRIBE}; '
        'else echo "$made" >&2; exit 1; fi',
        input=_record(mine),
    )
    answer = result.stdout.splitlines()
    if not result.ok or not answer:
        raise TransportError(site.host.name, f"cannot take the lease at {site.path}: {result.stderr.strip()[-200:]}")
    if answer[0] == "taken":
        return "taken", Lease(site, mine)
    found = _found(site, answer[1:])
    if answer[0] == "held":
        return "held", found
    if found.holder is None or (found.holder.controller, found.holder.pid) != (mine.controller, mine.pid):
        # a later invocation of the run: its record names the controller now running it
        kept = dataclasses.replace(mine, since=found.holder.since) if found.holder else mine
        _on_site(site, f'[ -f "$d"/{marker} ] && {_WRITE_HOLDER}', input=_record(kept))
        found = Lease(site, kept)
    return "again", found


def read(site: Site) -> Lease:
    """The site's lease as it is, changing nothing."""
    return _found(site, _on_site(site, _DESCRIBE).stdout.splitlines())


def release(site: Site, run: str) -> None:
    """Give back the site's lease if run ``run`` holds it; another run's is left alone."""
    result = _on_site(site, f'if [ -f "$d"/{shlex.quote("run-" + run)} ]; then rm -rf -- "$d"; fi')
    if not result.ok:
        raise TransportError(site.host.name, f"cannot give back the lease at {site.path}: {result.stderr.strip()}")


def break_lease(site: Site) -> Lease:
    """Break the site's lease, whoever holds it; returns what it was."""
    result = _on_site(site, f'{_DESCRIBE}; rm -rf -- "$d"')
    found = _found(site, result.stdout.splitlines())
    if not result.ok:
        raise TransportError(site.host.name, f"cannot break the lease at {site.path}: {result.stderr.strip()[-200:]}")
    return found


def break_command(run_dir: Path) -> str:
    return f"python -m thermab lease {shlex.quote(str(run_dir))} --break"


def refusal(refused: list[Lease], run_dir: Path) -> str:
    """One line: each host and endpoint refused, with its holder (what one run holds named
    together) or its damage, and the command that breaks the leases."""
    by_holder: dict[str, list[Site]] = {}
    for lease in refused:
        by_holder.setdefault(lease.describe(), []).append(lease.site)
    parts = []
    for what, sites in by_holder.items():
        hosts = [site.name for site in sites if not site.endpoint]
        named = [f"{'hosts' if len(hosts) > 1 else 'host'} {', '.join(hosts)}"] if hosts else []
        parts.append(f"{', '.join(named + [site.name for site in sites if site.endpoint])}: {what}")
    return (
        f"refused: {'; '.join(parts)}; nothing was changed; `{break_command(run_dir)}` breaks "
        "the leases once no run is using what they hold"
    )


def take_all(sites: list[Site], run_dir: Path, controller_pid: int | None = None) -> tuple[list[Site], dict[str, str]]:
    """Every site's lease for this run, host beside host (unreachable hosts wait out their
    timeouts together), one host's sites one after the other on its one connection.  Returns
    the sites whose lease this call took (not those the run held already) and, by host name,
    the hosts not reached with why.  Where another run holds a site or its lease is damaged,
    gives back what it took and raises LeaseError, nothing changed."""
    mine = holder_for(run_dir, controller_pid)
    by_host: dict[Host, list[Site]] = {}
    for site in sites:
        by_host.setdefault(site.host, []).append(site)

    def attempt(of_host: list[Site]) -> list[tuple[str, Lease] | TransportError]:
        outcomes: list[tuple[str, Lease] | TransportError] = []
        for site in of_host:
            try:
                outcomes.append(take(site, mine))
            except TransportError as error:
                return outcomes + [error] * (len(of_host) - len(outcomes))  # not reached: tried once
        return outcomes

    with ThreadPoolExecutor(len(by_host)) as pool:
        outcomes = {
            site: outcome
            for of_host, taken_there in zip(by_host.values(), pool.map(attempt, by_host.values()), strict=True)
            for site, outcome in zip(of_host, taken_there, strict=True)
        }
    unreached = {site.host.name: str(got) for site, got in outcomes.items() if isinstance(got, TransportError)}
    found = {site: got for site, got in outcomes.items() if not isinstance(got, TransportError)}
    taken = [site for site, (outcome, _) in found.items() if outcome == "taken"]
    refused = [lease for outcome, lease in found.values() if outcome == "held"]
    if refused:
        give_back(taken, mine.run_id)
        raise LeaseError(refusal(refused, run_dir))
    return taken, unreached


def hold(sites: list[Site], run_dir: Path) -> None:
    """Every site's lease held by this run (taken, or held already) before a job changes
    anything; a host not reached or a site held by another run stops the job, nothing changed."""
    taken, unreached = take_all(sites, run_dir)
    if unreached:
        give_back(taken, run_id(run_dir))
        raise HostError("; ".join(unreached.values()))


def give_back(sites: Iterable[Site], run: str | None) -> list[str]:
    """Release each site's lease that run ``run`` holds (none where the run has no id);
    returns the problems met, every site tried."""
    problems = []
    for site in sites if run else ():
        try:
            release(site, run)
        except TransportError as error:
            problems.append(str(error))
    return problems
