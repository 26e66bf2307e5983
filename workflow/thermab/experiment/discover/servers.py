"""Which process is the vLLM server to measure on each host (pure): the servers with their
containers, the one chosen (or a Question naming the candidates), and the host serving the API."""

from __future__ import annotations

from dataclasses import dataclass

from thermab.experiment.discover.containers import Container
from thermab.experiment.discover.proc import Process, ancestors, is_server, option
from thermab.experiment.discover.refusals import Question

VLLM_DEFAULT_PORT = 8000


@dataclass(frozen=True)
class Server:
    process: Process
    container: Container | None = None
    main: bool = False  # the container's own process (not one started in it by `exec`)

    @property
    def port(self) -> int | None:
        try:
            return int(option(self.process.argv, "--port") or VLLM_DEFAULT_PORT)
        except ValueError:
            return None

    @property
    def headless(self) -> bool:
        return "--headless" in self.process.argv

    @property
    def label(self) -> str:
        where = f"container {self.container.name}" if self.container else "on the host"
        return f"{where} (pid {self.process.pid}, {'headless' if self.headless else f'port {self.port}'})"


def servers_of(processes: list[Process], containers: list[Container]) -> tuple[list[Server], list[Process]]:
    """The vLLM servers, each with its container (by the container id in its cgroup) and
    whether it is that container's main process (or descends from it); and the servers in
    a container none of the listed ones owns (another engine or daemon)."""
    by_pid = {p.pid: p for p in processes}
    outermost = [p for p in processes if is_server(p.argv) and not any(is_server(a.argv) for a in ancestors(p, by_pid))]
    servers, unowned = [], []
    for process in outermost:
        container = next((c for c in containers if c.id and c.id in process.cgroup), None)
        if container is None and process.namespaced:
            unowned.append(process)
            continue
        main = container is not None and (
            process.pid == container.pid
            or process.ppid == container.pid
            or any(a.ppid == container.pid for a in ancestors(process, by_pid))
        )
        servers.append(Server(process, container, main))
    return servers, unowned


def choose_server(host: str, servers: list[Server], container: str, endpoint_port: int | None) -> Server | None:
    """The one server to measure on a host, or a Question naming the candidates and the
    flag that picks one; None when there is none (the caller says why)."""
    if container == "none":
        candidates = [s for s in servers if s.container is None]
    elif container == "auto":
        candidates = servers
    else:
        candidates = [s for s in servers if s.container and s.container.name == container]
    if len(candidates) > 1 and endpoint_port is not None:
        by_port = [s for s in candidates if not s.headless and s.port == endpoint_port]
        candidates = by_port or candidates
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    # only flags that narrow these candidates down
    names = sorted({s.container.name for s in candidates if s.container})
    outside = any(s.container is None for s in candidates)
    flags = [f"--container {host}=NAME ({', '.join(names)})"] if len(names) > 1 or (names and outside) else []
    if outside and names:
        flags.append(f"--container {host}=none")
    if len({s.port for s in candidates if not s.headless}) > 1:
        flags.append("--endpoint URL (its port picks the head's server)")
    hint = f"choose with {' or '.join(flags)}" if flags else "stop the ones not to be measured"
    raise Question(
        f"host {host}: {len(candidates)} vLLM servers, " + "; ".join(s.label for s in candidates) + f": {hint}"
    )


def pick_head(names: list[str], chosen: dict[str, Server], head: str | None) -> str:
    """The host serving the API: the one given, the only one, the one named head, or the
    one server not started --headless; else a Question."""
    if head:
        return head
    if len(names) == 1:
        return names[0]
    if "head" in names:
        return "head"
    serving = [name for name in names if not chosen[name].headless]
    if len(serving) == 1:
        return serving[0]
    raise Question(f"which host serves the API? {', '.join(serving or names)}: choose with --head NAME")
