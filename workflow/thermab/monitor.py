"""Deploy, start, check, stop and pull the telemetry agent on a host.

The agent (``agent.py``, stdlib only) is copied to ``<agent_dir>/<session>/`` on the host
and started detached (``setsid nohup``), so it survives the SSH session and the Snakemake
job that started it.  A session is one run directory (cluster + order): restarting the
agent for the same session appends to the same files."""

from __future__ import annotations

import csv
import io
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from thermab import agent as agent_module
from thermab.host import Host

AGENT_SOURCE = Path(agent_module.__file__)


def session_dir(host: Host, session: str) -> str:
    if host.spec.simulated:
        return host.path(f"/var/lib/thermab-agent/{session}")
    return f"{host.spec.settings.get('agent_dir', '/tmp/thermab-agent')}/{session}"


def _python(host: Host) -> str:
    return shlex.quote(sys.executable) if host.spec.transport == "local" else "python3"


def agent_pid(host: Host, session: str) -> int | None:
    """The pid of this session's agent if it is running, else None."""
    directory = shlex.quote(session_dir(host, session))
    result = host.run(
        f"pid=$(cat {directory}/agent.pid 2>/dev/null) && kill -0 \"$pid\" 2>/dev/null "
        f"&& grep -q agent.py /proc/$pid/cmdline && echo $pid", check=False)
    return int(result.stdout) if result.ok and result.stdout.strip().isdigit() else None


def start_agent(host: Host, session: str, settings: dict) -> int:
    """Start the agent unless it already runs; returns its pid."""
    running = agent_pid(host, session)
    if running:
        return running
    directory = session_dir(host, session)
    host.run(f"mkdir -p {shlex.quote(directory)}")
    # paths relative to the agent's working directory (the session directory), so an
    # agent_dir given relative (to the home over SSH, or to the controller's directory) works
    settings = dict(settings, out_dir=".", stop_file="stop")
    if host.spec.simulated:
        # a simulated node's sysfs, and its /proc with its processes' GB10 CPU (thermab.sim.cpu)
        settings["sys_root"] = str(host.spec.root)
        settings["proc_root"] = str(host.spec.root / "proc")
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "agent-config.json"
        config_path.write_text(json.dumps(settings, indent=1))
        host.transport.put(config_path, f"{directory}/agent-config.json")
        host.transport.put(AGENT_SOURCE, f"{directory}/agent.py")
    quoted = shlex.quote(directory)
    # only the agent goes to the background, with every stream redirected, so the
    # transport's command returns at once instead of waiting on the agent's pipes
    result = host.run(
        f"cd {quoted} && rm -f stop && {{ setsid nohup {_python(host)} agent.py --config agent-config.json "
        f">> agent.log 2>&1 < /dev/null & echo $! > agent.pid; }} && cat agent.pid")
    return int(result.stdout.strip())


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


def latest(host: Host, session: str, source: str = "thermal") -> dict[str, float]:
    """The newest value of each sensor of one source, read from the tail of its CSV."""
    path = shlex.quote(f"{session_dir(host, session)}/{source}.csv")
    result = host.run(f"tail -n 200 {path}", check=False)
    values: dict[str, float] = {}
    for row in csv.reader(io.StringIO(result.stdout)):
        if len(row) >= 3 and row[0] != "t" and row[2]:
            try:
                values[row[1]] = float(row[2])
            except ValueError:
                continue
    return values
