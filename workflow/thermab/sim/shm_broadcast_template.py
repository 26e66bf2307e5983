# SPDX-License-Identifier: Apache-2.0
"""Shared-memory broadcast between the engine and its workers (simulated node copy).

thermab installs this file on a simulated node at vLLM's path,
``vllm/distributed/device_communicators/shm_broadcast.py``, so that the patcher,
preflight and the study's ``sed`` command meet the same anchor they meet on a real node.
The simulated server imports this file when it starts and uses the default of
``SpinCondition(busy_loop_s=...)`` as its readers' spin window; callers pass no argument,
as in vLLM.  Only the shape of the real module is kept here (no zmq, no torch).
"""

from __future__ import annotations

import threading
import time
from os import sched_yield
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zmq

_memory_fence_lock = threading.Lock()


def memory_fence() -> None:
    """Full barrier: a lock acquire/release orders shared-memory stores and loads."""
    with _memory_fence_lock:
        pass


class SpinCondition:
    """Wakes the readers of the ring buffer when the writer has published a chunk.

    While reads are frequent a reader only spins on the buffer; after ``busy_loop_s``
    without a read it goes idle and waits for a notification on the zmq socket.
    """

    def __init__(
        self,
        is_reader: bool,
        context: zmq.Context,
        notify_address: str,
        busy_loop_s: float = 1,
    ):
        self.is_reader = is_reader
        self.context = context
        self.notify_address = notify_address
        # Time of the last read, and how long to keep spinning after it.
        self.last_read = time.monotonic()
        self.busy_loop_s = busy_loop_s if is_reader else 0

    def record_read(self) -> None:
        self.last_read = time.monotonic()

    def is_spinning(self) -> bool:
        return time.monotonic() <= self.last_read + self.busy_loop_s

    def wait(self, poll) -> None:
        """Spin while reads are recent, otherwise block in ``poll`` until notified."""
        if self.is_spinning():
            sched_yield()
        else:
            poll()
