"""A simulated node's CPU, in GB10 cores, and the /proc view that reports it.

The nodes of the simulated cluster share this machine's cores (two of them on a small CI
box) with each other, the load generator and anything else running.  What their processes
really use of those cores says nothing about a GB10: a spinning reader that owns a Grace
core there gets a slice of a shared one here, and the other node's spin would take it.  So
each simulated process *accounts* the CPU its GB10 counterpart would use, thread by thread,
in seconds of a GB10 core:

- a reader of a shared-memory queue: from each message it reads until it parks, that is
  ``busy_loop_s`` later unless the next message came first (on GB10 the thread works or
  spins all that time; here it blocks on a pipe, see :mod:`thermab.sim.shm`);
- host work with a known cost on GB10 (an engine step, a token streamed): that cost;
- threads that wait on the GPU by polling (CUDA stream sync, NCCL proxies): a share of a
  core for every second the node's GPU has work.

Nothing measured on this machine enters, so another node's processes, or any other work
here, cannot move a node's numbers.  The numbers and what they stand for are in
:mod:`thermab.sim.vllm`.

Each process publishes its account as the kernel would: ``ROOT/proc/PID/stat``,
``ROOT/proc/PID/task/TID/stat`` and ``ROOT/proc/PID/cmdline``, rewritten every
``WRITE_S``.  The stat lines are the process's real ones with utime set to the accounted
ticks, stime to 0 and, for threads, ``processor`` to the GB10 core the thread runs on;
``ROOT/proc/uptime`` links to the real one, so start times keep their meaning.  The
telemetry agent reads this view with ``proc_root = ROOT/proc`` exactly as it reads
``/proc`` on a real node (the monitor sets that for simulated hosts), and the thermal model
(:mod:`thermab.sim.thermal`) heats the node with what the same reader finds there: what the
agent reports as ``vllm_cpu_pct`` and what the zones heat with are one number.

Where threads run: every thread sits on a performance core of cluster 0 or 1 and moves now
and then (``placement`` in sim.json: mean dwell in the study's seconds, share of the time
on cluster 1), as the GB10 scheduler moves the spinning threads in the study (see
:mod:`thermab.sim.zones`).  A view whose process is gone (killed) is removed by
:func:`thermab.sim.node.prune`, which the thermal model runs every tick.
"""

from __future__ import annotations

import atexit
import math
import os
import random
import shutil
import threading
import time
from pathlib import Path

from thermab.sim import node

WRITE_S = 0.05  # the agent's 1-s samples and the model's 0.5-s ticks see the account to ±0.05 s
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Thread:
    """The GB10 core time of one thread: finished work plus a busy span in progress."""

    def __init__(self, name: str, tid: int, core: int):
        self.name = name
        self.tid = tid
        self.core = core
        self._seconds = 0.0
        self._since = self._until = None
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds

    def begin(self, until: float) -> None:
        """Busy from now until ``until`` (time.monotonic) unless :meth:`end` comes first."""
        with self._lock:
            self._since, self._until = time.monotonic(), until

    def end(self) -> None:
        with self._lock:
            self._seconds += self._running(time.monotonic())
            self._since = self._until = None

    def _running(self, now: float) -> float:
        return 0.0 if self._since is None else max(0.0, min(now, self._until) - self._since)

    def seconds(self) -> float:
        with self._lock:
            return self._seconds + self._running(time.monotonic())


class Account:
    """The accounted threads of this process and the writer of its /proc view.  Make it in
    the process it describes (after a fork), declare its threads, then :meth:`start`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        settings = node.load_settings(self.root)
        self.pid = os.getpid()
        self.dir = node.proc_dir(self.root) / str(self.pid)
        self.threads: list[Thread] = []
        performance = settings["performance_policies"]
        half = settings["cores"] // 2
        self.cores = ([c for c in performance if c < half], [c for c in performance if c >= half])
        placement = settings["placement"]
        self.dwell_s = placement["dwell_s"] / settings["time_compression"]
        self.cluster1_share = placement["cluster1_share"]
        stat = Path("/proc/self/stat").read_text()
        self._stat_head = stat[: stat.rindex(")") + 2]  # "pid (comm) "
        self._stat_fields = stat[stat.rindex(")") + 2 :].split()
        self._cmdline = Path("/proc/self/cmdline").read_bytes()
        self._rng = random.Random()

    def thread(self, name: str) -> Thread:
        """A new accounted thread: the first is the process's main thread (tid = pid); the
        others stand for threads this emulator does not run, so their ids are made up."""
        thread = Thread(name, self.pid * 10 + len(self.threads) if self.threads else self.pid, self._place())
        self.threads.append(thread)
        return thread

    def _place(self) -> int:
        cluster = 1 if self._rng.random() < self.cluster1_share else 0
        return self._rng.choice(self.cores[cluster])

    def start(self) -> None:
        """Publish the view (built aside and renamed into place, so that nobody sees it
        half made) and keep it current.  A node rooted at / (a whole container or machine
        given over to it) has the real /proc for its view: nothing to publish."""
        if self.dir.parent.resolve() == Path("/proc"):
            return
        building = self.dir.with_name(".%d.new" % self.pid)
        shutil.rmtree(building, ignore_errors=True)
        for thread in self.threads:
            (building / "task" / str(thread.tid)).mkdir(parents=True)
        node.write_atomic(building / "cmdline", self._cmdline)
        self.write(building)
        shutil.rmtree(self.dir, ignore_errors=True)  # a view left by an earlier process of this pid
        os.rename(building, self.dir)
        atexit.register(self.remove)
        threading.Thread(target=self._run, name="proc-view", daemon=True).start()

    def _run(self) -> None:
        move = 1.0 - math.exp(-WRITE_S / self.dwell_s)
        while True:
            time.sleep(WRITE_S)
            for thread in self.threads:
                if self._rng.random() < move:
                    thread.core = self._place()
            try:
                self.write()
            except FileNotFoundError:
                return  # the node's view was removed: the node is being torn down

    def _stat(self, head: str, ticks: int, core: int) -> str:
        fields = list(self._stat_fields)
        fields[11], fields[12] = str(ticks), "0"  # utime, stime
        fields[36] = str(core)  # processor
        return head + " ".join(fields) + "\n"

    def write(self, directory: Path | None = None) -> None:
        directory = directory or self.dir
        total = 0
        for thread in self.threads:
            ticks = int(thread.seconds() * CLK_TCK)
            total += ticks
            node.write_atomic(
                directory / "task" / str(thread.tid) / "stat",
                self._stat("%d (%s) " % (thread.tid, thread.name), ticks, thread.core),
            )
        node.write_atomic(directory / "stat", self._stat(self._stat_head, total, self.threads[0].core))

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
