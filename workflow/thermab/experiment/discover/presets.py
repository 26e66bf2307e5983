"""The lifecycle preset of config/README.md that fits how a server runs (pure): one
function per preset, and ``choose_preset`` picking among them by what its host showed."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from thermab.experiment.discover.containers import bind_mount_of
from thermab.experiment.discover.servers import Server

STOP_WAIT_S = 60


KEPT_ENV = re.compile(r"^(VLLM_\w+|HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|HF_HOME|CUDA_VISIBLE_DEVICES|OMP_NUM_THREADS)$")
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW", re.IGNORECASE)


def replayed_env(environ: dict[str, str], inherited: dict[str, str]) -> dict[str, str]:
    """The server's variables a restart must set again: vLLM's and the offline/device ones,
    minus those the start inherits anyway; never anything named like a secret."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if KEPT_ENV.match(name) and not SECRET_NAME.search(name) and inherited.get(name) != value
    }


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
    return (
        f'p={shlex.quote(pattern)}; {prefix}pkill -TERM -f "$p" || true; for i in $(seq {STOP_WAIT_S * 2}); do '
        f'{prefix}pgrep -f "$p" > /dev/null || exit 0; sleep 0.5; done; '
        f"echo 'server still running after {STOP_WAIT_S} s: SIGKILL' >&2; {prefix}pkill -KILL -f \"$p\"; true"
    )


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
    container = place.server.container
    if container is None:
        return systemd_unit(place) if place.unit else host_process(place)
    if bind_mount_of(place.file, container.mounts):
        compose = (
            container.label("com.docker.compose.project"),
            container.label("com.docker.compose.service"),
            container.label("com.docker.compose.project.working_dir"),
        )
        return compose_bind_mount(place) if all(compose) else bind_mounted_restart(place)
    return container_restart(place) if place.server.main else exec_serve(place)


def systemd_unit(place: Place) -> Preset:
    """venv: the server is a systemd unit's main process; the unit is stopped and started."""
    scope, _, unit = place.unit.rpartition(" ")
    systemctl = f"systemctl {scope + ' ' if scope else ''}"
    return Preset(
        "venv",
        f"the server (pid {place.server.process.pid}) runs on the host, as the main process of "
        f"systemd unit {unit}: the file is patched in place, the unit stopped and started",
        place.file,
        {
            "server": {
                "stop": as_template(f"{systemctl}stop {shlex.quote(unit)}"),
                "start": as_template(f"{systemctl}start {shlex.quote(unit)}"),
            }
        },
    )


def host_process(place: Place) -> Preset:
    """venv: a process on the host outside any unit; stopped by its command line, started
    again with it (detached, from its working directory, its variables set again)."""
    process = place.server.process
    env = "".join(f"{name}={shlex.quote(value)} " for name, value in place.env)
    cd = f"cd {shlex.quote(place.cwd)} && " if place.cwd else ""
    start = f"{cd}{{ {env}setsid nohup {shlex.join(process.argv)} >> {shlex.quote(place.log)} 2>&1 < /dev/null & }}"
    return Preset(
        "venv",
        f"the server (pid {process.pid}) runs on the host, outside any container: the "
        "file is patched in place; the server is stopped by its command line and started again "
        f"with it (detached, from its working directory, logging to {place.log})",
        place.file,
        {
            "server": {
                "stop": as_template(stop_by_pattern("", process_regex(process.argv))),
                "start": as_template(start),
            }
        },
    )


def compose_bind_mount(place: Place) -> Preset:
    """compose bind mount: the host's file is patched and Compose recreates the container."""
    container = place.server.container
    mount, on_host = bind_mount_of(place.file, container.mounts)
    engine = container.engine
    project, service = container.label("com.docker.compose.project"), container.label("com.docker.compose.service")
    workdir = container.label("com.docker.compose.project.working_dir")
    files = "".join(
        f" -f {shlex.quote(f)}"
        for f in (container.label("com.docker.compose.project.config_files") or "").split(",")
        if f
    )
    compose = f"{engine} compose --project-directory {shlex.quote(workdir)} -p {shlex.quote(project)}{files}"
    return Preset(
        "compose bind mount",
        f"the file is bind-mounted into container {container.name} from "
        f"{mount.source} and Compose manages the container (project {project}, service "
        f"{service}): a patch inside would be lost on recreate, so the host's file is patched "
        "and `compose up --force-recreate` picks it up",
        on_host,
        {
            "server": {
                "stop": as_template(f"{compose} stop {shlex.quote(service)}"),
                "start": as_template(f"{compose} up -d --force-recreate {shlex.quote(service)}"),
            }
        },
    )


def bind_mounted_restart(place: Place) -> Preset:
    """docker restart of a bind-mounted file: patched on the host, the container restarted."""
    container = place.server.container
    mount, on_host = bind_mount_of(place.file, container.mounts)
    engine, name = container.engine, shlex.quote(container.name)
    return Preset(
        "docker restart",
        f"the file is bind-mounted into container {container.name} from "
        f"{mount.source}: it is patched on the host; the container is stopped and started",
        on_host,
        {
            "server": {
                "stop": as_template(f"{engine} stop -t {STOP_WAIT_S} {name}"),
                "start": as_template(f"{engine} start {name}"),
            }
        },
    )


def container_restart(place: Place) -> Preset:
    """docker restart: the server is the container's own process; patched inside, whose
    filesystem stop/start keeps."""
    container = place.server.container
    engine, name = container.engine, shlex.quote(container.name)
    project = container.label("com.docker.compose.project")
    compose_note = (
        (
            f"; Compose manages it (project {project}): a run uses {engine} stop/start, so do not "
            "`compose up --force-recreate` during one"
        )
        if project
        else ""
    )
    return Preset(
        "docker restart",
        f"the server is container {container.name}'s own process (restart policy "
        f"{container.restart}): the file is patched inside the container, whose filesystem "
        f"{engine} stop/start keeps{compose_note}",
        place.file,
        {
            "container_engine": engine,
            "container": container.name,
            "server": {
                "stop": as_template(f"{engine} stop -t {STOP_WAIT_S} {name}"),
                "start": as_template(f"{engine} start {name}"),
            },
        },
    )


def exec_serve(place: Place) -> Preset:
    """exec-serve: the server was started in the container by ``exec``; stopped by its
    command line and started again the same way."""
    container, process = place.server.container, place.server.process
    engine, name = container.engine, shlex.quote(container.name)
    exec_prefix = f"{engine} exec {name} "
    options = "".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in place.env)
    workdir_option = f" -w {shlex.quote(place.cwd)}" if place.cwd else ""
    return Preset(
        "exec-serve",
        f"the server was started in container {container.name} by `{engine} exec` (the "
        "container's own process is something else): the file is patched inside the container, the "
        "server stopped by its command line and started again the same way",
        place.file,
        {
            "container_engine": engine,
            "container": container.name,
            "server": {
                "stop": as_template(stop_by_pattern(exec_prefix, process_regex(process.argv))),
                "start": as_template(f"{engine} exec -d{workdir_option}{options} {name} {shlex.join(process.argv)}"),
            },
        },
    )
