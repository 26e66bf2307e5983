"""The edge: reading one host, read-only (``/proc``, docker/podman, the setting's file,
``import vllm`` with ``-B``, the agent's discovery, nvidia-smi, the clock, ``/v1/models``).
Every fact is recorded with its source, every gap with why."""

from __future__ import annotations

import posixpath
import re
import shlex

from thermab import config as thermab_config
from thermab.config import HostSpec
from thermab.experiment import server as server_api
from thermab.experiment.cluster import clock_offsets
from thermab.experiment.discover.containers import Container, parse_inspect
from thermab.experiment.discover.facts import Fact, summarize_agent, why
from thermab.experiment.discover.host_setting import current_value, file_in_vllm
from thermab.experiment.discover.proc import PROCESS_SCAN, option, parse_processes, systemd_service
from thermab.experiment.discover.render import CLUSTER
from thermab.experiment.discover.servers import Server, servers_of
from thermab.experiment.discover.targets import Target
from thermab.experiment.patch import PatchError, anchor_count
from thermab.hosts.host import Host
from thermab.hosts.transport import CommandError, NotAFile, Result, TransportError
from thermab.telemetry import deploy

# the schema's default, which the written config keeps (the API server by its command, the
# engine and workers by vLLM's process titles)
PROCESS_PATTERN = thermab_config.defaults("monitor")["process_pattern"]
VLLM_PROBE = "import os, vllm; print(vllm.__version__); print(os.path.dirname(vllm.__file__))"
PYTHON_NAME = re.compile(r"^python[0-9.]*$")


class HostProbe:
    """Reads one host; every fact is recorded with its source, every gap with why."""

    def __init__(self, target: Target, host: Host):
        self.target, self.host = target, host
        self.found: list[Fact] = []
        self.missing: list[Fact] = []

    def note(self, what: str, value: str, source: str) -> None:
        self.found.append(Fact(self.target.name, what, value, source))

    def lack(self, what: str, reason: str) -> None:
        self.missing.append(Fact(self.target.name, what, reason))

    def run(self, command: str, timeout: float = 60) -> Result:
        return self.host.run(command, timeout=timeout, check=False)

    def containers(self) -> list[Container]:
        found = []
        for engine in ("docker", "podman"):
            listed = self.run(f"{engine} ps -q --no-trunc")
            if not listed.ok:
                self.lack(f"{engine} containers", why(listed, engine))
                continue
            ids = listed.stdout.split()
            if not ids:
                self.note(f"{engine} containers", "none running", f"{engine} ps")
                continue
            inspected = self.run(f"{engine} inspect " + " ".join(shlex.quote(i) for i in ids))
            if not inspected.ok:
                self.lack(f"{engine} containers", why(inspected, engine))
                continue
            containers = parse_inspect(engine, inspected.stdout)
            self.note(f"{engine} containers", ", ".join(c.name for c in containers), f"{engine} ps, {engine} inspect")
            found += containers
        return found

    def servers(self) -> list[Server]:
        scan = self.run(PROCESS_SCAN)
        processes = parse_processes(scan.stdout)
        servers, unowned = servers_of(processes, self.containers())
        for process in unowned:
            self.lack(
                "vLLM server",
                f"pid {process.pid} runs in a container that no docker/podman here lists "
                f"(another engine or daemon): {process.command[:160]}",
            )
        for server in servers:
            container = server.container
            binds = ", ".join(
                f"{m.source}:{m.destination}{'' if m.writable else ':ro'}"
                for m in (container.mounts if container else ())
                if m.kind == "bind"
            )
            detail = (
                (
                    f"; {container.engine}, image {container.image}, restart policy {container.restart}, "
                    f"{'its own process' if server.main else 'started by exec'}"
                    + (f", bind mounts {binds}" if binds else "")
                )
                if container
                else ""
            )
            self.note("vLLM server", server.label + detail, f"/proc/{server.process.pid}/cmdline")
        if not servers and not unowned:
            self.lack("vLLM server", "no running `vllm serve`/vllm.entrypoints process in /proc")
        return servers

    def place(self, server: Server) -> Host:
        """Where commands reach the server's filesystem: its container, or the host."""
        if server.container is None:
            return self.host
        spec = self.host.spec
        settings = dict(spec.settings, container_engine=server.container.engine, container=server.container.name)
        return Host(HostSpec(spec.name, spec.cluster, spec.transport, settings), self.host.transport)

    def view(self, server: Server) -> tuple[str | None, dict[str, str]]:
        """The server's working directory and environment, as it sees them."""
        process = server.process
        if server.container is None:
            cwd, environ = process.cwd, self.run(f"cat /proc/{process.pid}/environ")
            where = f"/proc/{process.pid}"
        else:
            pid, run_in = process.inner_pid, f"{server.container.engine} exec {shlex.quote(server.container.name)}"
            inner = self.run(f"{run_in} sh -c " + shlex.quote(f"cd /proc/{pid}/cwd && pwd -P"))
            cwd = (inner.stdout.strip() or None) if inner.ok else None
            environ = self.run(f"{run_in} cat /proc/{pid}/environ")
            where = f"/proc/{pid} in container {server.container.name}"
        if cwd:
            self.note("working directory", cwd, f"{where}/cwd")
        else:
            self.lack("working directory", f"{where}/cwd: not readable (no permission?)")
        if not environ.ok:
            self.lack(
                "server environment",
                f"{where}/environ: {why(environ, 'cat')}; add the server's variables to `start` by hand",
            )
            return cwd, {}
        return cwd, dict(e.split("=", 1) for e in environ.stdout.split("\0") if "=" in e)

    def vllm(self, server: Server, place: Host, cwd: str | None) -> tuple[str, str, str] | None:
        """(python, version, package directory) of the first Python that imports vllm where
        the server runs: its own interpreter first, then python3."""
        argv0 = server.process.argv[0]
        candidates = []
        if PYTHON_NAME.match(posixpath.basename(argv0)):
            relative = cwd and "/" in argv0 and not argv0.startswith("/")
            resolved = posixpath.normpath(posixpath.join(cwd, argv0)) if relative else argv0
            candidates.append((resolved, f"argv[0] of pid {server.process.pid}"))
        candidates.append(("python3", "python3 on PATH"))
        cd = f"cd {shlex.quote(cwd)} && " if cwd else ""
        tried = set()
        for python, source in candidates:
            if python in tried:
                continue
            tried.add(python)
            result = place.exec(f"{cd}{shlex.quote(python)} -B -c {shlex.quote(VLLM_PROBE)}", timeout=300, check=False)
            lines = result.stdout.strip().splitlines()
            if result.ok and len(lines) >= 2:
                self.note("python", python, source + " (imports vllm)")
                self.note("vLLM version", lines[-2], f"{python} -c 'import vllm; print(vllm.__version__)'")
                return python, lines[-2], lines[-1]
            error = (result.stderr.strip().splitlines() or ["no output"])[-1]
            self.lack("python", f"{python} ({source}): " + (why(result, python) if result.exited == 127 else error))
        return None

    def systemd_unit(self, server: Server) -> str | None:
        """The unit the server is the main process of, as systemctl says (else None)."""
        unit = None if server.container else systemd_service(server.process.cgroup)
        if unit is None:
            return None
        scope, _, name = unit.rpartition(" ")
        command = f"systemctl {scope + ' ' if scope else ''}show -p MainPID --value {shlex.quote(name)}"
        main = self.run(command)
        if main.ok and main.stdout.strip() == str(server.process.pid):
            self.note("systemd unit", unit, command)
            return unit
        return None

    def setting_file(self, place: Host, vllm_dir: str | None, setting: dict) -> tuple[str, str | None] | None:
        """(file, current value) with its anchor checked, or None (why is recorded)."""
        rel = file_in_vllm(setting["file"])
        if rel and vllm_dir:
            file, source = f"{vllm_dir}/{rel}", "the vllm package's directory + " + rel
        elif setting["file"].startswith("/"):
            file, source = setting["file"], "setting.file as written"
        else:
            self.lack("setting file", f"{setting['file']}: no Python here imports vllm to resolve it")
            return None
        try:
            text = place.read_file(file).decode(errors="replace")
        except NotAFile as error:
            self.lack("setting file", str(error).partition(": ")[2])
            return None
        except CommandError as error:
            self.lack("setting file", f"{file}: {why(error.result, 'base64')}")
            return None
        self.note("setting file", file, source)
        try:
            count = anchor_count(text, setting["anchor"])
        except PatchError as error:  # the anchor backtracks on this file
            self.lack("anchor", f"{file}: {error}")
            return None
        if count != 1:
            self.lack("anchor", f"{setting['anchor']!r} matches {count} times in {file} (must be exactly 1)")
            return None
        value = current_value(text, setting["anchor"], setting["replacement"])
        self.note(f"{setting['name']} now", f"{value} (anchor matches once)", f"read {file}")
        return file, value

    def agent(self) -> tuple[str, ...]:
        try:
            found = deploy.discover_read_only(self.host, PROCESS_PATTERN)
        except TransportError as error:
            result = getattr(error, "result", None)
            self.lack("agent discovery", why(result, "python3") if result else str(error))
            return ()
        except ValueError as error:
            self.lack("agent discovery", f"the agent's output is not JSON: {error}")
            return ()
        present, absent = summarize_agent(found)
        for what, value in present:
            self.note(what, value, "agent.py --discover")
        for what, reason in absent:
            self.lack(what, reason)
        return tuple(z["name"] for z in (found.get("thermal") or {}).get("details", []))

    def gpus(self) -> tuple[str, ...]:
        """The GPUs nvidia-smi lists, noted; their names returned (the platform)."""
        command = "nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader"
        result = self.run(command)
        if not (result.ok and result.stdout.strip()):
            self.lack("GPUs", why(result, command) if not result.ok else "nvidia-smi lists none")
            return ()
        lines = [line.strip() for line in result.stdout.strip().splitlines()]
        for line in lines:
            self.note("GPU", line, "nvidia-smi --query-gpu")
        return tuple(fields[1].strip() for fields in (line.split(",") for line in lines) if len(fields) > 1)

    def clock(self) -> None:
        offsets, problems = clock_offsets([self.host])
        if self.host.name in problems:
            self.lack("clock offset", problems[self.host.name])
            return
        offset = offsets[self.host.name]
        self.note(
            "clock offset",
            f"{offset.offset_s:+.4f} ± {offset.uncertainty_s:.4f} s (host minus this machine)",
            f"date +%s.%N, the shortest of {offset.samples} round trips",
        )


def host_spec(target: Target, options: dict) -> HostSpec:
    settings: dict = {"transport": target.transport}
    if target.transport == "ssh":
        settings.update(address=target.address, port=target.port)
        if target.user:
            settings["user"] = target.user
        settings.update({k: options[k] for k in ("key_file", "known_hosts", "jump") if options.get(k)})
    return HostSpec(target.name, CLUSTER, target.transport, settings)


def check_endpoint(probe: HostProbe, server: Server, given: str | None) -> tuple[str, str | None]:
    """The endpoint (given, or the head's address and its server's port) and the model
    its /v1/models names first, or None when it does not answer."""
    target = probe.target
    address = "127.0.0.1" if target.transport == "local" else target.address
    endpoint = (given or f"http://{address}:{server.port}").rstrip("/")
    listen = option(server.process.argv, "--host")
    if (
        not given
        and target.transport == "ssh"
        and listen in ("127.0.0.1", "localhost")
        and address not in ("127.0.0.1", "localhost")
    ):
        probe.lack("endpoint", f"the server listens on {listen} only: give --endpoint (e.g. an SSH tunnel's)")
    try:
        served = server_api.models(endpoint)
    except (OSError, ValueError, KeyError) as error:
        probe.lack("endpoint", f"{endpoint}/v1/models does not answer: {getattr(error, 'reason', error)}")
        return endpoint, None
    probe.note(
        "endpoint", f"{endpoint}: /v1/models answers {', '.join(served) or 'no model'}", f"GET {endpoint}/v1/models"
    )
    return endpoint, served[0] if served else None
