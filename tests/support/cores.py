"""The cores to itself, for a measurement held to the study's numbers (tests/conftest.py's
``ALONE``). The real vLLM's AB run measures CPU shares and a throughput difference between
arms minutes apart, so no whole run may run beside it (their servers add load that moves from
arm to arm, and the default process pattern counts their ``thermab.sim.vllm serve`` as vLLM,
by design: discover finds them). The default simulated run is compared with the study's
published heat within a degree or so, and a busy machine cools its twin by about that much
(docs/simulation.md). Whole runs share the cores with each other; one alone waits for the
whole runs running to end and keeps new ones waiting until it is done (a turnstile, so a
stream of whole runs cannot starve it).

Two lock files in the temporary directory, taken with ``flock``, so pytest-xdist's workers
(and another test session on this machine) agree; the kernel drops a lock whose holder dies."""

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOM = Path(tempfile.gettempdir()) / "thermab-tests-cores.lock"
TURNSTILE = Path(tempfile.gettempdir()) / "thermab-tests-cores.turnstile"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


@contextmanager
def shared():
    """A whole run: beside other whole runs, never beside one alone."""
    turnstile, room = _open(TURNSTILE), _open(ROOM)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # waits while the real vLLM is waiting or running
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(room, fcntl.LOCK_SH)
        yield
    finally:
        os.close(room)  # closing drops the lock
        os.close(turnstile)


class Alone:
    """A hold on the cores alone, from its first test's setup to its last's teardown."""

    def __init__(self):
        self.room = None

    def take(self) -> None:
        if self.room is not None:
            return
        turnstile, self.room = _open(TURNSTILE), _open(ROOM)
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(self.room, fcntl.LOCK_EX)
        finally:
            os.close(turnstile)  # new whole runs wait on the room from here on

    def give_back(self) -> None:
        if self.room is not None:
            os.close(self.room)
            self.room = None
