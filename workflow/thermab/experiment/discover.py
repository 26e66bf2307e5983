"""``thermab discover``: point it at real nodes, get a checked config.

    python -m thermab discover NAME=URL [NAME=URL ...] [--head NAME] [--jump USER@HOST:PORT]
        [--key-file FILE] [--known-hosts FILE] [--container [HOST=]NAME|auto|none]
        [--endpoint URL] [--cluster NAME] [--setting-from CONFIG] [-o FILE]

``URL`` is ``ssh://[user@]host[:port]`` (the transport of a run, host keys pinned in
``--known-hosts``) or ``local://`` (this machine).  Nothing on a host changes: every command
only reads (``/proc``, ``docker``/``podman ps`` and ``inspect``, the setting's file, ``import
vllm`` with ``-B`` so no bytecode is written), and the agent's own discovery reaches the
host's Python on its stdin.

Per host it finds the running vLLM server (on the host or in a container), the Python that
imports vllm and its version, the setting's file with its anchor count and current value,
the serve command line, thermal zones with trip points, cpufreq policies, GPUs, whatever
else the agent's sources report (power, ...), the clock offset, and whether ``/v1/models``
answers.  It prints each fact with its source, and what it could not find with why; then
writes a commented config (to ``-o FILE``, else stdout) with the lifecycle preset that fits,
which passes ``check-config``.

Exit 2: a user error, or a choice only the user can make (several servers or containers:
the message names them and the flag that picks one).  Exit 1: something a run needs is
missing (the table says what); nothing is written.  Exit 0: the config is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import posixpath
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from thermab import config as thermab_config
from thermab.config import ConfigError, HostSpec, endpoint_problem, port_problem, redact_url
from thermab.errors import UserError
from thermab.experiment import server as server_api
from thermab.experiment.cluster import clock_offsets
from thermab.experiment.patch import PatchError, anchor_count, anchor_matches
from thermab.hosts.host import Host
from thermab.hosts.transport import CommandError, Result, TransportError
from thermab.telemetry import deploy

CLUSTER = "discovered"
STOCK_SETTING = Path(__file__).resolve().parents[3] / "config" / "config.yaml"
# The API server by its command, the engine and workers by vLLM's process titles: not plain
# `vllm`, which also matches a config file named after vLLM on Snakemake's command line.
PROCESS_PATTERN = r"vllm serve|vllm\.entrypoints|VLLM::"
VLLM_DEFAULT_PORT = 8000
STOP_WAIT_S = 60


class UsageError(UserError):
    """A wrong flag or argument: one line naming it, exit 2."""


class Question(UserError):
    """A choice only the user can make: the candidates and the flag that picks one, exit 2."""


# -- what the command line names -------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    name: str
    transport: str  # ssh | local
    address: str | None = None
    port: int = 22
    user: str | None = None

    @property
    def url(self) -> str:
        if self.transport == "local":
            return "local://"
        return f"ssh://{self.user + '@' if self.user else ''}{self.address}:{self.port}"


HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
SSH_URL = re.compile(r"^ssh://(?:(?P<user>[^@/:\s]+)@)?(?P<address>[^@:/\s]+)(?::(?P<port>\d+))?/?$")
JUMP = re.compile(r"^([^@\s]+@)?[^@:\s]+(:[0-9]+)?$")  # the schema's `jump` pattern


def parse_target(text: str) -> Target:
    name, equals, url = text.partition("=")
    if not equals or not HOST_NAME.fullmatch(name):
        raise UsageError(f"{redact_url(text)!r}: expected NAME=ssh://[user@]host[:port] or NAME=local:// "
                         "(NAME: letters, digits, _ . -)")
    if url == "local://":
        return Target(name, "local")
    match = SSH_URL.fullmatch(url)
    if not match or port_problem(match["port"] or "22"):
        raise UsageError(f"host {name}: {redact_url(url)!r} is not ssh://[user@]host[:port] or local:// "
                         "(a password is never taken: keys or the ssh-agent)")
    return Target(name, "ssh", match["address"], int(match["port"] or 22), match["user"])


def parse_containers(values: list[str], hosts: list[str]) -> dict[str, str]:
    """``--container`` values: ``NAME`` for every host or ``HOST=NAME`` for one; ``auto``
    (any container or none) and ``none`` (a server outside containers) are choices too."""
    chosen = {host: "auto" for host in hosts}
    for value in values:
        host, equals, name = value.rpartition("=")
        if not equals:
            chosen = {h: value for h in hosts}
            continue
        if host not in chosen:
            raise UsageError(f"--container {value}: no host {host!r} (hosts: {', '.join(hosts)})")
        chosen[host] = name
    return chosen


# -- processes (one read of /proc per host) ----------------------------------------------------

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
        processes.append(Process(int(pid), int(ppid.group(1)), argv, cgroup, cwd.strip() or None,
                                 tuple(int(n) for n in nspid.group(1).split()) if nspid else ()))
    return processes


def is_server(argv: tuple[str, ...]) -> bool:
    """A `vllm serve`-shaped command: the ``vllm`` command (or a module named ``…vllm``) then
    ``serve``, or a module under ``vllm.entrypoints``; only its first words count, so a
    shell wrapping the command (``sh -c "vllm serve …"``) is not taken for the server."""
    for i, arg in enumerate(argv[:4]):
        following = argv[i + 1:i + 3]
        if arg == "-m" and following:
            module = following[0]
            if module.startswith("vllm.entrypoints.") or (module.rsplit(".", 1)[-1] == "vllm"
                                                          and following[1:] == ("serve",)):
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


# -- containers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mount:
    kind: str
    source: str
    destination: str
    writable: bool


@dataclass(frozen=True)
class Container:
    engine: str
    name: str
    id: str
    pid: int  # its main process, as this host's /proc numbers it
    image: str
    restart: str
    mounts: tuple[Mount, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def parse_inspect(engine: str, text: str) -> list[Container]:
    """``docker inspect``/``podman inspect`` JSON -> containers (both engines' shapes)."""
    containers = []
    for item in json.loads(text or "[]"):
        config, state, host_config = item.get("Config") or {}, item.get("State") or {}, item.get("HostConfig") or {}
        mounts = tuple(Mount(m.get("Type", ""), m.get("Source", ""), m.get("Destination", ""), bool(m.get("RW", True)))
                       for m in item.get("Mounts") or [])
        env = tuple(tuple(e.split("=", 1)) for e in config.get("Env") or [] if "=" in e)
        containers.append(Container(
            engine, str(item.get("Name", "")).lstrip("/"), str(item.get("Id", "")), int(state.get("Pid") or 0),
            str(config.get("Image", "")), str((host_config.get("RestartPolicy") or {}).get("Name") or "no"),
            mounts, tuple(sorted((config.get("Labels") or {}).items())), env))
    return containers


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
    outermost = [p for p in processes if is_server(p.argv)
                 and not any(is_server(a.argv) for a in ancestors(p, by_pid))]
    servers, unowned = [], []
    for process in outermost:
        container = next((c for c in containers if c.id and c.id in process.cgroup), None)
        if container is None and process.namespaced:
            unowned.append(process)
            continue
        main = container is not None and (process.pid == container.pid or process.ppid == container.pid
                                          or any(a.ppid == container.pid for a in ancestors(process, by_pid)))
        servers.append(Server(process, container, main))
    return servers, unowned


def ancestors(process: Process, by_pid: dict[int, Process]) -> list[Process]:
    found, seen = [], {process.pid}
    while process.ppid in by_pid and process.ppid not in seen:
        process = by_pid[process.ppid]
        seen.add(process.pid)
        found.append(process)
    return found


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
    raise Question(f"host {host}: {len(candidates)} vLLM servers, " + "; ".join(s.label for s in candidates)
                   + f": {hint}")


# -- facts and what was not found -------------------------------------------------------------

@dataclass(frozen=True)
class Fact:
    host: str
    what: str
    value: str
    source: str = ""  # where it came from; empty for what was not found (value says why)


def why(result: Result, command: str) -> str:
    """Why a read failed, in the words the table uses."""
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    tail = lines[-1][:200] if lines else ""
    program = command.split()[0]
    if result.exited == 127:
        return f"no such command: {program}"
    if "No such file or directory" in tail:
        return "no such file"
    if re.search(r"permission denied|not permitted", tail, re.IGNORECASE):
        return f"no permission: {tail}"
    return f"{program} failed (exit {result.exited}): {tail}"


def summarize_agent(found: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The agent's ``--discover`` output as (what, value) found and (what, why) missing, for
    every source it reports, known or not (a new source shows up without a change here)."""
    present: list[tuple[str, str]] = []
    absent: list[tuple[str, str]] = []
    for name, facts in sorted(found.items()):
        if name == "gpu":
            continue  # GPUs are listed from nvidia-smi itself, with their names
        if facts is None:
            absent.append((name, "not on this host (the agent's source finds nothing to read)"))
        elif isinstance(facts, dict) and "error" in facts:
            absent.append((name, f"unreadable: {facts['error']}"))
        elif name == "processes":
            present.append(("vLLM processes", deploy.describe_processes(facts)))
        elif name == "thermal":
            zones = facts.get("details") or []
            if not zones:
                absent.append(("thermal zones", "/sys/class/thermal has no zones"))
            else:
                present.append(("thermal zones", ", ".join(
                    f"{z['name']} (trip {z['trip_point_c']:g} °C)" if z.get("trip_point_c") is not None
                    else f"{z['name']} (no trip point)" for z in zones)))
        elif name == "freq" and not facts.get("policies"):
            absent.append(("cpufreq", "/sys/devices/system/cpu/cpufreq has no policies"))
        elif name == "freq":
            policies = facts["policies"]
            average = [cpu for cpu, source in policies.items() if source == "cpuinfo_avg_freq"]
            present.append(("cpufreq", f"{len(policies)} policies; cpuinfo_avg_freq on "
                            f"{len(average) if average else 'none'}"
                            + (f" ({', '.join(average)})" if 0 < len(average) < len(policies) else "")
                            + ("" if len(average) == len(policies) else "; scaling_cur_freq on the rest")))
        elif name == "hwmon":
            sensors = facts.get("sensors") or []
            present.append(("hwmon", f"{len(sensors)} sensors" + (f": {', '.join(sensors[:8])}" if sensors else "")
                            + (" …" if len(sensors) > 8 else "")))
        elif not facts:
            present.append((name, "available (read when sampling)"))
        else:
            present.append((name, json.dumps(facts, sort_keys=True)[:300]))
    return present, absent


# -- where the setting's file is, and its value ----------------------------------------------

VLLM_PACKAGE = re.compile(r"/(?:site|dist)-packages/vllm/(?P<rel>.+)$")


def file_in_vllm(template: str) -> str | None:
    """The setting's file relative to the vllm package, whether the stock config names it
    ``{vllm}/…`` or by an installed path (``…/dist-packages/vllm/…``); None for other files."""
    if template.startswith("{vllm}/"):
        return template[len("{vllm}/"):]
    match = VLLM_PACKAGE.search(template)
    return match["rel"] if match else None


def current_value(text: str, anchor: str, replacement: str) -> str | None:
    """The value the file holds now: the anchor's single match read through the
    replacement's ``{value}`` (``busy_loop_s: float = 1`` -> ``1``)."""
    matches = anchor_matches(text, anchor)
    if len(matches) != 1:
        return None
    prefix, _, suffix = replacement.partition("{value}")
    found = matches[0]
    if found.startswith(prefix) and found.endswith(suffix) and len(found) >= len(prefix) + len(suffix):
        return found[len(prefix):len(found) - len(suffix)]
    return None


def systemd_service(cgroup: str) -> str | None:
    """The systemd service a process's cgroup names: ``NAME.service``, or ``--user
    NAME.service`` under a user's manager; None outside any service."""
    match = re.search(r"/([^/\s]+\.service)$", cgroup, re.MULTILINE)
    if not match:
        return None
    return f"--user {match.group(1)}" if "/user@" in cgroup else match.group(1)


def bind_mount_of(path: str, mounts: tuple[Mount, ...]) -> tuple[Mount, str] | None:
    """The bind mount holding ``path`` (a path inside the container) and the path on the host."""
    for mount in sorted(mounts, key=lambda m: -len(m.destination)):
        if mount.kind == "bind" and (path == mount.destination or path.startswith(mount.destination.rstrip("/") + "/")):
            return mount, mount.source + path[len(mount.destination.rstrip("/")):]
    return None


# -- presets ---------------------------------------------------------------------------------

KEPT_ENV = re.compile(r"^(VLLM_\w+|HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|HF_HOME|CUDA_VISIBLE_DEVICES|OMP_NUM_THREADS)$")
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW", re.IGNORECASE)


def replayed_env(environ: dict[str, str], inherited: dict[str, str]) -> dict[str, str]:
    """The server's variables a restart must set again: vLLM's and the offline/device ones,
    minus those the start inherits anyway; never anything named like a secret."""
    return {name: value for name, value in sorted(environ.items())
            if KEPT_ENV.match(name) and not SECRET_NAME.search(name) and inherited.get(name) != value}


def ere(text: str) -> str:
    """``text`` as a POSIX extended regex matching itself (for pgrep/pkill -f)."""
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


def process_regex(argv: tuple[str, ...]) -> str:
    """Matches the server's whole command line from its start, so the shell running pkill
    (whose command line starts elsewhere) never matches itself."""
    return "^" + ere(" ".join(argv)) + "$"


def stop_by_pattern(prefix: str, pattern: str) -> str:
    """SIGTERM the server (vLLM then ends its engine and workers), wait up to STOP_WAIT_S
    until it is gone, then SIGKILL; ``prefix`` runs pkill/pgrep where the server lives."""
    return (f"p={shlex.quote(pattern)}; {prefix}pkill -TERM -f \"$p\" || true; for i in $(seq {STOP_WAIT_S * 2}); do "
            f"{prefix}pgrep -f \"$p\" > /dev/null || exit 0; sleep 0.5; done; "
            f"echo 'server still running after {STOP_WAIT_S} s: SIGKILL' >&2; {prefix}pkill -KILL -f \"$p\"; true")


def as_template(command: str) -> str:
    """A server command as the config holds it: a Python format string, braces doubled."""
    return command.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class Place:
    """What the preset needs to know about a server, found on its host."""

    server: Server
    file: str  # the setting's file as the server sees it
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # variables its restart must set again
    unit: str | None = None  # the systemd unit it is the main process of ("--user NAME" for a user unit)
    log: str = "/tmp/thermab-vllm-server.log"


@dataclass(frozen=True)
class Preset:
    name: str
    reason: str
    file: str  # where thermab patches it: in the container, or on the host
    settings: dict = field(default_factory=dict)  # container_engine, container, server


def choose_preset(place: Place) -> Preset:
    """The lifecycle preset of config/README.md that fits how this server runs."""
    server, process = place.server, place.server.process
    container = server.container
    if container is None:
        if place.unit:
            scope, _, unit = place.unit.rpartition(" ")
            systemctl = f"systemctl {scope + ' ' if scope else ''}"
            return Preset("venv", f"the server (pid {process.pid}) runs on the host, as the main process of systemd "
                          f"unit {unit}: the file is patched in place, the unit stopped and started",
                          place.file, {"server": {"stop": as_template(f"{systemctl}stop {shlex.quote(unit)}"),
                                                  "start": as_template(f"{systemctl}start {shlex.quote(unit)}")}})
        env = "".join(f"{name}={shlex.quote(value)} " for name, value in place.env)
        cd = f"cd {shlex.quote(place.cwd)} && " if place.cwd else ""
        start = (f"{cd}{{ {env}setsid nohup {shlex.join(process.argv)} >> {shlex.quote(place.log)} 2>&1 "
                 f"< /dev/null & }}")
        return Preset("venv", f"the server (pid {process.pid}) runs on the host, outside any container: the "
                      "file is patched in place; the server is stopped by its command line and started again "
                      f"with it (detached, from its working directory, logging to {place.log})",
                      place.file, {"server": {"stop": as_template(stop_by_pattern("", process_regex(process.argv))),
                                              "start": as_template(start)}})
    engine, name = container.engine, shlex.quote(container.name)
    bound = bind_mount_of(place.file, container.mounts)
    project, service = container.label("com.docker.compose.project"), container.label("com.docker.compose.service")
    workdir = container.label("com.docker.compose.project.working_dir")
    if bound:
        mount, on_host = bound
        if project and service and workdir:
            files = "".join(f" -f {shlex.quote(f)}" for f in
                            (container.label("com.docker.compose.project.config_files") or "").split(",") if f)
            compose = f"{engine} compose --project-directory {shlex.quote(workdir)} -p {shlex.quote(project)}{files}"
            return Preset("compose bind mount", f"the file is bind-mounted into container {container.name} from "
                          f"{mount.source} and Compose manages the container (project {project}, service "
                          f"{service}): a patch inside would be lost on recreate, so the host's file is patched "
                          "and `compose up --force-recreate` picks it up",
                          on_host, {"server": {"stop": as_template(f"{compose} stop {shlex.quote(service)}"),
                                               "start": as_template(f"{compose} up -d --force-recreate "
                                                                    f"{shlex.quote(service)}")}})
        return Preset("docker restart", f"the file is bind-mounted into container {container.name} from "
                      f"{mount.source}: it is patched on the host; the container is stopped and started",
                      on_host, {"server": {"stop": as_template(f"{engine} stop -t {STOP_WAIT_S} {name}"),
                                           "start": as_template(f"{engine} start {name}")}})
    inside = {"container_engine": engine, "container": container.name}
    if server.main:
        compose_note = (f"; Compose manages it (project {project}): a run uses {engine} stop/start, so do not "
                        "`compose up --force-recreate` during one") if project else ""
        return Preset("docker restart", f"the server is container {container.name}'s own process (restart policy "
                      f"{container.restart}): the file is patched inside the container, whose filesystem "
                      f"{engine} stop/start keeps{compose_note}",
                      place.file, dict(inside, server={"stop": as_template(f"{engine} stop -t {STOP_WAIT_S} {name}"),
                                                       "start": as_template(f"{engine} start {name}")}))
    exec_prefix = f"{engine} exec {name} "
    options = "".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in place.env)
    workdir_option = f" -w {shlex.quote(place.cwd)}" if place.cwd else ""
    return Preset("exec-serve", f"the server was started in container {container.name} by `{engine} exec` (the "
                  "container's own process is something else): the file is patched inside the container, the "
                  "server stopped by its command line and started again the same way",
                  place.file, dict(inside, server={
                      "stop": as_template(stop_by_pattern(exec_prefix, process_regex(process.argv))),
                      "start": as_template(f"{engine} exec -d{workdir_option}{options} {name} "
                                           f"{shlex.join(process.argv)}")}))


# -- the config ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostPlan:
    target: Target
    preset: Preset
    python: str | None  # None where the file is patched on the host, outside the container
    value: str | None
    zones: tuple[str, ...] = ()


def build_config(plans: list[HostPlan], head: str, endpoint: str, model: str | None, setting: dict,
                 arms: dict, options: dict, cluster: str = CLUSTER) -> tuple[dict, dict]:
    """The config and its comments (by key path), from what was found. Workers come first
    (start order), the head last."""
    files = {p.preset.file for p in plans}
    rel = file_in_vllm(setting["file"])
    if len(files) == 1:
        file, file_note = files.pop(), "found on every host"
    elif rel and all(p.python for p in plans):
        file, file_note = "{vllm}/" + rel, "under each host's installed vllm (the paths differ: " + \
            ", ".join(f"{p.target.name} {p.preset.file}" for p in plans) + ")"
    else:
        raise Question("the setting's file differs between hosts (" + ", ".join(
            f"{p.target.name}: {p.preset.file}" for p in plans) + "), and setting.file is one path for all: "
            "make them the same, or discover the hosts one at a time")
    unread = [p.target.name for p in plans if p.value is None]
    if unread:
        raise Question(f"the anchor's match on {', '.join(unread)} does not read as setting.replacement with "
                       "{value} in it: fix the setting (--setting-from) so both describe the same text")
    values = {p.value for p in plans}
    if len(values) != 1:
        raise Question("the hosts hold different values of the setting (" + ", ".join(
            f"{p.target.name}: {p.value}" for p in plans) + "): restore the stock file where it was patched")
    stock = values.pop()
    reference, *others = arms
    ordered = [p for p in plans if p.target.name != head] + [p for p in plans if p.target.name == head]
    head_zones = next(p.zones for p in plans if p.target.name == head)
    timeline_zone = "TSOC" if "TSOC" in head_zones or not head_zones else head_zones[0]
    hosts, comments = {}, {}
    for plan in ordered:
        where = ("clusters", cluster, "hosts", plan.target.name)
        entry: dict = {"transport": plan.target.transport}
        if plan.target.transport == "ssh":
            entry.update(address=plan.target.address, port=plan.target.port)
            if plan.target.user:
                entry["user"] = plan.target.user
            for key in ("key_file", "known_hosts", "jump"):
                if options.get(key):
                    entry[key] = options[key]
            entry["host_key_policy"] = "strict"
        entry.update({k: v for k, v in plan.preset.settings.items() if k != "server"})
        if plan.python:
            entry["python"] = plan.python
        entry["server"] = plan.preset.settings["server"]
        hosts[plan.target.name] = entry
        comments[where] = f"preset: {plan.preset.name}. {plan.preset.reason}."
    found = {
        "order": "".join(arms),
        "repeats": 1,
        "setting": {"name": setting["name"], "method": "file", "file": file, "anchor": setting["anchor"],
                    "replacement": setting["replacement"]},
        "arms": {reference: dict(arms[reference], value=stock),
                 **{name: dict(arms[name]) for name in others}},
        "clusters": {cluster: {"head": head, "endpoint": endpoint, "end_state": "restarted", "hosts": hosts}},
    }
    # the schema's defaults (the study's timings, load, intervals), written out in full
    defaults = thermab_config.validate(found)
    config = {
        **{key: found[key] for key in ("order", "repeats", "setting", "arms")},
        "timings": defaults["timings"],
        "load": {**defaults["load"], "model": model},
        "monitor": {"process_pattern": PROCESS_PATTERN, "intervals": defaults["monitor"]["intervals"]},
        "analysis": dict(defaults["analysis"], timeline_zone=timeline_zone),
        "clusters": found["clusters"],
    }
    comments.update({
        ("setting", "file"): f"{file_note}; the anchor matches once there",
        ("arms", reference): "the value every host holds now",
        ("timings",): "the study's: 10-min baseline, 30-min loads; lower them here for a first trial "
                      "(e.g. load_s: 300)",
        ("load", "model"): "the id /v1/models gave" if model else "null: the first id /v1/models gives at run time",
        ("monitor", "process_pattern"): "the API server by its command, the engine and workers by vLLM's process "
                                        "titles (plain `vllm` would also match a config named after vLLM)",
        ("analysis", "timeline_zone"): f"zones on {head}: {', '.join(head_zones)}" if head_zones
        else f"no thermal zones on {head}: the thermal tables will be empty",
        ("clusters", cluster, "end_state"): "after the run the server runs again on the original file, as found",
    })
    for name in others:
        comments[("arms", name)] = (f"TODO: the {arms[name]['label']} arm's value is yours to choose "
                                    f"({arms[name]['value']} is the study's)")
    return config, comments


def scalar(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text[:-len("\n...")].strip() if text.endswith("\n...") else text


def render_yaml(config: dict, comments: dict, header: str) -> str:
    """Block YAML with a comment above each key that has one."""
    lines = ["# " + line if line else "#" for line in header.splitlines()]

    def emit(mapping: dict, path: tuple, indent: int) -> None:
        pad = " " * indent
        for key, value in mapping.items():
            note = comments.get(path + (key,))
            if note:
                lines.extend(pad + "# " + line for line in textwrap.wrap(note, 96 - indent, break_on_hyphens=False))
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{scalar(key)}:")
                emit(value, path + (key,), indent + 2)
            else:
                lines.append(f"{pad}{scalar(key)}: {scalar(value)}")

    emit(config, (), 0)
    return "\n".join(lines) + "\n"


def render_table(found: list[Fact], missing: list[Fact]) -> str:
    """What was found, each with its source in brackets; then what was not, with why."""
    out = []
    for title, facts in (("found [source]:", found), ("not found:", missing)):
        if facts:
            host_w, what_w = max(len(f.host) for f in facts), max(len(f.what) for f in facts)
            out += ([""] if out else []) + [title] + [
                f"  {f.host:<{host_w}}  {f.what:<{what_w}}  {f.value}" + (f"  [{f.source}]" if f.source else "")
                for f in facts]
    return "\n".join(out)


# -- the edge: reading hosts -------------------------------------------------------------------

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
            self.lack("vLLM server", f"pid {process.pid} runs in a container that no docker/podman here lists "
                      f"(another engine or daemon): {process.command[:160]}")
        for server in servers:
            container = server.container
            binds = ", ".join(f"{m.source}:{m.destination}{'' if m.writable else ':ro'}"
                              for m in (container.mounts if container else ()) if m.kind == "bind")
            detail = (f"; {container.engine}, image {container.image}, restart policy {container.restart}, "
                      f"{'its own process' if server.main else 'started by exec'}"
                      + (f", bind mounts {binds}" if binds else "")) if container else ""
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
            self.lack("server environment", f"{where}/environ: {why(environ, 'cat')}; add the server's variables "
                      "to `start` by hand")
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

    def gpus(self) -> None:
        command = "nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader"
        result = self.run(command)
        if result.ok and result.stdout.strip():
            for line in result.stdout.strip().splitlines():
                self.note("GPU", line.strip(), "nvidia-smi --query-gpu")
        else:
            self.lack("GPUs", why(result, command) if not result.ok else "nvidia-smi lists none")

    def clock(self) -> None:
        offsets, problems = clock_offsets([self.host])
        if self.host.name in problems:
            self.lack("clock offset", problems[self.host.name])
            return
        offset = offsets[self.host.name]
        self.note("clock offset", f"{offset.offset_s:+.4f} ± {offset.uncertainty_s:.4f} s (host minus this machine)",
                  f"date +%s.%N, the shortest of {offset.samples} round trips")


def host_spec(target: Target, options: dict) -> HostSpec:
    settings: dict = {"transport": target.transport}
    if target.transport == "ssh":
        settings.update(address=target.address, port=target.port)
        if target.user:
            settings["user"] = target.user
        settings.update({k: options[k] for k in ("key_file", "known_hosts", "jump") if options.get(k)})
    return HostSpec(target.name, CLUSTER, target.transport, settings)


def pick_head(targets: list[Target], chosen: dict[str, Server], head: str | None) -> str:
    names = [t.name for t in targets]
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


def load_setting(path: Path) -> tuple[dict, dict]:
    try:
        stock = thermab_config.load(path)
    except FileNotFoundError:
        raise UsageError(f"--setting-from {path}: no such file") from None
    except ConfigError as error:
        raise UsageError(f"--setting-from {path}: {str(error).splitlines()[-1].strip()}") from None
    if stock["setting"]["method"] != "file":
        raise UsageError(f"--setting-from {path}: setting.method is {stock['setting']['method']}; "
                         "discover checks settings patched in a file")
    return stock["setting"], stock["arms"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="thermab discover", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:5]))
    parser.add_argument("hosts", nargs="+", metavar="NAME=URL", help="ssh://[user@]host[:port] or local://")
    parser.add_argument("--head", help="the host serving the API (default: the one named head, or the one "
                                       "server not started --headless)")
    parser.add_argument("--jump", help="jump host for every SSH host, user@host:port")
    parser.add_argument("--key-file", help="private key for SSH (default: the ssh-agent)")
    parser.add_argument("--known-hosts", help="pinned host keys (default ~/.ssh/known_hosts)")
    parser.add_argument("--container", action="append", default=[], metavar="[HOST=]NAME|auto|none",
                        help="which container's server to measure (auto: the only one; none: a server outside "
                             "containers); repeat with HOST= per host")
    parser.add_argument("--endpoint", help="the OpenAI base URL (default: the head's address and its server's "
                                           "--port); its port also picks the head's server among several")
    parser.add_argument("--cluster", default=CLUSTER, help=f"the cluster's name in the config (default {CLUSTER})")
    parser.add_argument("--setting-from", type=Path, default=STOCK_SETTING,
                        help="the config whose setting and arms to use (default: config/config.yaml)")
    parser.add_argument("-o", "--output", type=Path, help="write the config here (default: stdout)")
    return parser.parse_args(argv)


def survey(args: argparse.Namespace, probes: dict[str, HostProbe], setting: dict,
           arms: dict) -> tuple[list[str], str | None]:
    """Read every host; returns the questions for the user and the config's text, None
    unless a run could use it (the probes hold what was found and what was not)."""
    targets = [probe.target for probe in probes.values()]
    endpoint_port = None
    if args.endpoint:
        match = re.match(r"^https?://[^/:]+:(\d+)", args.endpoint)
        endpoint_port = int(match.group(1)) if match else (443 if args.endpoint.startswith("https") else 80)
    questions: list[str] = []
    chosen: dict[str, Server] = {}
    for target in targets:
        probe = probes[target.name]
        probe.note("reached", target.url, "SSH, host key pinned" if target.transport == "ssh" else "this machine")
        servers = probe.servers()
        try:
            server = choose_server(target.name, servers, args.choices[target.name], endpoint_port)
        except Question as question:
            questions.append(str(question))
            continue
        if server is None and servers:
            probe.lack("vLLM server", f"none matches --container {args.choices[target.name]}: "
                       + "; ".join(s.label for s in servers))
        if server is not None:
            chosen[target.name] = server
    if questions or len(chosen) != len(targets):
        return questions, None
    try:
        head = pick_head(targets, chosen, args.head)
    except Question as question:
        return [str(question)], None
    plans = []
    for target in targets:
        probe, server = probes[target.name], chosen[target.name]
        probe.note("serve command", server.process.command, f"/proc/{server.process.pid}/cmdline")
        place = probe.place(server)
        cwd, environ = probe.view(server)
        found = probe.vllm(server, place, cwd)
        located = probe.setting_file(place, found[2] if found else None, setting)
        zones = probe.agent()
        probe.gpus()
        probe.clock()
        if located is None:
            continue
        inherited = dict(server.container.env) if server.container else {}
        preset = choose_preset(Place(server, located[0], cwd, tuple(replayed_env(environ, inherited).items()),
                                     probe.systemd_unit(server),
                                     f"/tmp/thermab-{args.cluster}-{target.name}-server.log"))
        probe.note("preset", preset.name, "chosen: " + preset.reason)
        # the Python matters where thermab patches inside the server's filesystem
        python = found[0] if found and preset.file == located[0] else None
        plans.append(HostPlan(target, preset, python, located[1], zones))
    if len(plans) != len(targets):
        return [], None
    endpoint, model = check_endpoint(probes[head], chosen[head], args.endpoint)
    stock = next(iter(arms.values()))["value"]
    for plan in plans:
        if plan.value is not None and plan.value != stock:
            probes[plan.target.name].lack(
                "stock value", f"{setting['name']} is {plan.value} here, not {stock} as in {args.setting_from}: "
                f"a patch left behind? The reference arm takes {plan.value}")
    try:
        config, comments = build_config(plans, head, endpoint, model, setting, arms, args.option_values,
                                        args.cluster)
    except Question as question:
        return [str(question)], None
    thermab_config.validate(config)  # what is written passes check-config, or this is a bug
    header = (f"Written by: thermab discover {shlex.join(args.argv)}\n"
              "Every value was found on the hosts (the table printed beside it gives each one's source)\n"
              "or is the study's default; only the arm values are yours to choose (TODO). Then:\n"
              "  python -m thermab check-config FILE\n"
              "  snakemake --cores 1 all --configfile FILE")
    return [], render_yaml(config, comments, header)


def check_endpoint(probe: HostProbe, server: Server, given: str | None) -> tuple[str, str | None]:
    """The endpoint (given, or the head's address and its server's port) and the model
    its /v1/models names first, or None when it does not answer."""
    target = probe.target
    address = "127.0.0.1" if target.transport == "local" else target.address
    endpoint = (given or f"http://{address}:{server.port}").rstrip("/")
    listen = option(server.process.argv, "--host")
    if not given and target.transport == "ssh" and listen in ("127.0.0.1", "localhost") \
            and address not in ("127.0.0.1", "localhost"):
        probe.lack("endpoint", f"the server listens on {listen} only: give --endpoint (e.g. an SSH tunnel's)")
    try:
        served = server_api.models(endpoint)
    except (OSError, ValueError, KeyError) as error:
        probe.lack("endpoint", f"{endpoint}/v1/models does not answer: {getattr(error, 'reason', error)}")
        return endpoint, None
    probe.note("endpoint", f"{endpoint}: /v1/models answers {', '.join(served) or 'no model'}",
               f"GET {endpoint}/v1/models")
    return endpoint, served[0] if served else None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.argv = argv
    args.option_values = {"key_file": args.key_file, "known_hosts": args.known_hosts, "jump": args.jump}
    probes: dict[str, HostProbe] = {}
    try:
        targets = [parse_target(text) for text in args.hosts]
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise UsageError(f"a host name is given twice: {' '.join(args.hosts)}")
        if args.head and args.head not in names:
            raise UsageError(f"--head {args.head}: not one of the hosts ({', '.join(names)})")
        jump_port = (args.jump or "").rpartition("@")[2].partition(":")[2]
        if args.jump and (not JUMP.fullmatch(args.jump) or (jump_port and port_problem(jump_port))):
            raise UsageError(f"--jump {redact_url(args.jump)}: expected user@host:port (port 1-65535)")
        if not re.match(r"^[A-Za-z0-9_-]+$", args.cluster) or args.cluster == "fleet":
            raise UsageError(f"--cluster {args.cluster}: letters, digits, _ and - (not 'fleet')")
        if args.endpoint and endpoint_problem(args.endpoint):
            raise UsageError(f"--endpoint {redact_url(args.endpoint)}: {endpoint_problem(args.endpoint)}")
        args.choices = parse_containers(args.container, names)
        setting, arms = load_setting(args.setting_from)
        probes = {t.name: HostProbe(t, Host(host_spec(t, args.option_values))) for t in targets}
        with contextlib.redirect_stdout(sys.stderr):  # the transports' progress stays off the YAML
            questions, text = survey(args, probes, setting, arms)
    except (UsageError, TransportError) as error:
        print(f"thermab discover: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        for probe in probes.values():
            probe.host.close()
    found = [f for p in probes.values() for f in p.found]
    missing = [f for p in probes.values() for f in p.missing]
    print(render_table(found, missing), file=sys.stderr)
    if questions:
        print("", *(f"thermab discover: {question}" for question in questions), sep="\n", file=sys.stderr)
        return 2
    if text is None:
        print("\nthermab discover: no config written: a run needs what 'not found' lists above", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_text(text)
        print(f"\nwrote {args.output}; check it: python -m thermab check-config {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
