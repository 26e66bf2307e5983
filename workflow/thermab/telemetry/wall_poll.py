"""The controller's poller of the wall meters (thermab.telemetry.wall_meters) during a run.

::

    python -m thermab.telemetry.wall_poll RUN_DIR

reads the meters from ``RUN_DIR/monitor/wall.json`` (written by :func:`start`, no
credential in it) and polls each on a thread of its own at its ``interval_s`` until SIGTERM
or the stop file ``monitor/wall.stop``.  Each poll is stamped with the midpoint of its
request on the controller's clock and appended to ``monitor/{host}/wall.csv`` in the
agent's format (``t,sensor,value,reason``; sensors ``wall-N W`` and, where the meter has an
energy counter, ``wall-N mJ``), which ingest reads as power rows with no clock offset: the
counter becomes watts as the agent's counters do (a reset skipped), else the readings are
integrated.  A poll that fails, or a value that is no reading, is a row without a value and
with the reason, so a meter that stops answering leaves a gap the analysis names; the poll
goes on."""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from thermab.layout import RunDir
from thermab.telemetry.agent import power_sensor
from thermab.telemetry.wall_meters import Meter, MeterError, checked, reader

FILE = "wall"  # monitor/{host}/wall.csv: its stem, the source's name in tidy/ingest.json
HEADER = ["t", "sensor", "value", "reason"]
STOP_WAIT_S = 10.0


def record_path(run_dir: Path) -> Path:
    return RunDir(run_dir).monitor / "wall.json"


def pid_path(run_dir: Path) -> Path:
    return RunDir(run_dir).monitor / "wall.pid"


def stop_path(run_dir: Path) -> Path:
    return RunDir(run_dir).monitor / "wall.stop"


def reading_rows(meter: Meter, t: float, reading, reasons: list[str]) -> list[list]:
    """The CSV rows of one poll: the power reading and the counter (in mJ, the agent's unit),
    each value that is no reading empty with its reason."""
    watts, energy = reading.watts, reading.energy_j
    # a counter that wraps says where, in the agent's grammar (mJ:max=N counts 0..N), so ingest adds it back
    counter = power_sensor(meter.domain, "mJ", None if reading.wrap_j is None else round(reading.wrap_j * 1000) - 1)
    rows = [[f"{t:.3f}", power_sensor(meter.domain, "W"), "" if watts is None else f"{watts:.3f}", ""]]
    if watts is None:
        rows[0][3] = "; ".join(reasons) or "no power reading"
    if energy is not None:
        rows.append([f"{t:.3f}", counter, f"{energy * 1000:.1f}", ""])
    elif reasons and watts is not None:  # the counter was the value left out
        rows.append([f"{t:.3f}", counter, "", "; ".join(reasons)])
    return rows


def tail_rows(run_dir: Path, host: str, lines: int) -> list[tuple[float, str, float]]:
    """The last ``lines`` rows with a value (controller time, sensor, value) of a host's wall
    meters, as ``deploy.tail_rows`` gives the agent's: none where the host has no meter."""
    path = RunDir(run_dir).host_monitor(host) / f"{FILE}.csv"
    if not path.exists():
        return []
    with open(path, "rb") as handle:  # its end only: a week of polls is tens of MB
        handle.seek(max(0, path.stat().st_size - lines * 160))  # a failed poll's row is the longest
        text = handle.read().decode(errors="replace")
    rows = []
    for row in list(csv.reader(text.splitlines()[1:]))[-lines:]:  # the first line may be cut
        try:
            rows.append((float(row[0]), row[1], float(row[2])))
        except (IndexError, ValueError):
            continue  # the header, or a poll without a value
    return rows


def failed_rows(meter: Meter, t: float, error: str) -> list[list]:
    return [[f"{t:.3f}", power_sensor(meter.domain, "W"), "", error]]


class HostFile:
    """monitor/{host}/wall.csv, appended by the threads of the host's meters."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        self.handle = open(path, "a", newline="")  # held for the run
        self.writer = csv.writer(self.handle)
        self.lock = threading.Lock()
        if new:
            self.write([HEADER])

    def write(self, rows: list[list]) -> None:
        with self.lock:
            self.writer.writerows(rows)
            self.handle.flush()


def poll_once(meter: Meter, meter_reader, clock=time.time) -> tuple[float, list[list]]:
    """(controller time, rows) of one read: the midpoint of the request, as the clock
    offsets are measured."""
    before = clock()
    try:
        reading = meter_reader.read()
    except MeterError as error:
        t = (before + clock()) / 2
        return t, failed_rows(meter, t, str(error))
    t = (before + clock()) / 2
    reading, reasons = checked(meter, reading)
    return t, reading_rows(meter, t, reading, reasons)


def poll(meter: Meter, out: HostFile, stopping: threading.Event) -> None:
    """Poll one meter every interval_s until ``stopping``; a reader that cannot be made
    (a missing credential, pysnmp absent) is tried again at every poll, each failure a row."""
    interval = float(meter.settings.get("interval_s", 1.0))
    meter_reader = None
    next_t = time.monotonic()
    try:
        while not stopping.is_set():
            if meter_reader is None:
                try:
                    meter_reader = reader(meter)
                except MeterError as error:
                    out.write(failed_rows(meter, time.time(), str(error)))
            if meter_reader is not None:
                try:
                    out.write(poll_once(meter, meter_reader)[1])
                except Exception as error:  # a fault of ours must not end the meter's polling; its name only
                    out.write(failed_rows(meter, time.time(), f"{meter.name}: {type(error).__name__}"))
            next_t += interval
            stopping.wait(max(0.0, next_t - time.monotonic()))
            next_t = max(next_t, time.monotonic() - interval)  # a long stall is not made up in a burst
    finally:
        if meter_reader is not None:
            meter_reader.close()


def meters_from(run_dir: Path) -> list[Meter]:
    record = json.loads(record_path(run_dir).read_text())
    return [
        Meter(m["host"], m["index"], m["settings"], Path(m["sim_root"]) if m.get("sim_root") else None)
        for m in record["meters"]
    ]


def run(run_dir: Path) -> None:
    meters = meters_from(run_dir)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    files = {host: HostFile(RunDir(run_dir).host_monitor(host) / f"{FILE}.csv") for host in {m.host for m in meters}}
    threads = [
        threading.Thread(target=poll, args=(meter, files[meter.host], stopping), name=meter.domain, daemon=True)
        for meter in meters
    ]
    for thread in threads:
        thread.start()
    while not stopping.is_set():
        if stop_path(run_dir).exists():
            stopping.set()
        stopping.wait(0.5)
    for thread in threads:
        thread.join(STOP_WAIT_S)


# -- started and stopped by the run (experiment/cluster.py) ------------------------------------


def running_pid(run_dir: Path) -> int | None:
    """The poller's pid while it runs, else None."""
    try:
        pid = int(pid_path(run_dir).read_text())
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"thermab.telemetry.wall_poll" in cmdline else None


def start(run_dir: Path, meters: list[Meter]) -> int | None:
    """The poller of ``meters`` started detached (its own session, as the agents are), unless
    it runs; None without meters."""
    if not meters:
        return None
    running = running_pid(run_dir)
    if running:
        return running
    import subprocess

    record = {
        "meters": [
            {
                **meter.record(),
                "index": meter.index,
                "settings": dict(meter.settings),
                "sim_root": str(meter.sim_root) if meter.sim_root else None,
            }
            for meter in meters
        ]
    }
    monitor = RunDir(run_dir).monitor
    monitor.mkdir(parents=True, exist_ok=True)
    record_path(run_dir).write_text(json.dumps(record, indent=1))
    stop_path(run_dir).unlink(missing_ok=True)
    with open(monitor / "wall.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "thermab.telemetry.wall_poll", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    pid_path(run_dir).write_text(str(process.pid))
    deadline = time.monotonic() + STOP_WAIT_S  # until it runs as the poller (exec done), so it is seen as running
    while running_pid(run_dir) != process.pid and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process.pid


def stop(run_dir: Path) -> None:
    """Ask the poller to stop (the stop file and SIGTERM) and wait for it."""
    pid = running_pid(run_dir)
    if RunDir(run_dir).monitor.exists():
        stop_path(run_dir).touch()
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S + 5
    while time.monotonic() < deadline and running_pid(run_dir):
        try:
            os.waitpid(pid, os.WNOHANG)  # our child where this process started it
        except ChildProcessError:
            pass
        time.sleep(0.1)
    if running_pid(run_dir):
        os.kill(pid, signal.SIGKILL)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thermab.telemetry.wall_poll", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    run(args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
