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
(``nvidia-smi``, ``ipmitool``) sample off the sampling loop with a timeout, so they never
delay the others.  Power sources (RAPL, hwmon power, GPU power, IPMI) name their sensors
``<domain> <quantity>`` and keep energy counters raw (see "power" below).  A restart
appends (never truncates) and writes an ``agent_start`` row to ``agent_events.csv`` so the
gap is visible.  ``out_dir/agent.json`` says what each source found at start.
"""

from __future__ import annotations  # annotations stay text: the hosts may run Python 3.8

import argparse
import contextlib
import csv
import errno
import heapq
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

VERSION = "0.1.0"
PLAUSIBLE_C = (-40.0, 150.0)


READ_SIZE = 16384


def read_bytes(path):
    """A whole file in as few system calls as the kernel allows: open, read, close.  sysfs
    and procfs hand a whole file to one read of a larger buffer (and a regular file reads
    short only at its end), so a read that comes back short is the end.  Python's
    ``open()`` adds fstat, ioctl and lseek calls and its buffer objects: three times the
    CPU per /proc file (docs/benchmarks.md), and the agent reads hundreds a minute."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, READ_SIZE)
        if len(data) < READ_SIZE:
            return data
        chunks = [data]
        while chunks[-1]:
            chunks.append(os.read(fd, READ_SIZE))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path):
    return read_bytes(path).decode("utf-8", "replace").strip()


# A user's regex (process_pattern, setting.anchor) meets text the user does not control (any
# process's command line, the setting's file): the text is bounded, and so is the time.
MATCH_LIMIT_S = 1.0  # the default pattern takes microseconds on a command line; this is backtracking
MAX_CMDLINE_BYTES = 64 * 1024  # a longer command line is matched on its start (the title vLLM sets is short)


class MatchTimeout(Exception):
    """A user's regex ran past its time bound on some text (catastrophic backtracking)."""


def _expire(_signum, _frame):
    raise MatchTimeout("no answer within the time bound")


@contextlib.contextmanager
def alarm_raises():
    """Inside, SIGALRM raises MatchTimeout (in the main thread; elsewhere nothing changes):
    ``time_bounded`` within only arms and stops the timer.  Installing a handler costs ten
    times a match of a command line, and the agent matches every new process's."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGALRM) is _expire:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _expire)
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def time_bounded(call, limit_s=MATCH_LIMIT_S):
    """``call()`` (a regex search on untrusted text), stopped by MatchTimeout after
    ``limit_s``: Python's matcher checks for signals as it runs, so SIGALRM interrupts a
    match that backtracks.  Signals reach the main thread only; in another the call runs
    without a time bound (``match_spans`` has one in any thread)."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    with alarm_raises():
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            return call()
        except MatchTimeout:
            raise MatchTimeout("no answer within %g s (a pattern that backtracks)" % limit_s) from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def match_spans(pattern, text, limit_s=MATCH_LIMIT_S):
    """The (start, end) of every match of ``pattern`` in ``text``, or MatchTimeout after
    ``limit_s`` of matching, in any thread: the main thread matches itself (SIGALRM), any
    other hands the match to a child Python, whose main thread it is (a thread cannot be
    interrupted, a child can be waited for)."""

    def spans():
        return [match.span() for match in re.finditer(pattern, text)]

    if threading.current_thread() is threading.main_thread():
        return time_bounded(spans, limit_s)
    here = os.path.dirname(os.path.abspath(__file__))
    child = "import sys; sys.path.insert(0, %r); import agent; agent.spans_of_stdin()" % here
    job = json.dumps({"pattern": pattern, "text": text, "limit_s": limit_s})
    try:  # the child's own bound stops the match; this one only a child that cannot start
        done = subprocess.run(
            [sys.executable, "-I", "-c", child], input=job, capture_output=True, text=True, timeout=limit_s + 60
        )
        answer = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        raise MatchTimeout("the matching process failed: %s" % error) from None
    if "timeout" in answer:
        raise MatchTimeout(answer["timeout"])
    return [tuple(span) for span in answer["spans"]]


def spans_of_stdin():
    """``match_spans`` in a child: the job (pattern, text, limit_s) as JSON on stdin."""
    job = json.load(sys.stdin)
    try:
        json.dump({"spans": match_spans(job["pattern"], job["text"], job["limit_s"])}, sys.stdout)
    except MatchTimeout as error:
        json.dump({"timeout": str(error)}, sys.stdout)


# a read failing with one of these means the file, or the device behind it, went away: the
# source resolves its paths again (another device may have taken the number)
GONE = (errno.ENOENT, errno.ENODEV, errno.ENXIO, errno.ESTALE)


def read_parsed(path, parse, gone=None):
    """(``parse(text)`` or None, reason) of a file: one that cannot be read, or whose text
    does not parse, is a missing value with the reason.  ``gone`` (a list) collects the
    paths whose file went away."""
    try:
        text = read_text(path)
    except OSError as error:
        if gone is not None and error.errno in GONE:
            gone.append(path)
        return None, "unreadable: %s" % (error.strerror or error)
    try:
        return parse(text), ""
    except (ValueError, IndexError):
        return None, "not a number: %r" % text[:40]


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

    def close(self):
        """End what the source left running (see CommandSource); most leave nothing."""


class ResolvedSource(Source):
    """A source whose sensors are files under numbered sysfs entries (``thermal_zoneN``,
    ``hwmonN``, ``policyN``, ``intel-rapl:N``) that the kernel renumbers as devices come and
    go.  A sensor is named by what identifies its device, never by the number; ``layout()``
    is a cheap fingerprint of which device each number holds now.  After each round of reads
    the layout is compared with the one the paths were resolved under: when it changed, or a
    file went away (:data:`GONE`), the paths are resolved again and read again, so a
    reading is never written under the name of a device it did not come from."""

    def __init__(self, *args, **kwargs):
        Source.__init__(self, *args, **kwargs)
        self.resolved_layout = None

    def layout(self):
        raise NotImplementedError

    def resolve(self):
        """Find the sensors' paths (on ``self``); return the facts for agent.json."""
        raise NotImplementedError

    def read(self, gone):
        """Rows (sensor, value or None, reason) of one round; ``gone`` collects paths gone."""
        raise NotImplementedError

    def discover(self):
        self.resolved_layout = self.layout()
        return self.resolve()

    def sample(self):
        if self.resolved_layout is None:
            self.discover()
        gone = []
        rows = self.read(gone)
        if gone or self.layout() != self.resolved_layout:
            self.discover()
            rows = self.read([])
            if self.layout() != self.resolved_layout:  # changing as we read: nothing is sure
                rows = [(sensor, None, "devices changed while read") for sensor, _, _ in rows]
        return rows


def link_target(path):
    """Where a sysfs link leads (``../../devices/pci0000:00/0000:00:18.3/hwmon/hwmon2``), or
    "" where ``path`` is no link: which device a numbered entry holds, in one system call."""
    try:
        return os.readlink(path)
    except OSError:
        return ""


def device_identity(directory):
    """The device behind a sysfs entry, by the last part of where its ``device`` link leads:
    a PCI address (``0000:03:00.0``), a platform device (``coretemp.0``), a controller
    (``nvme1``); "" without a link.  It names the device whatever number the entry has."""
    link = os.path.join(directory, "device")
    return os.path.basename(os.path.realpath(link)) if link_target(link) else ""


def unique_name(name, taken, device=""):
    """``name``, or where another sensor has it, ``name@device`` (the device's identity),
    else ``name_K`` with the next free K: two sensors must never share a name (one would
    vanish), and an ordinal among equals is steadier than the kernel's number."""
    if name not in taken:
        return name
    if device and "%s@%s" % (name, device) not in taken:
        return "%s@%s" % (name, device)
    k = 1
    while "%s_%d" % (name, k) in taken:
        k += 1
    return "%s_%d" % (name, k)


def zone_name(raw_path, zone_type, index, taken, device=""):
    """``\\_TZ_.TSOC`` -> ``TSOC``; without a device path, the zone type; a name already
    taken is made unique (:func:`unique_name`)."""
    name = re.split(r"[\\.]", raw_path.strip())[-1] if raw_path else ""
    return unique_name(name or zone_type or "zone%d" % index, taken, device)


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


def read_millidegrees(path, gone=None):
    text, reason = read_parsed(path, str, gone)
    return (None, reason) if text is None else parse_millidegrees(text)


# Trip points the interlock may stand on: an ``active`` one switches a fan on, far below
# where the chip is in danger.  0 and -274000 (the kernel's "invalid") are no trip points.
INTERLOCK_TRIP_TYPES = ("critical", "hot", "passive", "")


def trip_points(zone_dir, optional):
    """(lowest valid trip point in °C or None, the file and type it is read from, the
    trip points left out with why) of one zone."""
    valid, ignored = [], []
    try:
        names = sorted((n for n in os.listdir(zone_dir) if re.match(r"trip_point_\d+_temp$", n)), key=number_in)
    except OSError:
        names = []
    for name in names:
        trip_type = optional(os.path.join(zone_dir, name[: -len("temp")] + "type"))
        text = optional(os.path.join(zone_dir, name))
        value, why = parse_millidegrees(text)
        if value == 0:
            why = "0: unset"
        elif value is not None and trip_type not in INTERLOCK_TRIP_TYPES:
            why = "%s (a fan or cooling step, not a limit)" % trip_type
        label = "%s (%s)" % (name, trip_type) if trip_type else name
        if why:
            ignored.append({"trip_point": label, "raw": text[:20], "why": why})
        else:
            valid.append((value, label))
    lowest = min(valid) if valid else (None, None)
    return lowest[0], lowest[1], ignored


class ThermalZones(ResolvedSource):
    name = "thermal"
    kind = "thermal"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def __init__(self, *args, **kwargs):
        ResolvedSource.__init__(self, *args, **kwargs)
        self.zones = {}

    def base(self):
        return self.sys_path("class", "thermal")

    def available(self):
        return os.path.isdir(self.base())

    def layout(self):
        """Each zone's number, type and ACPI path: what its name is made of."""
        return tuple(
            (
                entry,
                self._optional(os.path.join(self.base(), entry, "type")),
                self._optional(os.path.join(self.base(), entry, "device", "path")),
            )
            for entry in self.entries()
        )

    def resolve(self):
        zones, trips, details = {}, {}, []
        for entry, zone_type, raw_path in self.resolved_layout:
            zone_dir = os.path.join(self.base(), entry)
            name = zone_name(raw_path, zone_type, number_in(entry), zones, device_identity(zone_dir))
            zones[name] = zone_dir
            trip_c, trip_point, ignored = trip_points(zone_dir, self._optional)
            if trip_c is not None:
                trips[name] = trip_c
            details.append(
                {
                    "zone": entry,
                    "name": name,
                    "device_path": raw_path,
                    "type": zone_type,
                    "trip_point_c": trip_c,
                    "trip_point": trip_point,
                    "trip_points_ignored": ignored,
                }
            )
        self.zones = zones
        return {"zones": sorted(zones), "trip_points_c": trips, "details": details}

    @staticmethod
    def _optional(path):
        try:
            return read_text(path)
        except OSError:
            return ""

    def entries(self):
        try:
            return sorted((e for e in os.listdir(self.base()) if e.startswith("thermal_zone")), key=number_in)
        except OSError:
            return []

    def read(self, gone):
        return [
            (name,) + read_millidegrees(os.path.join(zone_dir, "temp"), gone)
            for name, zone_dir in sorted(self.zones.items())
        ]


class CpuFrequency(ResolvedSource):
    """Every cpufreq policy; ``cpuinfo_avg_freq`` where the kernel has it (GB10's
    ``scaling_cur_freq`` can over-read), else ``scaling_cur_freq``, else the hardware's
    ``cpuinfo_cur_freq`` (a driver without the scaling file; often root's alone, and then
    a missing value that says so).  A policy is named by its first CPU (``policy12`` ->
    ``cpu12``), which stays that CPU through hotplug; one without any of these files is
    named in agent.json (``unread``), never left out unsaid."""

    name = "freq"
    kind = "freq"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def __init__(self, *args, **kwargs):
        ResolvedSource.__init__(self, *args, **kwargs)
        self.policies = {}

    def base(self):
        return self.sys_path("devices", "system", "cpu", "cpufreq")

    def available(self):
        return os.path.isdir(self.base())

    FILES = ("cpuinfo_avg_freq", "scaling_cur_freq", "cpuinfo_cur_freq")  # in order of preference

    def layout(self):
        try:
            return tuple(sorted((e for e in os.listdir(self.base()) if e.startswith("policy")), key=number_in))
        except OSError:
            return ()

    def resolve(self):
        self.policies, unread = {}, []
        for entry in self.resolved_layout:
            policy_dir = os.path.join(self.base(), entry)
            files = [os.path.join(policy_dir, f) for f in self.FILES if os.path.exists(os.path.join(policy_dir, f))]
            if files:
                self.policies["cpu" + entry[len("policy") :]] = files
            else:
                unread.append(entry)
        found = {"policies": {k: os.path.basename(v[0]) for k, v in self.policies.items()}}
        return dict(found, unread=unread) if unread else found

    def read(self, gone):
        """Per policy and per sample, the first file that reads: ``cpuinfo_avg_freq``
        refuses reads now and then (EAGAIN on an idle core), ``scaling_cur_freq`` stands in."""
        rows = []
        for sensor, paths in sorted(self.policies.items(), key=lambda kv: number_in(kv[0])):
            reasons, missing = [], []
            for path in paths:
                value, reason = read_parsed(path, int, missing)
                if value is not None:
                    rows.append((sensor, value / 1000.0, ""))
                    break
                reasons.append("%s: %s" % (os.path.basename(path), reason))
            else:
                rows.append((sensor, None, "unreadable: " + "; ".join(reasons)))
                gone.extend(missing)
        return rows


def parse_stat(text):
    """utime+stime ticks and starttime from /proc/PID/stat (comm may contain spaces)."""
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12]), int(fields[19])


def parse_thread_stat(text):
    """(comm, utime+stime ticks, CPU it last ran on) from /proc/PID/task/TID/stat."""
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[11]) + int(fields[12]), int(fields[36])


def handed_out_again(previous_last, last, known):
    """The pids among ``known`` that the kernel handed out since its last pid was
    ``previous_last`` (now ``last``; the numbers wrap at pid_max): new processes under
    numbers that belonged to others."""
    if previous_last is None or last is None or last == previous_last:
        return set()
    if 0 < last - previous_last <= len(known):
        return {str(n) for n in range(previous_last + 1, last + 1)} & known
    if last > previous_last:
        return {pid for pid in known if previous_last < int(pid) <= last}
    return {pid for pid in known if int(pid) > previous_last or int(pid) <= last}  # wrapped


# vLLM's API server by its command (``vllm serve``, ``python -m vllm.entrypoints...``), its
# engine and workers by the titles vLLM gives them with setproctitle (``VLLM::EngineCore``,
# ``VLLM::Worker_TP0``), which replace their command lines; plain ``vllm`` would miss none of
# these but also match any command naming a file after vLLM (a config on Snakemake's line)
DEFAULT_PROCESS_PATTERN = r"vllm serve|vllm\.entrypoints|VLLM::"


class ProcessCpu(Source):
    """Σ Δ(utime+stime) / CLK_TCK / Δt × 100 over every process whose cmdline matches,
    plus the busiest threads (``thread <comm> <tid> cpu<N>``, N = the core it last ran
    on) of the processes above ``thread_floor_pct``, so a spinning thread can be
    attributed to a core and cluster.

    A host runs hundreds of processes and few match, so a process's cmdline is read when
    its pid first shows, at every sample while it matches, and else again each time it is
    twice as old as when last read, at most ``rescan_s`` apart: often while it is young
    (vLLM's children take their titles after they start, a wrapper execs into vLLM),
    rarely after.  A process that turns into a match is counted from its next look on.

    Listing /proc costs more than anything else the agent does (the kernel walks every
    task), so the pids handed out since the last sample (after the last one it saw, up to
    the last pid in /proc/loadavg) are looked up one by one where they are few, /proc is
    listed where they are many or the numbers wrapped at pid_max, and at least every
    ``rescan_s`` (a /proc without loadavg, or whose loadavg speaks for another pid
    namespace).  A pid handed out again is a new process even if its number is known: it
    is looked at as new, so an old process's verdict never passes to the next one with its
    number."""

    name = "cpu"
    kind = "cpu"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 6.0
    top_threads = 5  # None: every thread of every process (the simulated node's model sums them)
    # reading threads costs the most of all the agent does (a listing and a stat per thread):
    # only a process that used this share of a core since the last sample has its threads
    # read, as a spinning thread holds a whole core (none, with every thread asked for)
    thread_floor_pct = 10.0
    sensor = "vllm_cpu_pct"  # the sum over the matching processes
    rescan_s = 120.0

    def __init__(self, pattern=DEFAULT_PROCESS_PATTERN, *args, **kwargs):
        Source.__init__(self, *args, **kwargs)
        self.pattern = re.compile(pattern)
        self.clk_tck = os.sysconf("SC_CLK_TCK")
        self.previous = None
        self.previous_t = None
        self.previous_threads = {}  # (pid, tid) -> (comm, ticks, cpu) at the last read of threads
        self.own_pids = {str(os.getpid())}
        self.known = {}  # pid -> (matches, monotonic time first seen, when to look again)
        self.looks = []  # heap of (when, pid): the non-matching processes to look at again
        self.matched = set()
        self.seen_last_pid = None
        self.listed_at = None  # monotonic time of the last listing of /proc
        self.prefix = os.path.join(self.proc_root, "")
        self.slow = []  # the processes whose command line the pattern ran past its time bound on
        self.verdicts = {}  # command line -> whether the pattern matches it

    @classmethod
    def from_settings(cls, settings, sys_root, proc_root):
        return cls(settings.get("process_pattern", DEFAULT_PROCESS_PATTERN), sys_root, proc_root)

    def cmdline(self, pid):
        """The command line (or the title vLLM set) of a process, None once it has gone."""
        try:
            return (
                read_bytes(self.prefix + pid + "/cmdline")
                .replace(b"\0", b" ")[:MAX_CMDLINE_BYTES]
                .decode("utf-8", "replace")
                .strip()
            )
        except OSError:
            return None

    def last_pid(self):
        """The pid the kernel handed out last (/proc/loadavg): unchanged, no process started."""
        value, _ = read_parsed(self.prefix + "loadavg", lambda text: int(text.split()[4]))
        return value

    def probe(self, numbers):
        """The processes among the pids the kernel handed out since the last sample, found
        without listing /proc: most of those numbers went to threads (whose /proc/TID is
        there to open but belongs to its process: ``Tgid`` tells) or have ended."""
        found = set()
        for number in numbers:
            pid = str(number)
            path = self.prefix + pid + "/status"
            try:  # most have ended: access() says so without an exception built (a third of the cost)
                status = read_bytes(path) if os.access(path, os.F_OK) else None
            except OSError:
                status = None
            if status is None:  # ended, or never a process
                if self.known.pop(pid, None) is not None:
                    self.matched.discard(pid)
                continue
            start = status.find(b"\nTgid:") + 6
            end = status.find(b"\n", start)
            if (
                start >= 6
                and status[start : end if end >= 0 else None].strip() == pid.encode()
                and pid not in self.own_pids
            ):
                found.add(pid)
        return found

    def matches(self, pid, cmdline):
        """Whether the pattern matches a command line: each text is matched once (a match is
        looked at every sample, its text rarely changes), within the time bound."""
        verdict = self.verdicts.get(cmdline)
        if verdict is None:
            try:
                verdict = bool(time_bounded(lambda: self.pattern.search(cmdline)))
            except MatchTimeout as error:
                verdict = False  # not counted, and said: a row without value, with the reason
                self.slow.append("process_pattern on the command line of pid %s: %s; not counted" % (pid, error))
            if len(self.verdicts) >= 4096:  # bounded: a host that starts many unlike processes
                self.verdicts.clear()
            self.verdicts[cmdline] = verdict
        return verdict

    def started(self, pid, now, uptime_ticks):
        """When a process that was there before the agent's first scan started, on the clock
        of ``now``, from its start time: one seen young is looked at again soon, as one born
        after.  A process in exec shows an empty command line (the kernel closes the old
        descriptors, so its parent's ``Popen`` has returned, before it sets the new one) and
        one just forked its parent's: taking either as old would leave it unmatched for
        ``rescan_s``.  Old where the start time cannot be read."""
        try:
            _, start = parse_stat(read_text(self.prefix + pid + "/stat"))
        except (OSError, ValueError, IndexError):
            start = None
        if uptime_ticks is None or start is None:
            return now - self.rescan_s
        return now - max(0.0, (uptime_ticks - start) / self.clk_tck)

    def look(self, pid, now, first_seen, uptime_ticks=None):
        """Read a process's cmdline, note whether it matches and, if not, when to look again
        (once it is twice as old as the agent knows it, at most ``rescan_s`` on).
        ``first_seen`` None: there at the agent's start (:meth:`started`)."""
        cmdline = self.cmdline(pid)
        if cmdline is None:  # ended
            self.known.pop(pid, None)
            self.matched.discard(pid)
            return
        matches = self.matches(pid, cmdline)
        if first_seen is None:
            first_seen = now - self.rescan_s if matches else self.started(pid, now, uptime_ticks)
        when = now + min(now - first_seen, self.rescan_s)
        self.known[pid] = (matches, first_seen, when)
        if matches:
            self.matched.add(pid)
        else:
            self.matched.discard(pid)
            heapq.heappush(self.looks, (when, pid))

    def matching_pids(self):
        now = time.monotonic()
        last_pid = self.last_pid()
        first_scan = self.listed_at is None
        new = set()
        handed_out = None if first_scan or last_pid is None else last_pid - self.seen_last_pid
        listing_due = handed_out is None or now - self.listed_at >= self.rescan_s
        # a listing costs about as much as looking at one pid in eight of those it lists
        if not listing_due and 0 < handed_out <= max(8, len(self.known) // 8):
            new = self.probe(range(self.seen_last_pid + 1, last_pid + 1))
        elif listing_due or handed_out != 0:
            listed = {entry for entry in os.listdir(self.proc_root) if entry.isdigit()} - self.own_pids
            for pid in self.known.keys() - listed:  # ended
                del self.known[pid]
                self.matched.discard(pid)
            again = handed_out_again(self.seen_last_pid, last_pid, listed & self.known.keys())
            new = (listed - self.known.keys()) | again
            self.listed_at = now
        self.seen_last_pid = last_pid
        uptime_ticks = self.boot_ticks(now) if first_scan else None
        due = []
        while self.looks and self.looks[0][0] <= now:
            due.append(heapq.heappop(self.looks))
        with alarm_raises():  # once for all the matches of this sample
            for pid in new:
                self.look(pid, now, None if first_scan else now, uptime_ticks)
            for pid in list(self.matched - new):  # a match is looked at every sample
                self.look(pid, now, self.known[pid][1])
            for when, pid in due:  # (a look pushes its next one, which may be due now: next sample)
                seen = self.known.get(pid)
                if seen is not None and not seen[0] and seen[2] == when:  # else a look since made it stale
                    self.look(pid, now, seen[1])
        return sorted(self.matched, key=int)

    def ticks(self):
        result = {}
        for pid in self.matching_pids():
            try:
                result[pid] = parse_stat(read_text(self.prefix + pid + "/stat"))
            except (OSError, ValueError, IndexError):
                continue  # the process ended between listing and reading
        return result

    def census(self, interval_s=0.5):
        """The matching processes now, each with its title and CPU over ``interval_s``: what
        discover and preflight show, so a user sees what will be summed."""
        before, start = self.ticks(), time.time()
        time.sleep(interval_s)
        after, elapsed = self.ticks(), time.time() - start
        rows = []
        for pid, (ticks, starttime) in sorted(after.items(), key=lambda kv: int(kv[0])):
            if pid in before and before[pid][1] == starttime:
                rows.append(
                    {
                        "pid": int(pid),
                        "title": (self.cmdline(pid) or "")[:120],
                        "cpu_pct": round(100.0 * (ticks - before[pid][0]) / self.clk_tck / elapsed, 1),
                    }
                )
        return {
            "pattern": self.pattern.pattern,
            "processes": rows,
            "cpu_pct": round(sum(r["cpu_pct"] for r in rows), 1),
        }

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
        rows += [("vllm_processes", None, reason) for reason in self.slow]
        self.slow = []
        rows += self.thread_rows(current, now)
        self.previous, self.previous_t = current, now
        return rows

    def thread_rows(self, current, now):
        """The busiest threads since the last sample, each its share of a core.  A process
        has its threads read where it is new (their ticks are the baseline) or used
        ``thread_floor_pct`` of a core since; an idle one's have the ticks they had; those of
        one between are dropped, so a process that rises above the floor is listed from its
        next sample on, never from ticks of another span."""
        floor = 0.0
        if self.previous is not None and self.top_threads is not None:
            floor = self.thread_floor_pct / 100.0 * self.clk_tck * (now - self.previous_t)
        read, idle = set(), set()
        for pid, (ticks, start) in current.items():
            before = (self.previous or {}).get(pid)
            if before is None or before[1] != start or ticks - before[0] >= max(floor, 1):
                read.add(pid)
            elif ticks == before[0]:
                idle.add(pid)
        threads = self.thread_ticks(read)
        threads.update((key, value) for key, value in self.previous_threads.items() if key[0] in idle)
        rows = []
        if self.previous is not None:
            elapsed = now - self.previous_t
            top = sorted(
                (
                    (ticks - self.previous_threads[key][1], key, comm, cpu)
                    for key, (comm, ticks, cpu) in threads.items()
                    if key in self.previous_threads
                ),
                reverse=True,
            )[: self.top_threads]
            for ticks, (_pid, tid), comm, cpu in top:
                if ticks > 0:
                    rows.append(("thread %s %s cpu%d" % (comm, tid, cpu), 100.0 * ticks / self.clk_tck / elapsed, ""))
        self.previous_threads = threads
        return rows

    def thread_ticks(self, pids):
        threads = {}
        for pid in pids:
            task = self.prefix + pid + "/task/"
            try:
                tids = os.listdir(task)
            except OSError:
                continue
            for tid in tids:
                try:
                    threads[(pid, tid)] = parse_thread_stat(read_text(task + tid + "/stat"))
                except (OSError, ValueError, IndexError):
                    continue
        return threads


# a sensor attribute of the hwmon sysfs interface (temp1_input, power1_average, in0_label)
SENSOR_ATTRIBUTE = re.compile(r"(?:temp|power|energy|in|curr|fan|pwm|humidity|intrusion)\d+_")


def chip_files(chip_dir, names):
    """File name -> path of one chip's attributes.  A driver that registers its chip the old
    way (``hwmon_device_register``, as ``acpi_power_meter`` did before its move to the
    hwmon_device_register_with_info API) creates ``name`` and its attributes on its own
    device, so they sit in ``hwmonN/device/``: where ``hwmonN`` holds no sensor attribute,
    the device's are read, as libsensors does (lib/sysfs.c looks in both)."""
    files = {name: os.path.join(chip_dir, name) for name in names}
    if any(SENSOR_ATTRIBUTE.match(name) for name in names):
        return files
    device_dir = os.path.join(chip_dir, "device")
    try:
        device_names = os.listdir(device_dir)
    except OSError:
        return files
    for name in device_names:
        if name == "name" or SENSOR_ATTRIBUTE.match(name):
            files.setdefault(name, os.path.join(device_dir, name))
    return files


def hwmon_chips(base):
    """(stable name, files: name -> path) of every hwmon chip under ``base`` that can be
    listed (a chip that went away, or a dangling or looping link, leaves the others), its
    files where the driver put them (:func:`chip_files`).  A chip is named
    ``<driver>@<device>`` (``nvme@nvme1``, ``k10temp@0000:00:18.3``, ``coretemp@coretemp.0``,
    ``power_meter@ACPI000D:00``) where its entry has a ``device`` link, by its driver alone
    where it has none; never by ``hwmonN``, which the kernel hands to whichever chip registers."""
    chips, taken = [], set()
    for entry in sorted(os.listdir(base), key=number_in):
        chip_dir = os.path.join(base, entry)
        try:
            files = chip_files(chip_dir, sorted(os.listdir(chip_dir)))
        except OSError:
            continue
        driver = (ThermalZones._optional(files["name"]) if "name" in files else "") or "hwmon"
        device = device_identity(chip_dir)
        chip = unique_name("%s@%s" % (driver, device) if device else driver, taken)
        taken.add(chip)
        chips.append((chip, files))
    return chips


def optional_file(files, name):
    """The text of ``files[name]`` (a chip's file), "" where it is absent or unreadable."""
    return ThermalZones._optional(files[name]) if name in files else ""


class HwmonSource(ResolvedSource):
    """A source that reads the chips of ``/sys/class/hwmon`` (:func:`hwmon_chips`)."""

    def base(self):
        return self.sys_path("class", "hwmon")

    def available(self):
        return os.path.isdir(self.base()) and bool(os.listdir(self.base()))

    def layout(self):
        """Each entry with where it and its device link lead: on a real host ``hwmonN`` is a
        link into the device's own directory, so another device under the number shows."""
        try:
            entries = sorted(os.listdir(self.base()))
        except OSError:
            return ()
        return tuple(
            (e, link_target(os.path.join(self.base(), e)), link_target(os.path.join(self.base(), e, "device")))
            for e in entries
        )


class Hwmon(HwmonSource):
    """``hwmon*/temp*_input`` with their labels (coretemp, k10temp, nvme, ...): the
    temperatures of hosts without ACPI thermal zones.  Sensor ``<chip>/<label>``."""

    name = "hwmon"
    kind = "thermal"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0

    def __init__(self, *args, **kwargs):
        HwmonSource.__init__(self, *args, **kwargs)
        self.inputs = {}

    def resolve(self):
        self.inputs = {}
        for chip, files in hwmon_chips(self.base()):
            for name in sorted(files):
                match = re.match(r"(temp\d+)_input$", name)
                if match:
                    label = optional_file(files, match.group(1) + "_label")
                    sensor = unique_name("%s/%s" % (chip, label or match.group(1)), self.inputs)
                    self.inputs[sensor] = files[name]
        return {"sensors": sorted(self.inputs)}

    def read(self, gone):
        return [(sensor,) + read_millidegrees(path, gone) for sensor, path in sorted(self.inputs.items())]


class Poller:
    """Calls ``measure()`` on a thread of its own, once per ``request()``, so a slow or hung
    tool (nvidia-smi, ipmitool) never holds up the sampling loop.  ``take()`` returns the rows
    measured since the last call, each ``(t, sensor, value, reason)`` with the time it was
    measured, not the time the loop picked it up."""

    def __init__(self, measure, name):
        self.measure = measure
        self.lock = threading.Lock()
        self.wanted = threading.Event()
        self.rows = []
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="poll " + name, daemon=True)
        self.thread.start()

    def stop(self, timeout_s):
        """End the thread after the measurement under way (if it ends within ``timeout_s``)."""
        self.stopping = True
        self.wanted.set()
        self.thread.join(timeout_s)

    def request(self):
        self.wanted.set()  # a request while a run is under way starts one more after it, not two

    def take(self):
        with self.lock:
            rows, self.rows = self.rows, []
        return rows

    def _loop(self):
        while True:
            self.wanted.wait()
            self.wanted.clear()
            if self.stopping:
                return
            try:
                rows = self.measure()
            except Exception as error:  # the thread must outlive any one bad reading
                rows = [(time.time(), "source_error", None, ("%s: %s" % (type(error).__name__, error))[:200])]
            with self.lock:
                self.rows.extend(rows)


def run_command(argv, timeout_s, started=None):
    """(t, returncode or None, stdout, stderr) of one run, t = the midpoint of the run; a run
    that could not start or timed out has returncode None and says why in stderr.
    ``started(process)`` is told of the process while it runs, so that whoever stops the
    agent can end a command still in flight."""
    start = time.time()
    try:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, universal_newlines=True
        )
    except OSError as error:
        return start, None, "", "could not run %s: %s" % (argv[0], error.strerror or error)
    if started is not None:
        started(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()  # not waited for: a command stuck in the kernel may never go
        return (start + time.time()) / 2, None, "", "%s timed out after %g s" % (argv[0], timeout_s)
    return (start + time.time()) / 2, process.returncode, stdout, stderr


def first_line(text):
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def failure_reason(category, text):
    """A short category and the first line of what the command said: ingest counts missing
    values by their reason's text, so a reason is never a command's raw output."""
    line = first_line(text)
    return ("%s: %s" % (category, line) if line else category)[:160]


# a device named in a command's error (nvidia-smi names a GPU off the bus by its PCI address)
PCI_ADDRESS = re.compile(r"(?<![0-9a-fA-F:])(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7](?![0-9a-fA-F])")


PARSE_ERROR = "_parse_error"  # the sensor of a line that is not a row: gpu_parse_error


def failure_rows(failed_sensor, returncode, stdout, stderr):
    """The missing values of a run that failed: one per device its output names (``<failed
    sensor> <PCI address>``, reason the first line naming it), else one under
    ``failed_sensor``."""
    category = "no result" if returncode is None else "exit %d" % returncode
    lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    devices = {}
    for line in lines:
        for address in PCI_ADDRESS.findall(line):
            devices.setdefault(address.lower(), failure_reason(category, line))
    if devices:
        return [("%s %s" % (failed_sensor, address), None, reason) for address, reason in sorted(devices.items())]
    return [(failed_sensor, None, failure_reason(category, "\n".join(lines)))]


class CommandSource(Source):
    """A source whose reading comes from a command (nvidia-smi, ipmitool), measured off the
    sampling loop (:class:`Poller`) with a timeout: each ``sample()`` asks for a measurement
    and returns the rows of those finished since the last one, each stamped with its own
    time ``(t, sensor, value, reason)``.  A timeout or a failure is a missing value under
    ``failed_sensor`` with the reason; ``close()`` ends a command still in flight."""

    timeout_s = 5.0
    failed_sensor = "source_error"

    def __init__(self, *args, **kwargs):
        Source.__init__(self, *args, **kwargs)
        self.poller = None
        self.running = None
        self.closed = False

    def reads_this_machine(self):
        """A command reads the machine it runs on: a simulated node (a tree under another root)
        must not report the GPUs or the power of the machine that hosts it as its own."""
        return os.path.abspath(self.sys_root) == "/"

    def command(self):
        raise NotImplementedError

    def parse(self, stdout):
        """Rows (sensor, value or None, reason) of one run's output."""
        raise NotImplementedError

    def _started(self, process):
        self.running = process
        if self.closed:  # the agent stopped while this one was being started
            process.kill()

    def measure(self):
        if self.closed:
            return []
        t, returncode, stdout, stderr = run_command(self.command(), self.timeout_s, self._started)
        self.running = None
        return [(t,) + row for row in self.rows_of(returncode, stdout, stderr)]

    def rows_of(self, returncode, stdout, stderr):
        """The rows of one run.  One GPU off the bus fails the whole run while the others'
        rows are valid: those are kept, with the failure in place of the lines that were
        not rows."""
        parsed = self.parse(stdout) if returncode is not None else []
        if returncode != 0:
            parsed = [row for row in parsed if not row[0].endswith(PARSE_ERROR)]
            parsed += failure_rows(self.failed_sensor, returncode, stdout, stderr)
        return parsed

    def sample(self):
        if self.poller is None:
            self.poller = Poller(self.measure, self.name)
        rows = self.poller.take()
        self.poller.request()
        return rows

    def close(self):
        """Kill the command in flight and wait for the poller to end: a daemon thread left
        between starting a command and hearing of it would leave the command behind."""
        self.closed = True
        process = self.running
        if process is not None and process.poll() is None:
            process.kill()
        if self.poller is not None:
            self.poller.stop(timeout_s=2.0)


GPU_QUERY = ("index", "temperature.gpu", "clocks.sm", "power.draw", "utilization.gpu")
GPU_SENSORS = ("temp_c", "sm_clock_mhz", "power_w", "util_pct")


def parse_nvidia_smi(text):
    """``nvidia-smi --query-gpu=index,temperature.gpu,clocks.sm,power.draw,utilization.gpu
    --format=csv,noheader,nounits`` -> rows; ``[N/A]`` and the like become missing."""
    rows = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(GPU_QUERY) or not fields[0].isdigit():  # a header or a message is no row
            rows.append(("gpu" + PARSE_ERROR, None, failure_reason("unexpected line", line)))
            continue
        for sensor, raw in zip(GPU_SENSORS, fields[1:]):
            try:
                rows.append(("gpu%s_%s" % (fields[0], sensor), float(raw), ""))
            except ValueError:
                rows.append(("gpu%s_%s" % (fields[0], sensor), None, "not reported: %s" % raw))
    return rows


class NvidiaGpu(CommandSource):
    name = "gpu"
    kind = "gpu"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 15.0
    failed_sensor = "gpu_error"

    def available(self):
        return self.reads_this_machine() and shutil.which("nvidia-smi") is not None

    def command(self):
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

    def available(self):
        return os.path.isfile(self.proc_path("stat"))  # a simulated node's view has none

    def sample(self):
        rows = []
        times, reason = read_parsed(self.proc_path("stat"), cpu_times)
        if times is None:
            rows.append(("busy_pct", None, "unreadable /proc/stat: %s" % reason))
        else:
            total, idle = times
            if self.previous is not None:
                d_total = total - self.previous[0]
                if d_total > 0:
                    rows.append(("busy_pct", 100.0 * (d_total - (idle - self.previous[1])) / d_total, ""))
            self.previous = times
        load, reason = read_parsed(self.proc_path("loadavg"), lambda text: float(text.split()[0]))
        rows.append(("loadavg_1m", load, "" if reason == "" else "unreadable /proc/loadavg: %s" % reason))
        return rows


def cpu_times(stat_text):
    """(total, idle) jiffies of all CPUs from /proc/stat's first line."""
    fields = [int(x) for x in stat_text.splitlines()[0].split()[1:]]
    return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0)


# ---- power ----------------------------------------------------------------------------
# Power sources write, like every source, rows ``t,sensor,value,reason``; their sensor is
# ``<domain> <quantity>`` and ingest (thermab.telemetry.power) reads everything it needs
# from that name, so no side file is involved:
#
#   <domain>  package-N, dram-N (RAPL), gpuN, node (IPMI), hwmon/<chip>/<label> (hwmon); a
#             sub-domain carries its parent before a slash (package-0/core).  What a domain
#             covers, its scope, is read from the name (domain_scope): a host total is made of
#             its node, modules or CPU, DRAM and GPU domains, never of one they overlap.
#   <quantity> W          a power reading, in watts
#             uJ, mJ      a cumulative energy counter, raw (as the hardware gives it), in µJ / mJ
#             uJ:max=N    a counter that wraps to 0 after N (RAPL's max_energy_range_uj)
#
# e.g. ``package-0 uJ:max=262143328850``, ``package-0/core uJ:max=262143328850``,
# ``gpu0 W``, ``gpu0 mJ``, ``node W``.  A reading that is missing is empty with a reason.

POWER_UNITS = ("W", "uJ", "mJ")


def power_sensor(domain, unit, wrap_max=None):
    """The agent-CSV sensor name of one power reading or counter of ``domain``."""
    if unit not in POWER_UNITS:
        raise ValueError("unit must be one of %s, not %r" % (POWER_UNITS, unit))
    return "%s %s%s" % (domain, unit, "" if wrap_max is None else ":max=%d" % wrap_max)


# What a power domain covers, from its name alone, so the agent, discover and ingest read it
# alike (docs/power.md has the sources):
#   wall    a meter outside the host (plug, PDU, BMC)       node    the whole node (IPMI DCMI)
#   module  a CPU-GPU module (superchip)
#   cpu     a CPU socket or package (RAPL, Grace socket)     gpu     one GPU (nvidia-smi)
#   dram    a package's memory (RAPL)                        rail    one supply rail of a module
#   part    a sub-domain inside another (package-0/core)    other   a reading of unknown extent
DOMAIN_SCOPES = (
    (re.compile(r"^node$"), "node"),
    # a meter outside the host (plug, PDU outlet, BMC), read by the controller, not the agent
    (re.compile(r"^wall(?:-(\d+))?$"), "wall"),
    (re.compile(r"^package(?:-?(\d+))?(?:-die-\d+)?$"), "cpu"),
    (re.compile(r"^dram(?:-?(\d+))?(?:-die-\d+)?$"), "dram"),
    (re.compile(r"^gpu-?(\d+)?$"), "gpu"),
    # NVIDIA's ACPI power meters (Grace, GH200, GB200), named by their power1_oem_info: the
    # module holds the Grace socket and its GPUs; the Grace socket holds its CPU and SysIO rails
    (re.compile(r"^hwmon/[^/]+/Module Power Socket (\d+)$"), "module"),
    (re.compile(r"^hwmon/[^/]+/Grace Power Socket (\d+)$"), "cpu"),
    (re.compile(r"^hwmon/[^/]+/(?:CPU|SysIO) Power Socket (\d+)$"), "rail"),
    # xgene-hwmon (Ampere Altra): a socket's cores and its SoC's IO, two disjoint parts of one CPU
    (re.compile(r"^hwmon/apm_xgene[^/]*/(?:CPU|IO) power$"), "cpu"),
    # INA3221 rails of a Jetson: VDD_IN is the module's input (Orin NX, Orin Nano), others parts
    (re.compile(r"^hwmon/ina3221[^/]*/VDD_IN$"), "module"),
    (re.compile(r"^hwmon/ina[^/]*/"), "rail"),
    (re.compile(r"^hwmon/"), "other"),
    (re.compile(r"/"), "part"),
)
# W: no reading of a scope lies outside [0, bound]; beyond it a value is a fault, never power
# (DGX B200 draws 14.3 kW at most, a GB300 module is capped at 2.9 kW, a B200 GPU at 1.2 kW)
PLAUSIBLE_W = {
    "wall": 50000.0,  # a meter may feed several hosts: a 3-phase 63 A PDU delivers 43.6 kW
    "node": 20000.0,
    "module": 5000.0,
    "cpu": 1500.0,
    "gpu": 2000.0,
    "dram": 1000.0,
    "rail": 1000.0,
    "part": 1500.0,
    "other": 20000.0,
}
ACPI_UNKNOWN = 0xFFFFFFFF  # ACPI 4.0 _PMM's "unknown" (mW), which the driver passes on × 1000


def domain_scope(domain: str) -> tuple[str, int | None]:
    """(scope, socket number or None) of a power domain (see :data:`DOMAIN_SCOPES`)."""
    for pattern, scope in DOMAIN_SCOPES:
        match = pattern.search(domain)
        if match:
            socket = match.group(1) if pattern.groups else None
            return scope, None if socket is None else int(socket)
    return "other", None


def watt_bound(domain):
    """W: the most a domain of this name can draw (its scope's :data:`PLAUSIBLE_W`), the one
    bound of every watt thermab takes: the agent's readings (:func:`plausible_watts`) and
    the watts ingest derives from energy counters (thermab.telemetry.power)."""
    return PLAUSIBLE_W[domain_scope(domain)[0]]


def plausible_watts(domain, watts):
    """(watts or None, reason): a reading outside its scope's bound (or not finite) is a
    missing value."""
    if not 0.0 <= watts <= watt_bound(domain):
        scope = domain_scope(domain)[0]
        return None, "implausible for a %s domain: %.1f W (bound 0-%g W)" % (scope, watts, PLAUSIBLE_W[scope])
    return watts, ""


def read_int(path):
    """(integer or None, reason) from a sysfs file: the counters are kept raw."""
    return read_parsed(path, int)


RAPL_ZONE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")


def rapl_domain(parent_name, name, index):
    """Domain of a RAPL zone from its ``name`` file: top-level zones keep theirs (package-N,
    package-N-die-D on a multi-die CPU, each die its own counter; psys), a ``dram`` zone is
    its package's name with ``dram`` for ``package`` (dram-N, dram-N-die-D), ``core``/``uncore``
    and any other sub-zone are sub-domains ``<package>/<name>`` (inside the package's energy)."""
    if name == "dram":
        if parent_name and parent_name.startswith("package-"):
            return "dram" + parent_name[len("package") :]
        return "dram-%d" % index
    if parent_name is None:
        return name or "zone-%d" % index
    return "%s/%s" % (parent_name, name or "zone-%d" % index)


class RaplPower(ResolvedSource):
    """RAPL through powercap: ``intel-rapl:N`` zones (package-N, psys) and their ``intel-rapl:N:M``
    sub-zones (core, uncore, dram); each zone's ``energy_uj`` counter, raw, wrapping at its
    ``max_energy_range_uj``.  Only the MSR zones: ``intel-rapl-mmio`` repeats the package.
    A zone is named by its ``name`` file, which stays with the package when the zones are
    numbered anew (a driver reload)."""

    name = "rapl"
    kind = "power"  # the kind of its rows in tidy/telemetry.parquet (counters become watts at ingest)
    # a counter holds all the energy between reads, so 5 s loses nothing but time resolution;
    # it must only be read more often than it wraps (262 kJ: ten minutes at 400 W)
    default_interval_s = 5.0

    def __init__(self, *args, **kwargs):
        ResolvedSource.__init__(self, *args, **kwargs)
        self.counters = {}

    def base(self):
        return self.sys_path("class", "powercap")

    def zone_entries(self):
        try:
            entries = os.listdir(self.base())
        except OSError:
            return []
        matched = [(RAPL_ZONE.match(e), e) for e in entries]
        return sorted(((int(m.group(1)), -1 if m.group(2) is None else int(m.group(2))), e) for m, e in matched if m)

    def available(self):
        return bool(self.zone_entries())

    def layout(self):
        return tuple(
            (key, entry, ThermalZones._optional(os.path.join(self.base(), entry, "name")))
            for key, entry in self.zone_entries()
        )

    def resolve(self):
        self.counters, names, details = {}, {}, []
        for (top, sub), entry, name in self.resolved_layout:
            zone_dir = os.path.join(self.base(), entry)
            domain = rapl_domain(None if sub < 0 else names.get(top), name, top)
            if sub < 0:
                names[top] = domain
            domain = unique_name(domain, {d["domain"] for d in details})
            wrap_max, why = read_int(os.path.join(zone_dir, "max_energy_range_uj"))
            sensor = power_sensor(domain, "uJ", wrap_max)
            self.counters[sensor] = os.path.join(zone_dir, "energy_uj")
            readable = os.access(self.counters[sensor], os.R_OK)
            details.append(
                {
                    "zone": entry,
                    "name": name,
                    "domain": domain,
                    "max_energy_range_uj": wrap_max,
                    "readable": readable,
                    "reason": why,
                }
            )
        return {"domains": [d["domain"] for d in details], "details": details}

    def read(self, gone):
        return [(sensor,) + read_parsed(path, int, gone) for sensor, path in sorted(self.counters.items())]


class HwmonPower(HwmonSource):
    """hwmon power channels as domains ``hwmon/<chip>/<label>`` (:meth:`chip_channels`):
    readings in W, energy counters raw in µJ, INA3221/INA2xx rails as V × A.  A domain's
    scope comes from its name (:func:`domain_scope`): NVIDIA's ACPI module and Grace socket
    meters, Altra's socket meters and a Jetson's VDD_IN make up host totals, with what they
    contain left out (thermab.telemetry.power); any other channel is reported beside them.
    ACPI's unknown reading and a value outside its scope's bound are missing, with why."""

    name = "hwmon_power"
    kind = "power"  # the kind of its rows in tidy/telemetry.parquet
    # readings, not counters: what happens between samples is lost (on spiky load a 30-min
    # phase's energy is within 1.7 % at 1 s, 3.6 % at 5 s: docs/benchmarks.md), and reading
    # a few sysfs files each second costs next to nothing
    default_interval_s = 1.0

    def __init__(self, *args, **kwargs):
        HwmonSource.__init__(self, *args, **kwargs)
        self.channels = {}

    def resolve(self):
        self.channels, details = {}, []
        for chip, files in hwmon_chips(self.base()):
            for domain, kind, paths in self.chip_channels(chip, files, self.channels):
                self.channels[power_sensor(domain, "uJ" if kind == "energy" else "W")] = paths
                details.append(
                    {
                        "domain": domain,
                        "scope": domain_scope(domain)[0],
                        "files": [os.path.relpath(path, self.base()) for path in paths],
                        "readable": all(os.access(path, os.R_OK) for path in paths),
                    }
                )
        return {"sensors": sorted(self.channels), "details": details}

    @staticmethod
    def chip_channels(chip, files, taken):
        """(domain, kind, paths) of each power channel of a chip: ``powerN_input`` (µW; the
        ``powerN_average`` where it has no input, as ACPI meters), ``energyN_input`` (µJ), and
        on INA3221/INA2xx monitors without a power file, a rail's bus voltage (mV) and current
        (mA) on the same channel.  A channel is named by its label, an ACPI meter's by its
        ``powerN_oem_info`` ("Module Power Socket 0") where it has none, else by its file."""
        channels, domains = [], {sensor.rsplit(" ", 1)[0] for sensor in taken}

        def add(label, kind, paths):
            domain = unique_name("hwmon/%s/%s" % (chip, label), domains)
            domains.add(domain)
            channels.append((domain, kind, paths))

        for name in sorted(files):
            match = re.match(r"(power|energy)(\d+)_(input|average)$", name)
            if not match:
                continue
            kind, channel, reading = match.groups()
            prefix = kind + channel
            if reading == "average" and (kind == "energy" or prefix + "_input" in files):
                continue  # the input is the reading; the average only stands in for it
            label = optional_file(files, prefix + "_label") or optional_file(files, prefix + "_oem_info")
            add(label or prefix, kind, [files[name]])
        driver = chip.split("@")[0]
        for channel in RAIL_CHANNELS.get(driver, RAIL_CHANNELS["ina2xx"] if re.match(r"ina2\d\d$", driver) else ()):
            volts, amps = "in%d_input" % channel, "curr%d_input" % channel
            if volts in files and amps in files and "power%d_input" % channel not in files:
                add(
                    optional_file(files, "in%d_label" % channel) or "in%d" % channel,
                    "rail",
                    [files[volts], files[amps]],
                )
        return channels

    def read(self, gone):
        rows = []
        for sensor, paths in sorted(self.channels.items()):
            values, reason = [], ""
            for path in paths:
                value, reason = read_parsed(path, int, gone)
                if value is None:
                    break
                values.append(value)
            if reason:
                rows.append((sensor, None, reason))
            elif values[0] in (ACPI_UNKNOWN, ACPI_UNKNOWN * 1000):  # a reading or a counter
                rows.append((sensor, None, "no reading: 0xFFFFFFFF (ACPI's unknown)"))
            elif sensor.endswith(" uJ"):
                rows.append((sensor, values[0], ""))
            elif len(values) == 2 and values[0] < 0:  # a bus voltage below 0 is a fault (× a negative current: +W)
                rows.append((sensor, None, "implausible: a rail at %d mV" % values[0]))
            elif len(values) == 2:  # a rail: mV × mA = µW
                rows.append((sensor,) + plausible_watts(sensor[:-2], values[0] * values[1] / 1e6))
            else:
                rows.append((sensor,) + plausible_watts(sensor[:-2], values[0] / 1e6))
        return rows


# the channels of a current monitor whose bus voltage (inN_input, mV) and current (currN_input,
# mA) belong to one rail: INA3221's in4-in6 are its shunt voltages and curr4 their sum, and
# INA2xx's in0 is its shunt voltage (the kernel's ina3221 and ina2xx documentation)
RAIL_CHANNELS = {"ina3221": (1, 2, 3), "ina2xx": (1,)}


GPU_POWER_QUERY = ("index", "power.draw", "total_energy_consumption")


def parse_gpu_power(text, fields=GPU_POWER_QUERY):
    """``nvidia-smi --query-gpu=index,power.draw[,total_energy_consumption] --format=csv,noheader,nounits``
    -> rows ``gpuN W`` and ``gpuN mJ`` (the counter raw, in mJ as NVML counts it); ``[N/A]`` and
    the like become missing."""
    rows = []
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields) or not values[0].isdigit():
            rows.append(("gpu" + PARSE_ERROR, None, failure_reason("unexpected line", line)))
            continue
        for field, raw in zip(fields[1:], values[1:]):
            unit = "W" if field == "power.draw" else "mJ"
            sensor = power_sensor("gpu" + values[0], unit)
            try:
                number = float(raw)
            except ValueError:
                rows.append((sensor, None, "not reported: %s" % raw))
                continue
            if unit == "W":
                rows.append((sensor,) + plausible_watts("gpu" + values[0], number))
            else:
                rows.append((sensor, int(round(number)), ""))
    return rows


class NvmlEnergy:
    """NVML's total-energy counter (mJ since the driver loaded) through ctypes, for drivers
    whose nvidia-smi has no query field for it (580 refuses ``total_energy_consumption``)."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self.check(self.lib.nvmlInit_v2())

    def check(self, code):
        if code != 0:
            raise OSError("NVML: %s" % self.lib.nvmlErrorString(code).decode(errors="replace"))

    def energy_mj(self, index):
        """(counter or None, reason) of GPU ``index`` (NVML's order is nvidia-smi's)."""
        handle, value = self.ctypes.c_void_p(), self.ctypes.c_ulonglong()
        try:
            self.check(self.lib.nvmlDeviceGetHandleByIndex_v2(self.ctypes.c_uint(index), self.ctypes.byref(handle)))
            self.check(self.lib.nvmlDeviceGetTotalEnergyConsumption(handle, self.ctypes.byref(value)))
        except OSError as error:
            return None, str(error)
        return value.value, ""


class NvidiaPower(CommandSource):
    """``power.draw`` of every GPU (nvidia-smi) and its cumulative energy counter, raw in mJ:
    from the same query where the driver's nvidia-smi has the field, else from NVML itself.
    Both run off the sampling path."""

    name = "gpu_power"
    kind = "power"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 5.0  # with the energy counter 5 s loses no energy, and each run is a process
    failed_sensor = "gpu_power_error"

    def __init__(self, *args, **kwargs):
        CommandSource.__init__(self, *args, **kwargs)
        self.fields = GPU_POWER_QUERY
        self.nvml = None
        self.nvml_error = ""

    def available(self):
        return self.reads_this_machine() and shutil.which("nvidia-smi") is not None

    def command(self):
        return ["nvidia-smi", "--query-gpu=" + ",".join(self.fields), "--format=csv,noheader,nounits"]

    def discover(self):
        """Where the counter comes from: an older or newer nvidia-smi refuses the field outright."""
        _, returncode, stdout, stderr = run_command(self.command(), self.timeout_s)
        if returncode != 0 and "total_energy_consumption" in stderr + stdout:
            self.fields = GPU_POWER_QUERY[:2]
            try:
                self.nvml = NvmlEnergy()
            except (OSError, AttributeError) as nvml_error:
                self.nvml_error = "no energy counter: nvidia-smi has no field and %s" % nvml_error
            _, returncode, stdout, stderr = run_command(self.command(), self.timeout_s)
        rows = self.rows_of(returncode, stdout, stderr)
        error = "" if returncode == 0 else failure_reason("exit %s" % returncode, stderr + "\n" + stdout)
        counter = "nvidia-smi" if len(self.fields) == 3 else ("NVML" if self.nvml else None)
        return {
            "fields": list(self.fields),
            "energy_counter": counter,
            "error": error or self.nvml_error,
            "sensors": sorted(s for s, _, _ in rows),
            "missing": {s: r for s, v, r in rows if v is None},
        }

    def parse(self, stdout):
        return parse_gpu_power(stdout, self.fields)

    def measure(self):
        rows = CommandSource.measure(self)
        if len(self.fields) == 3:
            return rows
        # the counter from NVML, each read stamped with its own time (Δenergy/Δt needs it)
        for index in sorted({s.split()[0][3:] for _, s, _, _ in rows if re.match(r"gpu\d+ ", s)}, key=int):
            reading = self.nvml.energy_mj(int(index)) if self.nvml else (None, self.nvml_error)
            rows.append((time.time(), power_sensor("gpu" + index, "mJ")) + reading)
        return rows


def parse_dcmi_power(text):
    """``ipmitool dcmi power reading`` -> [("node W", watts or None, reason)]."""
    if re.search(r"Power reading state is:\s*deactivated", text):
        return [(power_sensor("node", "W"), None, "DCMI power reading deactivated")]
    match = re.search(r"Instantaneous power reading:\s*([0-9.]+)\s*Watts", text)
    if not match:
        return [(power_sensor("node", "W"), None, "no instantaneous reading: %r" % text.strip()[:80])]
    if float(match.group(1)) <= 0:  # a node that is running draws power: 0 W is a BMC without a reading
        return [(power_sensor("node", "W"), None, "BMC reported 0 W")]
    return [(power_sensor("node", "W"),) + plausible_watts("node", float(match.group(1)))]


IPMI_DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")


class IpmiPower(CommandSource):
    """The node's power from its BMC, ``ipmitool dcmi power reading``, as domain ``node``;
    where ipmitool is installed and this user may open the IPMI device.  Off the sampling
    path, with a timeout: a BMC can take seconds to answer."""

    name = "ipmi"
    kind = "power"  # the kind of its rows in tidy/telemetry.parquet
    default_interval_s = 5.0
    timeout_s = 10.0
    failed_sensor = power_sensor("node", "W")

    def device(self):
        for path in IPMI_DEVICES:
            if os.path.exists(path):
                return path
        return None

    def available(self):
        device = self.device()
        return (
            self.reads_this_machine()
            and shutil.which("ipmitool") is not None
            and device is not None
            and os.access(device, os.R_OK | os.W_OK)
        )

    def discover(self):
        return {"device": self.device()}

    def command(self):
        return ["ipmitool", "dcmi", "power", "reading"]

    def parse(self, stdout):
        return parse_dcmi_power(stdout)


def format_value(value):
    if value is None or value == "":
        return ""
    return "%.3f" % value if isinstance(value, float) else str(value)


# The registry of sources, in sampling order: everything that needs the list reads it here.
SOURCES = (
    ThermalZones,
    Hwmon,
    CpuFrequency,
    ProcessCpu,
    SystemCpu,
    NvidiaGpu,
    RaplPower,
    HwmonPower,
    NvidiaPower,
    IpmiPower,
)


def discover_all(sys_root="/", proc_root="/proc", process_pattern=None):
    """What each available source finds at start, without sampling: preflight runs this
    on every host (``agent.py --discover``), so it sees the zones the agent will log.
    With ``process_pattern``, also the processes it matches now, with their titles and
    CPU (``processes``: which processes match is a run-time fact, so only when asked)."""
    found = {}
    for source_class in SOURCES:
        if source_class is ProcessCpu:
            continue
        source = source_class(sys_root, proc_root)
        try:
            found[source.name] = source.discover() if source.available() else None
        except Exception as error:  # one odd source must not hide what the others found
            found[source.name] = {"error": "%s: %s" % (type(error).__name__, error)}
    if process_pattern is not None:
        try:
            found["processes"] = ProcessCpu(process_pattern, sys_root, proc_root).census()
        except Exception as error:
            found["processes"] = {"error": "%s: %s" % (type(error).__name__, error)}
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
        raise SettingsError("cannot read: %s" % error.strerror) from None
    except ValueError as error:
        raise SettingsError("not JSON: %s" % error) from None
    if not isinstance(settings, dict) or not isinstance(settings.get("out_dir"), str):
        raise SettingsError("must be a JSON object with out_dir")
    pattern = settings.get("process_pattern", DEFAULT_PROCESS_PATTERN)
    try:
        re.compile(pattern)
    except (re.error, TypeError) as error:
        # this host's Python may read patterns differently from the controller's
        raise SettingsError("process_pattern %r: not a regular expression here: %s" % (pattern, error)) from None
    intervals = settings.get("intervals", {})
    for name, interval in intervals.items() if isinstance(intervals, dict) else [("intervals", intervals)]:
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not interval > 0:
            raise SettingsError("intervals.%s: %r is not a positive number of seconds" % (name, interval))
    if os.path.realpath(path) == os.path.realpath(os.path.join(settings["out_dir"], META_FILE)):
        raise SettingsError(
            "is out_dir/%s, where the agent writes what it found: name the settings file otherwise" % META_FILE
        )
    try:
        os.makedirs(settings["out_dir"], exist_ok=True)
    except OSError as error:
        raise SettingsError("out_dir %s: cannot create: %s" % (settings["out_dir"], error.strerror)) from None
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
        self.files = {}  # stem -> its CSV file, open for appending
        # a signal writes to this pipe (main() hands it to signal.set_wakeup_fd), so a SIGTERM
        # ends the wait between samples at once however long it is
        self.wake_fd, self.signal_fd = os.pipe()
        for fd in (self.wake_fd, self.signal_fd):
            os.set_blocking(fd, False)

    @staticmethod
    def _safely(call, otherwise):
        try:
            return call()
        except Exception:  # a source that cannot even say whether it is there is not
            return otherwise

    def event(self, name, detail):
        self._append("agent_events", [(time.time(), name, "", json.dumps(detail, sort_keys=True))])

    def _append(self, stem, rows):
        """Rows appended to ``<stem>.csv`` and flushed.  The file stays open between samples
        (opening it cost more than the rows); one that fails is closed and opened anew."""
        if not rows:  # a command source between measurements: no file with only a header
            return
        handle = self.files.get(stem)
        try:
            if handle is None:
                path = os.path.join(self.out_dir, stem + ".csv")
                new = not os.path.exists(path)
                handle = self.files[stem] = open(path, "a", newline="")
                if new:
                    csv.writer(handle).writerow(["t", "sensor", "value", "reason"])
            writer = csv.writer(handle)
            for row in rows:
                t, sensor, value, reason = row
                writer.writerow(["%.3f" % t, sensor, format_value(value), reason])
            handle.flush()
        except OSError:
            self.close_files(stem)
            raise

    def close_files(self, *stems):
        """Close the CSV files (``stems``, or all)."""
        for stem in stems or list(self.files):
            handle = self.files.pop(stem, None)
            if handle is not None:
                try:
                    handle.close()
                except OSError:
                    pass  # what a full disk kept from the file is lost either way

    def record(self, source):
        """One sample of one source, appended: whatever a reading does, the agent goes on."""
        try:
            rows = source.sample()
        except Exception as error:
            rows = [("source_error", None, ("%s: %s" % (type(error).__name__, error))[:200])]
        t = time.time()
        try:
            # a polled source's rows carry the time they were measured
            self._append(source.name, [row if len(row) == 4 else (t,) + tuple(row) for row in rows])
        except OSError as error:  # a full disk may free up; the next sample tries again
            sys.stderr.write("agent: cannot write %s.csv: %s\n" % (source.name, error))

    # every wake-up costs the host (some 50 µs of CPU here, docs/benchmarks.md): the loop
    # sleeps until the next sample is due, waking between only to look for the stop file
    stop_poll_s = 5.0

    def wait(self, timeout_s):
        """Sleep ``timeout_s``, or until a signal arrives."""
        if select.select([self.wake_fd], [], [], timeout_s)[0]:
            try:
                os.read(self.wake_fd, 512)
            except OSError:
                pass

    def stop_requested(self):
        stop_file = self.settings.get("stop_file")
        return self.stopping or bool(stop_file and os.path.exists(stop_file))

    def run(self):
        discovered = {}
        for source, _ in self.sources:
            try:
                discovered[source.name] = source.discover()
            except Exception as error:
                discovered[source.name] = {"error": "%s: %s" % (type(error).__name__, error)}
        meta = {
            "pid": os.getpid(),
            "version": VERSION,
            "start": time.time(),
            "sources": {s.name: i for s, i in self.sources},
            "discovered": discovered,
        }
        meta_path = os.path.join(self.out_dir, META_FILE)
        with open(meta_path + ".tmp", "w") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
        os.replace(meta_path + ".tmp", meta_path)  # whole or absent, for whoever waits on it
        self.event("agent_start", meta)
        due = {source.name: time.time() for source, _ in self.sources}
        while not self.stop_requested():
            now = time.time()
            for source, interval in self.sources:
                if now >= due[source.name]:
                    due[source.name] = now + interval
                    self.record(source)
            self.wait(max(0.05, min([d - time.time() for d in due.values()] + [self.stop_poll_s])))
        for source, _ in self.sources:
            source.close()  # a command still in flight does not outlive the agent
        self.event("agent_stop", {"pid": os.getpid()})
        self.close_files()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="agent.json with out_dir, roots, pattern, intervals")
    parser.add_argument(
        "--discover", action="store_true", help="print what the sources find (JSON) and exit, sampling nothing"
    )
    parser.add_argument("--sys-root", default="/", help="with --discover: the root of /sys")
    parser.add_argument("--proc-root", default="/proc", help="with --discover: where /proc is")
    parser.add_argument("--process-pattern", help="with --discover: list the processes it matches, with their CPU")
    args = parser.parse_args(argv)
    if args.discover:
        json.dump(
            discover_all(args.sys_root, args.proc_root, args.process_pattern), sys.stdout, indent=1, sort_keys=True
        )
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
    signal.set_wakeup_fd(agent.signal_fd)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
