"""A simulated GB10 node: the files a real node has, under one root directory.

    python -m thermab.sim.node create ROOT --role head|worker [--cores 20] [--lost-wakeup]
                                      [--no-restart-variance]

creates (or completes, see :func:`create_node`) this tree::

    ROOT/usr/local/lib/python3.12/dist-packages/vllm/...      importable stand-in of vLLM
        .../distributed/device_communicators/shm_broadcast.py the file the arms patch
    ROOT/sys/class/thermal/thermal_zone{0..6}/                type, device/path, temp,
                                                              trip_point_0_temp
    ROOT/sys/devices/system/cpu/cpufreq/policy{0..N-1}/       scaling_cur_freq,
                                                              cpuinfo_max_freq,
                                                              cpuinfo_avg_freq (perf cores)
    ROOT/sys/class/powercap/intel-rapl:0{,:0,:1,:2}/          RAPL-like counters, and
    ROOT/sys/class/hwmon/hwmon0/                              a power meter (sim.power)
    ROOT/proc/                                                the node's /proc: its
                                                              processes' GB10 CPU
                                                              (thermab.sim.cpu), uptime
    ROOT/sim.json                                             role, process pattern,
                                                              clocks, zone and power
                                                              model, time compression,
                                                              placement, lost_wakeup,
                                                              restart_variance
    ROOT/run/                                                 pid files, logs, gpu_busy_s

The telemetry agent reads it with ``sys_root=ROOT`` and ``proc_root=ROOT/proc``; the
simulated server (:mod:`thermab.sim.vllm`) and thermal model (:mod:`thermab.sim.thermal`)
run as processes recorded in ``run/``.  Every server process carries ``--node ROOT`` on its
command line, which is how :func:`process_pattern` tells the nodes apart in the views.
The zone model is :mod:`thermab.sim.zones` with the parameters :mod:`thermab.sim.fit`
fitted to the study (calibration.json); see docs/simulation.md.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path

from thermab import cli
from thermab.errors import HostError
from thermab.sim import power_meters
from thermab.sim.zones import SOC_ZONE

ROLES = ("head", "worker")
SITE_PACKAGES = Path("usr/local/lib/python3.12/dist-packages")
SHM_BROADCAST = SITE_PACKAGES / "vllm/distributed/device_communicators/shm_broadcast.py"
VLLM_VERSION = "0.25.2.dev0+thermab.sim"  # the study's image ran vLLM 0.25.2.dev0

# GB10 ACPI zones in thermal_zone order; TSOC reads the hottest of the others.
ZONES = ("TSOC", "TS0E", "TS0P", "TS1E", "TS1P", "TGPU", "TUNC")
TRIP_POINT_MILLIC = 104800

# The zone model (thermab.sim.zones), fitted to the study's chart data by thermab.sim.fit.
CALIBRATION = json.loads(resources.files("thermab.sim").joinpath("calibration.json").read_text())
# The default config runs the study's 30-minute load phases in 60 s; the zones' time
# constants shrink by the same factor, so times to threshold scale with the windows.
TIME_COMPRESSION = 30.0
THERMAL_TICK_S = 0.5


def zone_model(role: str) -> dict:
    """The zones of a node: the head's are fitted per zone, the worker's are the head's
    with the offset and factors fitted to its published TSOC."""
    head = CALIBRATION["head"]
    if role == "head":
        return {name: dict(zone) for name, zone in head.items()}
    worker = CALIBRATION["worker"]
    return {
        name: dict(
            zone,
            ambient_c=zone["ambient_c"] + worker["ambient_offset_c"],
            c_per_core=zone["c_per_core"] * worker["gain_factor"],
            c_at_gpu_busy=zone["c_at_gpu_busy"] * worker["gain_factor"],
            tau_fast_s=zone["tau_fast_s"] * worker["time_factor"],
            tau_slow_s=zone["tau_slow_s"] * worker["time_factor"],
        )
        for name, zone in head.items()
    }


# GB10 CPU: two clusters of ten, each five Cortex-A725 then five Cortex-X925 cores.
MIN_CORES = 2  # a core in each cluster, where thread placement draws from
CLOCKS = {"performance_khz": 3900000, "efficiency_khz": 2808000, "jitter_khz": 20000}


def process_pattern(root: Path) -> str:
    """Regex over /proc/PID/cmdline matching every server process of this node only."""
    return r"vllm.*--node %s(\s|$)" % re.escape(str(Path(root).resolve()))


def performance_policies(cores: int) -> list[int]:
    """The upper half of each of the two clusters (policy5..9 and 15..19 on 20 cores)."""
    half = max(1, cores // 2)
    return [cpu for cpu in range(cores) if cpu % half >= half // 2]


def zone_dir(root: Path, index: int) -> Path:
    return Path(root) / "sys/class/thermal" / ("thermal_zone%d" % index)


def policy_dir(root: Path, cpu: int) -> Path:
    return Path(root) / "sys/devices/system/cpu/cpufreq" / ("policy%d" % cpu)


def run_dir(root: Path) -> Path:
    return Path(root) / "run"


def proc_dir(root: Path) -> Path:
    """The node's /proc: its processes' GB10 CPU accounts (thermab.sim.cpu)."""
    return Path(root) / "proc"


def _start_time(stat: str) -> str:
    return stat[stat.rindex(")") + 2 :].split()[19]


def prune(root: Path) -> None:
    """Remove the /proc views of processes that are gone (or whose pid names another one)."""
    for entry in proc_dir(root).glob("[0-9]*"):
        try:
            alive = _start_time(Path("/proc", entry.name, "stat").read_text()) == _start_time(
                (entry / "stat").read_text()
            )
        except (OSError, ValueError, IndexError):
            alive = False
        if not alive:
            shutil.rmtree(entry, ignore_errors=True)


def millidegrees(celsius: float) -> str:
    """Sysfs text at the 0.1 °C resolution GB10 reports."""
    return "%d\n" % (round(celsius * 10) * 100)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write then rename, so a reader never sees a half-written value."""
    tmp = path.with_name(".%s.tmp%d.%d" % (path.name, os.getpid(), threading.get_ident()))
    tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
    os.replace(tmp, path)


def _write_missing(path: Path, text: str) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)


def create_node(
    root: Path, role: str, cores: int = 20, lost_wakeup: bool = False, restart_variance: bool = True
) -> None:
    """Create or complete a node tree.  Idempotent: existing files are kept (the
    shm_broadcast.py may carry a patch, temperatures may be live); sim.json is rewritten.
    ``lost_wakeup``: the node's shared-memory readers can miss a notification after a
    short spin (thermab.sim.shm).  ``restart_variance``: each server start draws the
    drafter's acceptance and a step-time factor (thermab.sim.restart)."""
    if role not in ROLES:
        raise ValueError("role must be one of %s, not %r" % (ROLES, role))
    if not MIN_CORES <= cores <= cli.MAX_CORES:
        raise ValueError(
            "cores must be %d to %d (a core or more in each of the two clusters), not %r"
            % (MIN_CORES, cli.MAX_CORES, cores)
        )
    root = Path(root).resolve()
    run_dir(root).mkdir(parents=True, exist_ok=True)
    proc_dir(root).mkdir(exist_ok=True)
    if not (proc_dir(root) / "uptime").is_symlink():
        (proc_dir(root) / "uptime").symlink_to("/proc/uptime")  # start times stay comparable

    package = root / SITE_PACKAGES / "vllm"
    _write_missing(package / "__init__.py", '__version__ = "%s"\n' % VLLM_VERSION)
    _write_missing(package / "distributed/__init__.py", "")
    _write_missing(package / "distributed/device_communicators/__init__.py", "")
    template = resources.files("thermab.sim").joinpath("shm_broadcast_template.py").read_text()
    _write_missing(root / SHM_BROADCAST, template)

    zones = zone_model(role)
    idle = {name: zones[name]["ambient_c"] for name in zones}
    idle[SOC_ZONE] = max(idle.values())
    for index, name in enumerate(ZONES):
        directory = zone_dir(root, index)
        _write_missing(directory / "type", "acpitz\n")
        _write_missing(directory / "device/path", "\\_TZ_.%s\n" % name)
        _write_missing(directory / "temp", millidegrees(idle[name]))
        _write_missing(directory / "trip_point_0_temp", "%d\n" % TRIP_POINT_MILLIC)

    performance = performance_policies(cores)
    for cpu in range(cores):
        khz = CLOCKS["performance_khz" if cpu in performance else "efficiency_khz"]
        directory = policy_dir(root, cpu)
        _write_missing(directory / "cpuinfo_max_freq", "%d\n" % khz)
        _write_missing(directory / "scaling_cur_freq", "%d\n" % khz)
        if cpu in performance:
            _write_missing(directory / "cpuinfo_avg_freq", "%d\n" % khz)
    power_meters.create_tree(root, _write_missing)

    settings = {
        "role": role,
        "cores": cores,
        "performance_policies": performance,
        "process_pattern": process_pattern(root),
        "clocks": CLOCKS,
        "time_compression": TIME_COMPRESSION,
        "thermal": {"tick_s": THERMAL_TICK_S, "noise_c": CALIBRATION["noise_c"][role], "zones": zones},
        "placement": {key: CALIBRATION["placement"][key] for key in ("cluster1_share", "dwell_s")},
        "lost_wakeup": lost_wakeup,
        "restart_variance": restart_variance,
        "power": power_meters.power_model(role),
    }
    write_atomic(root / "sim.json", json.dumps(settings, indent=1) + "\n")


def load_settings(root: Path) -> dict:
    path = Path(root) / "sim.json"
    if not path.exists():
        raise FileNotFoundError(
            "%s is not a simulated node (no sim.json): create it with thermab.sim.node.create_node" % root
        )
    return json.loads(path.read_text())


def read_busy_loop_s(root: Path) -> float:
    """The default of ``SpinCondition(busy_loop_s=...)`` in the node's own file, read by
    importing it, so whatever a patch wrote there (or broke) is what the server runs."""
    path = Path(root) / SHM_BROADCAST
    spec = importlib.util.spec_from_file_location("thermab_node_shm_broadcast", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    default = inspect.signature(module.SpinCondition.__init__).parameters["busy_loop_s"].default
    return float(default)


# Daemons of a node: one pid file per name in run/, a log next to it.


def pid_file(root: Path, name: str) -> Path:
    return run_dir(root) / (name + ".pid")


def claim_pid_file(root: Path, name: str) -> None:
    write_atomic(pid_file(root, name), "%d\n" % os.getpid())


def release_pid_file(root: Path, name: str) -> None:
    path = pid_file(root, name)
    try:
        if int(path.read_text()) == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


STARTED_FD_ENV = "THERMAB_SIM_STARTED_FD"  # the pipe a detached daemon says it has started on
STARTED_WAIT_S = 60.0  # the most a detached start waits to hear; a daemon still silent then is left starting


class StartFailed(HostError):
    """A detached daemon that ended before it said it had started; the message is the last
    line of its log."""


def start_detached(root: Path, name: str, module: str, args: list[str], confirm: bool = False) -> int:
    """Run ``python -m module args`` in a new session logging to run/NAME.log; return its pid.
    ``confirm``: wait until the daemon says it has started (:func:`report_started`), and
    raise StartFailed with its log's last line where it ends before that (a setting it
    refused), rather than answer with the pid of a process already gone."""
    log_path = run_dir(root) / (name + ".log")
    read_end, write_end = os.pipe() if confirm else (None, None)
    env = dict(os.environ, **({STARTED_FD_ENV: str(write_end)} if confirm else {}))
    try:
        with open(log_path, "ab") as log:
            offset = log.tell()
            process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(write_end,) if confirm else (),
                env=env,
            )
    finally:
        if confirm:
            os.close(write_end)
    write_atomic(pid_file(root, name), "%d\n" % process.pid)
    if confirm:
        try:
            said = _read_until(read_end, STARTED_WAIT_S)
        finally:
            os.close(read_end)
        if said is not None and not said:  # the pipe closed unsaid: the daemon has ended
            code = process.wait(timeout=30)
            pid_file(root, name).unlink(missing_ok=True)
            raise StartFailed("exit status %d: %s" % (code, _last_line(log_path, offset) or "no output"))
    return process.pid


def _read_until(fd: int, timeout: float) -> bytes | None:
    """What arrives on ``fd`` before it closes or ``timeout`` passes (None: nothing by then)."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 64) if readable else None


def _last_line(path: Path, offset: int) -> str:
    with open(path, "rb") as log:
        log.seek(offset)
        lines = log.read()[-4096:].decode(errors="replace").strip().splitlines()
    return lines[-1].strip()[:300] if lines else ""


def report_started() -> None:
    """In a daemon started by ``start_detached(confirm=True)``: its checks have passed, so the
    start returns (called before it forks, so no child holds the pipe open)."""
    fd = os.environ.pop(STARTED_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"started\n")
        os.close(int(fd))
    except (OSError, ValueError):
        pass  # the starter has given up waiting


def _alive(pid: int) -> bool:
    """Running and not a zombie (a zombie has released everything but its pid)."""
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def running_pid(root: Path, name: str) -> int | None:
    """The pid in run/NAME.pid if that process is alive and names this node on its
    command line; a stale pid file (the pid reused by something else) is removed."""
    root = Path(root).resolve()
    path = pid_file(root, name)
    try:
        pid = int(path.read_text())
        cmdline = Path("/proc/%d/cmdline" % pid).read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError):
        cmdline = ""
    if not re.search(r"--node %s(\s|$)" % re.escape(str(root)), cmdline):
        path.unlink(missing_ok=True)
        return None
    return pid


def stop(root: Path, name: str, timeout: float = 10.0) -> bool:
    """SIGTERM the process in run/NAME.pid (its whole session when it leads one), wait,
    then SIGKILL.  Returns whether it was running."""
    pid = running_pid(root, name)
    if pid is None:
        return False
    try:
        leads_group = os.getpgid(pid) == pid
    except ProcessLookupError:
        leads_group = False

    def send(sig):
        try:
            os.killpg(pid, sig) if leads_group else os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def wait(seconds):
        deadline = time.monotonic() + seconds
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    send(signal.SIGTERM)
    wait(timeout)
    send(signal.SIGKILL)  # whatever is left of the session after a clean exit or the timeout
    wait(5.0)
    pid_file(root, name).unlink(missing_ok=True)
    prune(root)  # killed processes leave their /proc view behind
    return True


def main(argv=None) -> int:
    parser = cli.Parser(prog="python -m thermab.sim.node", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="create or complete a node tree")
    create.add_argument("root", type=Path)
    create.add_argument("--role", choices=ROLES, required=True)
    create.add_argument(
        "--cores", type=cli.number(MIN_CORES, cli.MAX_CORES, parse=int), default=20, help="CPUs, two clusters' worth"
    )
    create.add_argument(
        "--lost-wakeup", action="store_true", help="readers may miss a notification after a short spin (off by default)"
    )
    create.add_argument(
        "--no-restart-variance",
        dest="restart_variance",
        action="store_false",
        help="every server start runs the same drafter acceptance and step time (drawn per start by default)",
    )
    args = parser.parse_args(argv)
    create_node(args.root, args.role, args.cores, args.lost_wakeup, args.restart_variance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
