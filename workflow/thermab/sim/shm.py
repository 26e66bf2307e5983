"""A shared-memory message queue whose reader waits the way vLLM's ``SpinCondition`` does.

One writer process and one reader process share a ring of fixed-size slots and two
counters (messages written, messages read).  After every read the reader keeps
busy-polling the written counter for ``busy_loop_s``; only after that long without a
message does it park on a pipe that the writer pokes after each write.  With vLLM's stock
``busy_loop_s = 1`` a reader that gets a message at least once a second never parks and
burns a whole core; with 0.002 it sleeps between messages and pays a wake-up latency.

The mapping is anonymous and shared, so the queue must be created before ``fork`` and
needs no name, no resource tracker and no clean-up when a node is killed.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import struct
import threading
import time

COUNTERS = struct.Struct("=QQ")  # written, read: each has exactly one writing process
LENGTH = struct.Struct("=I")
FULL_RETRY_S = 0.0005

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

    def __init__(self, busy_loop_s: float, slots: int = 4, slot_bytes: int = 64 * 1024):
        self.busy_loop_s = busy_loop_s
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._buf = mmap.mmap(-1, COUNTERS.size + slots * (LENGTH.size + slot_bytes))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.last_read = time.monotonic()

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
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # pipe full: it is readable anyway, so a parked reader still wakes

    def get(self, timeout: float | None = None):
        """Next message; spins for ``busy_loop_s`` after the previous read, then parks."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            written, read = self._counters()
            if written > read:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError("no message within %.3f s" % timeout)
            if now - self.last_read < self.busy_loop_s:
                os.sched_yield()  # as vLLM: spin, but let a runnable neighbour have the core
            else:
                self._park(deadline)
        memory_fence()
        offset = self._slot_offset(read)
        (length,) = LENGTH.unpack_from(self._buf, offset)
        obj = pickle.loads(self._buf[offset + LENGTH.size:offset + LENGTH.size + length])
        memory_fence()
        struct.pack_into("=Q", self._buf, 8, read + 1)
        self.last_read = time.monotonic()
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
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        select.select([self._wake_r], [], [], wait)

    def close(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._buf.close()
