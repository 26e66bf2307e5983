"""One run of one cluster (``results/{cluster}/{order}/``): its hosts, and the side
effects that bring it up and put it back.

``ensure_up`` is idempotent and called by every job that touches hosts, so a run can be
resumed or extended (``--config repeats=5``) by a later Snakemake invocation.
``shutdown`` is what the last job, a failure, or the guardian does: restore every patched
file (verified), stop or restart the server, stop the agents and pull their logs, give the
leases of the hosts and the endpoint back; no step can block the ones after it."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from thermab.config import ClusterSpec, Config, cluster_spec, thaw, view
from thermab.experiment import events, lease, server
from thermab.experiment.patch import Patcher
from thermab.hosts import clock
from thermab.hosts.host import Host
from thermab.hosts.transport import TransportError
from thermab.layout import RunDir
from thermab.telemetry import deploy, wall_meters, wall_poll


class ClusterRun:
    def __init__(
        self,
        config: Config,
        cluster: str,
        order: str,
        run_dir: Path,
        workdir: Path | None = None,
        progress: Callable[[str], None] = print,
        speed_only: bool = False,
    ):
        self.config = config  # the validated config's read-only view (config.view), built by the caller
        self.speed_only = speed_only  # a phase job with only speed questions open (plan.speed_only)
        self.cluster: ClusterSpec = cluster_spec(config, cluster, workdir)
        self.order = order
        self.run_dir = Path(run_dir)
        self.files = RunDir(run_dir)  # where each of its files lives
        self.workdir = Path(workdir or Path.cwd())
        self.progress = progress

    @classmethod
    def from_session(cls, run_dir: Path, progress: Callable[[str], None] = print) -> ClusterRun:
        """Rebuild a run from the session file its jobs write (used by the guardian)."""
        session = json.loads(RunDir(run_dir).session.read_text())
        return cls(
            view(session["config"]),
            session["cluster"],
            session["order"],
            Path(run_dir),
            Path(session["workdir"]),
            progress,
        )

    @property
    def session(self) -> str:
        return f"{self.cluster.name}-{self.order}"

    @cached_property
    def hosts(self) -> list[Host]:
        return [Host(spec, progress=self.progress) for spec in self.cluster.hosts]

    @property
    def head(self) -> Host:
        return next(h for h in self.hosts if h.name == self.cluster.head)

    @cached_property
    def lease_sites(self) -> list[lease.Site]:
        """What the run holds while it runs (``lease``): each host, and the endpoint its
        head's server listens on, which the run stops and starts as it does the head."""
        return [*map(lease.host_site, self.hosts), lease.endpoint_site(self.head, self.cluster.endpoint)]

    def patcher(self, host: Host) -> Patcher:
        return Patcher(host, self.config.setting, self.files.patch_state(host.name))

    def event(self, name: str, **fields) -> dict:
        return events.append(self.run_dir, name, order=self.order, **fields)

    # -- bringing the run up -------------------------------------------------------------

    def write_session(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        session = {
            "config": thaw(self.config),
            "cluster": self.cluster.name,
            "order": self.order,
            "workdir": str(self.workdir),
        }
        self.files.session.write_text(json.dumps(session, indent=1))

    def build_simulated(self, host: Host) -> None:
        """A simulated node's tree, if missing: files only, no process started."""
        flags = " --lost-wakeup" if host.spec.settings.get("lost_wakeup") else ""
        if host.spec.settings.get("restart_variance", True) is False:
            flags += " --no-restart-variance"
        host.run(
            f"{shlex.quote(sys.executable)} -m thermab.sim.node create "
            f"{shlex.quote(str(host.spec.root))} --role {host.spec.simulated}{flags}"
        )

    def power_on_simulated(self) -> None:
        """Simulated nodes: build the tree if missing and start the thermal model."""
        for host in self.hosts:
            if host.spec.simulated:
                self.build_simulated(host)
                host.run(
                    f"{shlex.quote(sys.executable)} -m thermab.sim.thermal "
                    f"--node {shlex.quote(str(host.spec.root))} --detach"
                )

    def power_off_simulated(self) -> None:
        for host in self.hosts:
            if host.spec.simulated:
                host.run(
                    f"{shlex.quote(sys.executable)} -m thermab.sim.thermal stop "
                    f"--node {shlex.quote(str(host.spec.root))}",
                    check=False,
                )

    def agent_settings(self, host: Host) -> dict:
        monitor = self.config.monitor
        return {
            "process_pattern": host.spec.process_pattern(monitor.process_pattern),
            "intervals": thaw(monitor.intervals),  # written for the agent as JSON
        }

    @cached_property
    def wall_meters(self) -> list[wall_meters.Meter]:
        """Every host's meters outside it, which the controller polls (a simulated node's plug)."""
        return [
            meter
            for host in self.hosts
            for meter in wall_meters.meters_of(
                host.name, host.spec.settings, host.spec.root if host.spec.simulated else None
            )
        ]

    def ensure_up(self) -> None:
        """Simulated hardware on, agents running, the wall meters polled (the caller has made
        sure a guardian watches the run first)."""
        self.write_session()
        self.power_on_simulated()
        for host in self.hosts:
            pid = deploy.start_agent(host, self.session, self.agent_settings(host))
            self.progress(f"agent on {host.name}: pid {pid}")
        pid = wall_poll.start(self.run_dir, self.wall_meters)
        if pid:
            self.progress(f"wall meters ({len(self.wall_meters)}) polled by the controller: pid {pid}")

    # -- putting everything back ---------------------------------------------------------

    def shutdown(self, reason: str, t: float | None = None, **where) -> list[str]:
        """Put every host back, in the order that matters: each patched file first, from its
        kept original bytes (nothing of the config is formatted or run for it), then the
        servers, then the agents, then the leases of the hosts put back (and the endpoint's
        with its head).  Every step runs
        whatever happened to the one before; returns the problems met (empty when all went
        well)."""
        problems: list[str] = []

        def attempt(what: str, action: Callable[[], object]) -> object:
            try:
                return action()
            except Exception as error:  # any failure, a bug included, must not block the next step
                problems.append(f"{what}: {type(error).__name__}: {error}")
                self.progress(f"WARNING {what} failed ({type(error).__name__}: {error}); going on")
                return None

        if reason != "completed":
            attempt("record the abort", lambda: self.event("abort", t=t, detail={"reason": reason}, **where))
        for host in self.hosts:
            done = attempt(f"restore {host.name}", lambda h=host: self.patcher(h).restore())
            if done:
                attempt(
                    f"record {host.name} restored", lambda h=host, d=done: self.event("restored", host=h.name, detail=d)
                )
        for host in reversed(self.hosts):  # head first, as a phase stops them
            attempt(f"stop the server on {host.name}", lambda h=host: server.stop_servers([h]))
        if self.cluster.end_state == "restarted":
            attempt("restart servers", lambda: server.start_servers(self.hosts))
        for host in self.hosts:
            attempt(f"stop agent on {host.name}", lambda h=host: deploy.stop_agent(h, self.session))
            attempt(
                f"pull logs of {host.name}",
                lambda h=host: deploy.pull(h, self.session, self.files.host_monitor(h.name)),
            )
        attempt("stop polling the wall meters", lambda: wall_poll.stop(self.run_dir))
        attempt("power off simulated nodes", self.power_off_simulated)

        def give_back() -> None:
            # a host left patched stays held, and the endpoint with its head: no other run is
            # let in before it is put back
            put_back = {host.name for host in self.hosts if not self.patcher(host).is_patched}
            sites = [site for site in self.lease_sites if site.host.name in put_back]
            problems.extend(lease.give_back(sites, lease.run_id(self.run_dir, create=False)))

        attempt("give the leases back", give_back)
        return problems

    def still_patched(self) -> list[str]:
        """Hosts whose original is still kept, i.e. not known to be restored."""
        return [host.name for host in self.hosts if self.patcher(host).is_patched]


# exit status of whatever puts hosts back (the guardian, `restore`): 2 is a user's mistake
RESTORED, STEP_FAILED, STILL_PATCHED = 0, 1, 3


def exit_status(problems: list[str], still_patched: list[str]) -> int:
    """0: all put back; 1: every file restored, another step failed (servers, agents,
    logs); 3: a host is still patched (its original kept under patch-state/)."""
    if still_patched:
        return STILL_PATCHED
    return STEP_FAILED if problems else RESTORED


def clock_offsets(hosts: list[Host]) -> tuple[dict[str, clock.Offset], dict[str, str]]:
    """Each host's clock minus the controller's (``hosts/clock.py``), and why a host's
    could not be measured."""
    offsets, problems = {}, {}
    for host in hosts:
        try:
            offsets[host.name] = clock.measure(host.transport, python=host.agent_python)
        except TransportError as error:
            problems[host.name] = str(error)
    return offsets, problems


def offsets_record(offsets: dict[str, clock.Offset], prefix: str) -> dict:
    """Offsets as preflight.json and stopped.json keep them: ``{prefix}_s`` (the form
    ingest reads) and ``{prefix}_uncertainty_s`` (± half the best round trip)."""
    return {
        f"{prefix}_s": {name: o.offset_s for name, o in offsets.items()},
        f"{prefix}_uncertainty_s": {name: o.uncertainty_s for name, o in offsets.items()},
    }
