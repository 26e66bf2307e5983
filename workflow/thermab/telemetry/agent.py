#!/usr/bin/env python3
"""thermab telemetry agent: one stdlib-only file copied to every host and run detached.

Usage on a host (Python >= 3.8, nothing to install):

    python3 agent.py --config settings.json       # runs until SIGTERM or the stop file

The settings file holds: out_dir, sys_root ("/" on a real host, the node tree on a
simulated one), proc_root ("/proc"), process_pattern (regex over /proc/PID/cmdline),
intervals ({"thermal": 15, "cpu": 6, "freq": 15}) and optionally stop_file.  The settings
travel in a file rather than on the command line so that the agent's own cmdline never
matches the process pattern it is looking for.  Settings it cannot use (unreadable, a
pattern this host's Python does not compile, the file being out_dir/agent.json, which the
agent writes) stop it at once with one line on stderr and exit status 2.

Every source appends rows ``t,sensor,value,reason`` to ``out_dir/<source>.csv`` and flushes
each sample, so a crash loses at most one sample.  ``value`` is empty and ``reason`` says
why when a reading is missing; no reading stops the agent.  Sources that run a command
(``nvidia-smi``) sample in threads of their own with a timeout, so they never delay the
others.  A restart appends (never truncates) and writes an ``agent_start`` row to
``agent_events.csv`` so the gap is visible.  ``out_dir/agent.json`` says what each source
found at start.
"""

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

VERSION = "0.1.0"
PLAUSIBLE_C = (-40.0, 150.0)


def read_text(path):
    with open(path, "r", encoding="utf-8", errors="replace") as handle:
        return handle.read().strip()


class Source:
    """One kind of telemetry: ``available()``, ``discover()`` then ``sample()`` repeatedly.
    Each source declares its file stem (``name``), the ``kind`` its rows have in
    ``tidy/telemetry.parquet`` and its default sampling interval; :data:`SOURCES` lists
    them, and the deployer, ingest and the config schema's defaults all read that list."""

    name = "source"
    kind = ""
    default_interval_s = 15.0

    def __init__(self, sys_root="/", proc_root="/proc"):
        self.sys_root = sys_root
        self.proc_root = proc_root

    @classmethod
    def from_settings(cls, settings, sys_root, proc_root):
        return cls(sys_root, proc_root)

    def sys_path(self, *parts):
        return os.path.join(self.sys_root, "sys", *parts)

    def proc_path(self, *parts):
        return os.path.join(self.proc_root, *parts)

    def available(self):
        return True

    def discover(self):
        """Return a dict of facts found once at start (names, trip points, ...)."""
        return {}

    def sample(self):
        """Return a list of (sensor, value or None, reason)."""
        raise NotImplementedError


def zone_name(raw_path, zone_type, index, taken):
    """``\\_TZ_.TSOC`` -> ``TSOC``; without a device path, the zone type; a name already
    taken gets the zone's index (two zones must never share a name: one would vanish)."""
    name = re.split(r"[\\.]", raw_path.strip())[-1] if raw_path else ""
    name = name or zone_type or "zone%d" % index
    if name in taken:
        name = "%s_%d" % (name, index)
    return name


def number_in(name):
    """The number in ``thermal_zone7``, ``policy12`` or ``cpu3``, for ordering (0 if none)."""
    return int(re.sub(r"\D", "", name) or 0)


def parse_millidegrees(text):
    """Return (celsius or None, reason)."""
    try:
        value = int(text) / 1000.0
    except ValueError:
        return None, "not a number: %r" % text[:40]
    if not PLAUSIBLE_C[0] < value < PLAUSIBLE_C[1]:
        return None, "implausible: %.1f C" % value
    return value, ""


class ThermalZones(Source):
    name = "thermal"
    kind = "thermal"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def __init__(self, *args, **kwargs):
        Source.__init__(self, *args, **kwargs)
        self.zones = {}
        self.unnamed = []  # zone directories named without a device path (yet)

    def base(self):
        return self.sys_path("class", "thermal")

    def available(self):
        return os.path.isdir(self.base())

    def discover(self):
        zones, trips, details, unnamed = {}, {}, [], []
        entries = sorted(self.entries(), key=number_in)
        for entry in entries:
            zone_dir = os.path.join(self.base(), entry)
            index = number_in(entry)
            raw_path = self._optional(os.path.join(zone_dir, "device", "path"))
            zone_type = self._optional(os.path.join(zone_dir, "type"))
            name = zone_name(raw_path, zone_type, index, zones)
            zones[name] = zone_dir
            if not raw_path:
                unnamed.append(zone_dir)
            trip = self._optional(os.path.join(zone_dir, "trip_point_0_temp"))
            trip_c = parse_millidegrees(trip)[0] if trip else None
            if trip_c is not None:
                trips[name] = trip_c
            details.append({"zone": entry, "name": name, "device_path": raw_path, "type": zone_type,
                            "trip_point_c": trip_c})
        self.zones, self.unnamed = zones, unnamed
        return {"zones": sorted(zones), "trip_points_c": trips, "details": details}

    @staticmethod
    def _optional(path):
        try:
            return read_text(path)
        except OSError:
            return ""

    def entries(self):
        return sorted(e for e in os.listdir(self.base()) if e.startswith("thermal_zone"))

    def sample(self):
        if self.entries() != sorted(os.path.basename(d) for d in self.zones.values()) or any(
                self._optional(os.path.join(d, "device", "path")) for d in self.unnamed):
            # a zone appeared or vanished (driver reload, hotplug), or its ACPI path
            # appeared after it did: its name follows the path from now on
            self.discover()
        rows = []
        for name, zone_dir in sorted(self.zones.items()):
            try:
                value, reason = parse_millidegrees(read_text(os.path.join(zone_dir, "temp")))
            except OSError as error:
                value, reason = None, "unreadable: %s" % error.strerror
            rows.append((name, value, reason))
        return rows


class CpuFrequency(Source):
    """Every cpufreq policy; ``cpuinfo_avg_freq`` where the kernel has it (GB10's
    ``scaling_cur_freq`` can over-read), else ``scaling_cur_freq``."""

    name = "freq"
    kind = "freq"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def base(self):
        return self.sys_path("devices", "system", "cpu", "cpufreq")

    def available(self):
        return os.path.isdir(self.base())

    FILES = ("cpuinfo_avg_freq", "scaling_cur_freq")  # in order of preference

    def discover(self):
        self.policies = {}
        for entry in sorted(os.listdir(self.base()), key=number_in):
            if not entry.startswith("policy"):
                continue
            policy_dir = os.path.join(self.base(), entry)
            files = [os.path.join(policy_dir, f) for f in self.FILES if os.path.exists(os.path.join(policy_dir, f))]
            if files:
                self.policies["cpu" + entry[len("policy"):]] = files
        return {"policies": {k: os.path.basename(v[0]) for k, v in self.policies.items()}}

    def sample(self):
        """Per policy and per sample, the first file that reads: ``cpuinfo_avg_freq``
        refuses reads now and then (EAGAIN on an idle core), ``scaling_cur_freq`` stands in."""
        rows = []
        for sensor, paths in sorted(self.policies.items(), key=lambda kv: number_in(kv[0])):
            reasons = []
            for path in paths:
                try:
                    rows.append((sensor, int(read_text(path)) / 1000.0, ""))
                    break
                except (OSError, ValueError) as error:
                    reasons.append("%s: %s" % (os.path.basename(path), error))
            else:
                rows.append((sensor, None, "unreadable: " + "; ".join(reasons)))
        return rows


def parse_stat(text):
    """utime+stime ticks and starttime from /proc/PID/stat (comm may contain spaces)."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12]), int(fields[19])


def parse_thread_stat(text):
    """(comm, utime+stime ticks, CPU it last ran on) from /proc/PID/task/TID/stat."""
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return comm, int(fields[11]) + int(fields[12]), int(fields[36])


class ProcessCpu(Source):
    """Σ Δ(utime+stime) / CLK_TCK / Δt × 100 over every process whose cmdline matches,
    plus the busiest threads (``thread <comm> <tid> cpu<N>``, N = the core it last ran
    on), so a spinning thread can be attributed to a core and cluster."""

    name = "cpu"
    kind = "cpu"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 6.0
    top_threads = 5
    sensor = "vllm_cpu_pct"  # the sum over the matching processes

    def __init__(self, pattern="vllm", *args, **kwargs):
        Source.__init__(self, *args, **kwargs)
        self.pattern = re.compile(pattern)
        self.clk_tck = os.sysconf("SC_CLK_TCK")
        self.previous = None
        self.previous_t = None
        self.previous_threads = {}
        self.own_pids = {os.getpid()}

    @classmethod
    def from_settings(cls, settings, sys_root, proc_root):
        return cls(settings.get("process_pattern", "vllm"), sys_root, proc_root)

    def matching_pids(self):
        pids = []
        for entry in os.listdir(self.proc_root):
            if not entry.isdigit() or int(entry) in self.own_pids:
                continue
            try:
                with open(self.proc_path(entry, "cmdline"), "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if self.pattern.search(cmdline):
                pids.append(entry)
        return pids

    def ticks(self):
        result = {}
        for pid in self.matching_pids():
            try:
                result[pid] = parse_stat(read_text(self.proc_path(pid, "stat")))
            except (OSError, ValueError, IndexError):
                continue  # the process ended between listing and reading
        return result

    def boot_ticks(self, now):
        """Uptime in ticks, to tell whether a new process started after the last sample."""
        try:
            uptime = float(read_text(self.proc_path("uptime")).split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return uptime * self.clk_tck

    def sample(self):
        now = time.time()
        current = self.ticks()
        rows = []
        if self.previous is not None:
            elapsed = now - self.previous_t
            uptime_ticks = self.boot_ticks(now)
            since_ticks = None if uptime_ticks is None else uptime_ticks - elapsed * self.clk_tck
            delta = 0
            for pid, (ticks, start) in current.items():
                if pid in self.previous and self.previous[pid][1] == start:
                    delta += ticks - self.previous[pid][0]
                elif since_ticks is not None and start >= since_ticks:
                    delta += ticks  # born inside this interval: all its ticks are new
            rows.append((self.sensor, 100.0 * delta / self.clk_tck / elapsed, ""))
            rows.append(("vllm_processes", float(len(current)), ""))
        threads = self.thread_ticks(current)
        if self.previous is not None:
            busy = sorted(((ticks - self.previous_threads[key][1], key, comm, cpu)
                           for key, (comm, ticks, cpu) in threads.items() if key in self.previous_threads),
                          reverse=True)[:self.top_threads]
            for ticks, (pid, tid), comm, cpu in busy:
                if ticks > 0:
                    rows.append(("thread %s %s cpu%d" % (comm, tid, cpu), 100.0 * ticks / self.clk_tck / elapsed, ""))
        self.previous, self.previous_t, self.previous_threads = current, now, threads
        return rows

    def thread_ticks(self, pids):
        threads = {}
        for pid in pids:
            try:
                tids = os.listdir(self.proc_path(pid, "task"))
            except OSError:
                continue
            for tid in tids:
                try:
                    threads[(pid, tid)] = parse_thread_stat(read_text(self.proc_path(pid, "task", tid, "stat")))
                except (OSError, ValueError, IndexError):
                    continue
        return threads


class Hwmon(Source):
    """``hwmon*/temp*_input`` with their labels (coretemp, k10temp, nvme, ...): the
    temperatures of hosts without ACPI thermal zones.  Sensor ``<chip>/<label>``."""

    name = "hwmon"
    kind = "thermal"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def base(self):
        return self.sys_path("class", "hwmon")

    def available(self):
        return os.path.isdir(self.base()) and bool(os.listdir(self.base()))

    def discover(self):
        self.inputs = {}
        for entry in sorted(os.listdir(self.base())):
            chip_dir = os.path.join(self.base(), entry)
            chip = ThermalZones._optional(os.path.join(chip_dir, "name")) or entry
            try:
                names = sorted(os.listdir(chip_dir))
            except OSError:
                continue  # a chip that went away, or a dangling link: the others still count
            for name in names:
                match = re.match(r"(temp\d+)_input$", name)
                if match:
                    label = ThermalZones._optional(os.path.join(chip_dir, match.group(1) + "_label"))
                    sensor = "%s/%s" % (chip, label or match.group(1))
                    if sensor in self.inputs:
                        sensor = "%s/%s" % (entry, label or match.group(1))
                    self.inputs[sensor] = os.path.join(chip_dir, name)
        return {"sensors": sorted(self.inputs)}

    def sample(self):
        rows = []
        for sensor, path in sorted(self.inputs.items()):
            try:
                value, reason = parse_millidegrees(read_text(path))
            except OSError as error:
                value, reason = None, "unreadable: %s" % error.strerror
            rows.append((sensor, value, reason))
        return rows


GPU_QUERY = ("index", "temperature.gpu", "clocks.sm", "power.draw", "utilization.gpu")
GPU_SENSORS = ("temp_c", "sm_clock_mhz", "power_w", "util_pct")


def parse_nvidia_smi(text):
    """``nvidia-smi --query-gpu=index,temperature.gpu,clocks.sm,power.draw,utilization.gpu
    --format=csv,noheader,nounits`` -> rows; ``[N/A]`` and the like become missing."""
    rows = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(GPU_QUERY):
            rows.append(("gpu_parse_error", None, "unexpected line: %r" % line[:80]))
            continue
        for sensor, raw in zip(GPU_SENSORS, fields[1:]):
            try:
                rows.append(("gpu%s_%s" % (fields[0], sensor), float(raw), ""))
            except ValueError:
                rows.append(("gpu%s_%s" % (fields[0], sensor), None, "not reported: %s" % raw))
    return rows


class CommandSource(Source):
    """A source read by running a command (``nvidia-smi``, ``ipmitool``): the agent samples
    it in a thread of its own, with a timeout, so a slow or hung command never stops or
    delays the other sources.  A timeout or a failure is a missing value with the reason."""

    threaded = True
    timeout_s = 5.0
    running = None  # the command in flight, ended with the agent

    def argv(self):
        raise NotImplementedError

    def parse(self, stdout):
        """Rows from the command's output."""
        raise NotImplementedError

    def available(self):
        return shutil.which(self.argv()[0]) is not None

    def sample(self):
        error_sensor = self.name + "_error"
        try:
            process = subprocess.Popen(self.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, universal_newlines=True)
        except OSError as error:
            return [(error_sensor, None, "cannot run %s: %s" % (self.argv()[0], error))]
        self.running = process
        try:
            stdout, stderr = process.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()  # not waited for: a command stuck in the kernel may never go
            return [(error_sensor, None, "%s timed out after %g s" % (self.argv()[0], self.timeout_s))]
        finally:
            self.running = None
        if process.returncode != 0:
            return [(error_sensor, None, stderr.strip()[:200] or "exit %d" % process.returncode)]
        return self.parse(stdout)


class NvidiaGpu(CommandSource):
    name = "gpu"
    kind = "gpu"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def argv(self):
        return ["nvidia-smi", "--query-gpu=" + ",".join(GPU_QUERY), "--format=csv,noheader,nounits"]

    def parse(self, stdout):
        return parse_nvidia_smi(stdout)


class SystemCpu(Source):
    """Busy share of all CPUs from /proc/stat, and the 1-minute load average."""

    name = "system"
    kind = "system"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 6.0

    def __init__(self, *args, **kwargs):
        Source.__init__(self, *args, **kwargs)
        self.previous = None

    def sample(self):
        fields = [int(x) for x in read_text(self.proc_path("stat")).splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        total = sum(fields[:8])
        rows = []
        if self.previous is not None:
            d_total = total - self.previous[0]
            if d_total > 0:
                rows.append(("busy_pct", 100.0 * (d_total - (idle - self.previous[1])) / d_total, ""))
        self.previous = (total, idle)
        rows.append(("loadavg_1m", float(read_text(self.proc_path("loadavg")).split()[0]), ""))
        return rows


def format_value(value):
    if value is None or value == "":
        return ""
    return "%.3f" % value if isinstance(value, float) else str(value)


# The registry of sources, in sampling order: everything that needs the list reads it here.
SOURCES = (ThermalZones, Hwmon, CpuFrequency, ProcessCpu, SystemCpu, NvidiaGpu)


def discover_all(sys_root="/", proc_root="/proc"):
    """What each available source finds at start, without sampling: preflight runs this
    on every host (``agent.py --discover``), so it sees the zones the agent will log."""
    found = {}
    for source_class in SOURCES:
        if source_class is ProcessCpu:
            continue  # which processes match is a run-time fact, not a host fact
        source = source_class(sys_root, proc_root)
        try:
            found[source.name] = source.discover() if source.available() else None
        except Exception as error:  # one odd source must not hide what the others found
            found[source.name] = {"error": "%s: %s" % (type(error).__name__, error)}
    return found


META_FILE = "agent.json"  # in out_dir: what the agent found and runs with, for the controller


class SettingsError(Exception):
    """The settings file cannot be used: the agent stops at once with this one line."""


def load_settings(path):
    """The agent's settings file, checked before anything starts."""
    try:
        with open(path) as handle:
            settings = json.load(handle)
    except OSError as error:
        raise SettingsError("cannot read: %s" % error.strerror)
    except ValueError as error:
        raise SettingsError("not JSON: %s" % error)
    if not isinstance(settings, dict) or not isinstance(settings.get("out_dir"), str):
        raise SettingsError("must be a JSON object with out_dir")
    pattern = settings.get("process_pattern", "vllm")
    try:
        re.compile(pattern)
    except (re.error, TypeError) as error:
        # this host's Python may read patterns differently from the controller's
        raise SettingsError("process_pattern %r: not a regular expression here: %s" % (pattern, error))
    intervals = settings.get("intervals", {})
    for name, interval in (intervals.items() if isinstance(intervals, dict) else [("intervals", intervals)]):
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not interval > 0:
            raise SettingsError("intervals.%s: %r is not a positive number of seconds" % (name, interval))
    if os.path.realpath(path) == os.path.realpath(os.path.join(settings["out_dir"], META_FILE)):
        raise SettingsError("is out_dir/%s, where the agent writes what it found: name the settings "
                            "file otherwise" % META_FILE)
    try:
        os.makedirs(settings["out_dir"], exist_ok=True)
    except OSError as error:
        raise SettingsError("out_dir %s: cannot create: %s" % (settings["out_dir"], error.strerror))
    return settings


class Agent:
    def __init__(self, settings):
        self.settings = settings
        self.out_dir = settings["out_dir"]
        sys_root = settings.get("sys_root", "/")
        proc_root = settings.get("proc_root", "/proc")
        intervals = settings.get("intervals", {})
        candidates = [source.from_settings(settings, sys_root, proc_root) for source in SOURCES]
        self.sources = []
        for source in candidates:
            interval = float(intervals.get(source.name, source.default_interval_s))
            if self._safely(source.available, False):
                self.sources.append((source, interval))
        self.stopping = False

    @staticmethod
    def _safely(call, otherwise):
        try:
            return call()
        except Exception:  # a source that cannot even say whether it is there is not
            return otherwise

    def event(self, name, detail):
        self._append("agent_events", [(time.time(), name, "", json.dumps(detail, sort_keys=True))])

    def _append(self, stem, rows):
        path = os.path.join(self.out_dir, stem + ".csv")
        new = not os.path.exists(path)
        with open(path, "a", newline="") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(["t", "sensor", "value", "reason"])
            for row in rows:
                t, sensor, value, reason = row
                writer.writerow(["%.3f" % t, sensor, format_value(value), reason])
            handle.flush()

    def record(self, source):
        """One sample of one source, appended: whatever a reading does, the agent goes on."""
        try:
            rows = source.sample()
        except Exception as error:
            rows = [("source_error", None, ("%s: %s" % (type(error).__name__, error))[:200])]
        try:
            self._append(source.name, [(time.time(), s, v, r) for s, v, r in rows])
        except OSError as error:  # a full disk may free up; the next sample tries again
            sys.stderr.write("agent: cannot write %s.csv: %s\n" % (source.name, error))

    def stop_requested(self):
        stop_file = self.settings.get("stop_file")
        return self.stopping or bool(stop_file and os.path.exists(stop_file))

    def _run_alone(self, source, interval):
        while not self.stop_requested():
            due = time.time() + interval
            self.record(source)
            while not self.stop_requested() and time.time() < due:
                time.sleep(min(0.5, max(0.05, due - time.time())))

    def run(self):
        discovered = {}
        for source, _ in self.sources:
            try:
                discovered[source.name] = source.discover()
            except Exception as error:
                discovered[source.name] = {"error": "%s: %s" % (type(error).__name__, error)}
        meta = {"pid": os.getpid(), "version": VERSION, "start": time.time(),
                "sources": {s.name: i for s, i in self.sources}, "discovered": discovered}
        meta_path = os.path.join(self.out_dir, META_FILE)
        with open(meta_path + ".tmp", "w") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
        os.replace(meta_path + ".tmp", meta_path)  # whole or absent, for whoever waits on it
        self.event("agent_start", meta)
        inline = []
        for source, interval in self.sources:
            if getattr(source, "threaded", False):
                threading.Thread(target=self._run_alone, args=(source, interval), daemon=True).start()
            else:
                inline.append((source, interval))
        due = {source.name: time.time() for source, _ in inline}
        while not self.stop_requested():
            now = time.time()
            for source, interval in inline:
                if now >= due[source.name]:
                    due[source.name] = now + interval
                    self.record(source)
            time.sleep(max(0.05, min([d - time.time() for d in due.values()] + [0.5])))
        for source, _ in self.sources:
            if getattr(source, "running", None) is not None:
                source.running.kill()  # a command still in flight does not outlive the agent
        self.event("agent_stop", {"pid": os.getpid()})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="agent.json with out_dir, roots, pattern, intervals")
    parser.add_argument("--discover", action="store_true",
                        help="print what the sources find (JSON) and exit, sampling nothing")
    parser.add_argument("--sys-root", default="/", help="with --discover: the root of /sys")
    args = parser.parse_args(argv)
    if args.discover:
        json.dump(discover_all(args.sys_root), sys.stdout, indent=1, sort_keys=True)
        return 0
    if not args.config:
        parser.error("--config is required")
    try:
        agent = Agent(load_settings(args.config))
    except SettingsError as error:
        # once, in one line, in agent.log: the deployer shows it instead of restarting in a loop
        sys.stderr.write("agent: %s: %s\n" % (args.config, error))
        return 2

    def request_stop(signum, frame):
        agent.stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
