"""Deploy, start, check, stop and pull the telemetry agent on a host.

The agent (``agent.py``, stdlib only) is copied to ``<agent_dir>/<session>/`` on the host
and started detached (``setsid nohup``), so it survives the SSH session and the Snakemake
job that started it.  A session is one run directory (cluster + order): restarting the
agent for the same session appends to the same files."""

from __future__ import annotations

import base64
import csv
import io
import json
import shlex
import tempfile
import time
from pathlib import Path

from thermab.errors import HostError
from thermab.hosts.host import Host
from thermab.telemetry import agent as agent_module

AGENT_SOURCE = Path(agent_module.__file__)


def session_dir(host: Host, session: str) -> str:
    if host.spec.simulated:
        return host.path(f"/var/lib/thermab-agent/{session}")
    return f"{host.spec.settings.get('agent_dir', '/tmp/thermab-agent')}/{session}"


def _python(host: Host) -> str:
    return shlex.quote(host.agent_python)


def agent_pid(host: Host, session: str) -> int | None:
    """The pid of this session's agent if it is running, else None."""
    directory = shlex.quote(session_dir(host, session))
    result = host.run(
        f'pid=$(cat {directory}/agent.pid 2>/dev/null) && kill -0 "$pid" 2>/dev/null '
        f"&& grep -q agent.py /proc/$pid/cmdline && echo $pid",
        check=False,
    )
    return int(result.stdout) if result.ok and result.stdout.strip().isdigit() else None


def _install(host: Host, directory: str, settings: dict | None = None) -> None:
    host.run(f"mkdir -p {shlex.quote(directory)}")
    with tempfile.TemporaryDirectory() as tmp:
        if settings is not None:
            config_path = Path(tmp) / "agent-config.json"
            config_path.write_text(json.dumps(settings, indent=1))
            host.transport.put(config_path, f"{directory}/agent-config.json")
        host.transport.put(AGENT_SOURCE, f"{directory}/agent.py")


def _discover_args(host: Host, process_pattern: str | None) -> str:
    """``--discover``'s roots (a simulated node's tree and /proc view, as the agent reads
    them) and, where asked, the pattern whose processes it lists."""
    simulated = host.spec.simulated
    args = [
        "--sys-root",
        str(host.spec.root) if simulated else "/",
        "--proc-root",
        str(host.spec.root / "proc") if simulated else "/proc",
    ]
    if process_pattern is not None:
        args += ["--process-pattern", process_pattern]
    return " ".join(shlex.quote(arg) for arg in args)


def discover(host: Host, session: str, process_pattern: str | None = None) -> dict:
    """What the agent's own sources find on the host (zones with names and trip points,
    hwmon, cpufreq, GPUs, and with ``process_pattern`` the processes it matches now), so
    preflight sees exactly what the agent will log."""
    directory = session_dir(host, session)
    _install(host, directory)
    result = host.run(
        f"cd {shlex.quote(directory)} && {_python(host)} agent.py --discover {_discover_args(host, process_pattern)}"
    )
    return json.loads(result.stdout)


def discover_read_only(host: Host, process_pattern: str | None = None) -> dict:
    """The same discovery with nothing written on the host: the agent's source reaches the
    host's Python on its stdin (``python3 - --discover``), carried in the command itself
    since a transport's command has no stdin of its own (``thermab discover`` uses this)."""
    encoded = base64.b64encode(AGENT_SOURCE.read_bytes()).decode()
    result = host.run(
        f"printf %s {encoded} | base64 -d | {_python(host)} - --discover {_discover_args(host, process_pattern)}"
    )
    return json.loads(result.stdout)


def describe_processes(found: dict | None) -> str:
    """One line of what the vLLM CPU will sum on a host: each matched process by pid, title
    and CPU now (``agent.py --discover --process-pattern``), or why there is none."""
    if not found:
        return "not listed"
    if "error" in found:
        return f"not listed: {found['error']}"
    processes = found.get("processes") or []
    if not processes:
        return f"none match {found.get('pattern')!r} now (the server may not be running yet)"
    listed = "; ".join(f"{p['pid']} {p['title'][:60]} ({p['cpu_pct']:g} %)" for p in processes[:8])
    more = f"; … {len(processes) - 8} more" if len(processes) > 8 else ""
    return f"{len(processes)} match, {found.get('cpu_pct', 0):g} % CPU now: {listed}{more}"


def lowest_trip_point(hosts: dict) -> str | None:
    """Which trip point the interlock stands on, from preflight's zones of every host
    (``104.8 °C: head TSOC trip_point_0_temp (critical)``), with the trip points left out
    (0, the kernel's invalid -274000, a fan's active step) counted; None without any."""
    zones = [
        (z["trip_point_c"], host, z)
        for host, facts in hosts.items()
        for z in facts.get("zones") or []
        if z.get("trip_point_c") is not None
    ]
    ignored = sum(len(z.get("trip_points_ignored") or []) for facts in hosts.values() for z in facts.get("zones") or [])
    if not zones:
        return None
    value, host, zone = min(zones, key=lambda item: item[0])
    line = f"{value:g} °C: {host} {zone['name']} {zone.get('trip_point') or 'trip_point_0_temp'}"
    return line + (f" ({ignored} trip points left out as unset or a fan's step)" if ignored else "")


class AgentError(HostError):
    """The agent stopped as soon as it started; the message is its own last word."""


AGENT_START_S = 30  # an agent is up once it has written agent.json (after discovering its sources)


def start_agent(host: Host, session: str, settings: dict) -> int:
    """Start the agent unless it already runs, and wait until it is up; returns its pid.
    An agent that stops at once (settings it cannot use) raises AgentError with its
    message, once, rather than being started again and again."""
    running = agent_pid(host, session)
    if running:
        return running
    directory = session_dir(host, session)
    # paths relative to the agent's working directory (the session directory), so an
    # agent_dir given relative (to the home over SSH, or to the controller's directory) works
    settings = dict(settings, out_dir=".", stop_file="stop")
    if host.spec.simulated:
        # a simulated node's sysfs, and its /proc with its processes' GB10 CPU (thermab.sim.cpu)
        settings["sys_root"] = str(host.spec.root)
        settings["proc_root"] = str(host.spec.root / "proc")
    _install(host, directory, settings)
    quoted = shlex.quote(directory)
    # only the agent goes to the background, with every stream redirected, so the
    # transport's command returns at once instead of waiting on the agent's pipes
    # one round trip: start it, then wait until it has written agent.json with its pid,
    # or has exited (its last words are then the tail of agent.log)
    result = host.run(
        f"cd {quoted} && rm -f stop && {{ setsid nohup {_python(host)} agent.py --config agent-config.json "
        f">> agent.log 2>&1 < /dev/null & echo $! > agent.pid; }} && pid=$(cat agent.pid) && echo $pid && "
        f"for i in $(seq {AGENT_START_S * 10}); do "
        f"grep -qs '\"pid\": '$pid'[^0-9]' agent.json && exit 0; "
        f"kill -0 $pid 2>/dev/null || {{ echo exited; tail -n 1 agent.log; exit 0; }}; sleep 0.1; done",
        timeout=AGENT_START_S + 30,
    )
    lines = result.stdout.strip().splitlines()
    if len(lines) > 1 and lines[1] == "exited":
        said = " ".join(lines[2:]).strip() or "no message"
        raise AgentError(f"host {host.name}: the agent stopped at start: {said}")
    return int(lines[0])


def stop_agent(host: Host, session: str, timeout_s: float = 15) -> None:
    """Ask the agent to stop (SIGTERM, and the stop file for good measure) and wait."""
    directory = session_dir(host, session)
    pid = agent_pid(host, session)
    host.run(f"touch {shlex.quote(directory)}/stop", check=False)
    if pid is None:
        return
    host.run(f"kill -TERM {pid}", check=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and agent_pid(host, session):
        time.sleep(0.2)
    if agent_pid(host, session):
        host.run(f"kill -KILL {pid}", check=False)


def pull(host: Host, session: str, destination: Path) -> list[Path]:
    """Copy the session's CSV files and agent.json to the controller."""
    destination.mkdir(parents=True, exist_ok=True)
    directory = session_dir(host, session)
    listing = host.run(f"cd {shlex.quote(directory)} && ls -1 *.csv agent.json 2>/dev/null", check=False)
    pulled = []
    for name in listing.stdout.split():
        host.transport.get(f"{directory}/{name}", destination / name)
        pulled.append(destination / name)
    return pulled


def tail_rows(host: Host, session: str, source: str, lines: int = 200) -> list[tuple[float, str, float]]:
    """The last ``lines`` rows (host time, sensor, value) of one source's CSV; rows without
    a value (a missing reading) are no reading."""
    path = shlex.quote(f"{session_dir(host, session)}/{source}.csv")
    result = host.run(f"tail -n {int(lines)} {path}", check=False)
    rows = []
    for row in csv.reader(io.StringIO(result.stdout)):
        if len(row) >= 3 and row[0] != "t" and row[2]:
            try:
                rows.append((float(row[0]), row[1], float(row[2])))
            except ValueError:
                continue
    return rows


def tail_power_rows(host: Host, session: str, lines: int) -> list[tuple[float, str, float]]:
    """``tail_rows`` of every power source the agent writes (RAPL, hwmon, GPUs, IPMI: one
    file each), as ingest reads them into the ``power`` kind."""
    return [
        row
        for source in agent_module.SOURCES
        if source.kind == "power"
        for row in tail_rows(host, session, source.name, lines)
    ]


def latest_readings(host: Host, session: str, source: str = "thermal") -> dict[str, tuple[float, float]]:
    """The newest reading (host time, value) of each sensor of one source, read from the
    tail of its CSV."""
    return {sensor: (t, value) for t, sensor, value in tail_rows(host, session, source)}


def latest(host: Host, session: str, source: str = "thermal") -> dict[str, float]:
    """The newest value of each sensor of one source."""
    return {sensor: value for sensor, (_t, value) in latest_readings(host, session, source).items()}


def count_readings(host: Host, session: str, source: str, start: float, end: float, sensor: str | None = None) -> int:
    """Rows with a value in ``[start, end)`` (host time) of one source, of one sensor or all,
    counted on the host (the file may be long, the answer is one number)."""
    path = shlex.quote(f"{session_dir(host, session)}/{source}.csv")
    only = f' && $2 == "{sensor}"' if sensor else ""
    program = f'NR > 1 && $3 != "" && $1 >= {start!r} && $1 < {end!r}{only} {{ n++ }} END {{ print n + 0 }}'
    result = host.run(f"awk -F, {shlex.quote(program)} {path} 2>/dev/null || echo 0", check=False)
    return int(result.stdout.split()[0]) if result.stdout.split() else 0
