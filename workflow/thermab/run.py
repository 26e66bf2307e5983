"""One run of one cluster (``results/{cluster}/{order}/``): its hosts, and the side
effects that bring it up and put it back.

``ensure_up`` is idempotent and called by every job that touches hosts, so a run can be
resumed or extended (``--config repeats=5``) by a later Snakemake invocation.
``shutdown`` is what the last job, a failure, or the guardian does: restore every patched
file (verified), stop or restart the server, stop the agents and pull their logs."""

from __future__ import annotations

import json
import shlex
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import Callable

from thermab import events, guardian, lifecycle, monitor
from thermab.config import ClusterSpec, cluster_spec
from thermab.host import Host
from thermab.patch import Patcher
from thermab.transport import TransportError

SESSION_FILE = "session.json"


class Run:
    def __init__(self, config: dict, cluster: str, order: str, run_dir: Path,
                 workdir: Path | None = None, say: Callable[[str], None] = print):
        self.config = config
        self.cluster: ClusterSpec = cluster_spec(config, cluster, workdir)
        self.order = order
        self.run_dir = Path(run_dir)
        self.results_dir = self.run_dir.parent  # results/{cluster}
        self.workdir = Path(workdir or Path.cwd())
        self.say = say

    @classmethod
    def from_session(cls, run_dir: Path, say: Callable[[str], None] = print) -> "Run":
        """Rebuild a run from the session file its jobs write (used by the guardian)."""
        session = json.loads((Path(run_dir) / SESSION_FILE).read_text())
        return cls(session["config"], session["cluster"], session["order"], Path(run_dir),
                   Path(session["workdir"]), say)

    @property
    def session(self) -> str:
        return f"{self.cluster.name}-{self.order}"

    @cached_property
    def hosts(self) -> list[Host]:
        return [Host(spec) for spec in self.cluster.hosts]

    @property
    def head(self) -> Host:
        return next(h for h in self.hosts if h.name == self.cluster.head)

    def patcher(self, host: Host) -> Patcher:
        return Patcher(host, self.config["setting"], self.results_dir / "patch-state" / host.name)

    def event(self, name: str, **fields) -> dict:
        return events.append(self.run_dir, name, order=self.order, **fields)

    # -- bringing the run up -------------------------------------------------------------

    def write_session(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        session = {"config": self.config, "cluster": self.cluster.name, "order": self.order,
                   "workdir": str(self.workdir)}
        (self.run_dir / SESSION_FILE).write_text(json.dumps(session, indent=1))

    def power_on_simulated(self) -> None:
        """Simulated nodes: build the tree if missing and start the thermal model."""
        for host in self.hosts:
            if host.spec.simulated:
                root = shlex.quote(str(host.spec.root))
                python = shlex.quote(sys.executable)
                lost_wakeup = " --lost-wakeup" if host.spec.settings.get("lost_wakeup") else ""
                host.run(f"{python} -m thermab.sim.node create {root} --role {host.spec.simulated}{lost_wakeup}")
                host.run(f"{python} -m thermab.sim.thermal --node {root} --detach")

    def power_off_simulated(self) -> None:
        for host in self.hosts:
            if host.spec.simulated:
                host.run(f"{shlex.quote(sys.executable)} -m thermab.sim.thermal stop "
                         f"--node {shlex.quote(str(host.spec.root))}", check=False)

    def agent_settings(self, host: Host) -> dict:
        monitor_config = self.config["monitor"]
        return {"process_pattern": host.spec.process_pattern(monitor_config["process_pattern"]),
                "intervals": monitor_config["intervals"]}

    def ensure_up(self) -> None:
        """Guardian watching this Snakemake, simulated hardware on, agents running."""
        self.write_session()
        guardian.ensure(self.run_dir)
        self.power_on_simulated()
        for host in self.hosts:
            pid = monitor.start_agent(host, self.session, self.agent_settings(host))
            self.say(f"agent on {host.name}: pid {pid}")

    def restore_leftovers(self) -> list[str]:
        """Restore hosts an earlier run left patched (it died without cleaning up)."""
        restored = []
        for host in self.hosts:
            patcher = self.patcher(host)
            if patcher.is_patched:
                patcher.restore()
                restored.append(host.name)
        return restored

    # -- putting everything back ---------------------------------------------------------

    def shutdown(self, reason: str, t: float | None = None, **where) -> list[str]:
        """Best effort on every host; returns the problems met (empty when all went well)."""
        problems: list[str] = []
        if reason != "completed":
            self.event("abort", t=t, detail={"reason": reason}, **where)

        def attempt(what: str, action: Callable[[], object]) -> object:
            try:
                return action()
            except (TransportError, OSError, RuntimeError) as error:
                problems.append(f"{what}: {error}")
                self.say(f"WARNING {what}: {error}")
                return None

        attempt("stop servers", lambda: lifecycle.stop_servers(self.hosts))
        for host in self.hosts:
            done = attempt(f"restore {host.name}", self.patcher(host).restore)
            if done:
                self.event("restored", host=host.name, detail=done)
        if self.cluster.end_state == "restarted":
            attempt("restart servers", lambda: lifecycle.start_servers(self.hosts))
        for host in self.hosts:
            attempt(f"stop agent on {host.name}", lambda h=host: monitor.stop_agent(h, self.session))
            attempt(f"pull logs of {host.name}",
                    lambda h=host: monitor.pull(h, self.session, self.run_dir / "monitor" / h.name))
        attempt("power off simulated nodes", self.power_off_simulated)
        return problems


def clock_offsets(hosts: list[Host]) -> dict[str, float]:
    """Host clock minus controller clock, from the round-trip midpoint of ``date``."""
    offsets = {}
    for host in hosts:
        before = time.time()
        remote = float(host.run("date +%s.%N").stdout.strip())
        after = time.time()
        offsets[host.name] = remote - (before + after) / 2
    return offsets
