"""A host's clock against the controller's, NTP-style.

One exchange: the controller notes its clock (``sent``), asks, the host answers with its
own clock (``remote``), the controller notes the arrival (``received``).  Whatever the
split of the round trip between the two directions, the host read its clock somewhere
inside it, so ``remote - (sent + received) / 2`` is the offset within half the round trip.
Of several exchanges the one with the smallest round trip bounds it best.

The host answers from one long-lived command whose only work per line is reading its
clock, so neither the SSH session set-up nor the user's shell start-up sits inside a
timed exchange (they biased the old single ``date`` by tens of milliseconds)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from thermab.hosts.transport import TransportError

SAMPLES = 8
REPLY_TIMEOUT_S = 10.0

# per line read, the host's clock; the first that works on the host is used
DATE_LOOP = "while read -r _; do date +%s.%N; done"


def python_loop(python: str) -> str:
    """For hosts whose ``date`` has no ``%N`` (BusyBox, BSD)."""
    script = "import sys, time\nwhile sys.stdin.readline():\n    print('%.6f' % time.time(), flush=True)"
    return f"{shlex.quote(python)} -c {shlex.quote(script)}"


@dataclass(frozen=True)
class Sample:
    sent: float  # controller clock
    remote: float  # host clock
    received: float  # controller clock

    @property
    def round_trip_s(self) -> float:
        return self.received - self.sent


@dataclass(frozen=True)
class Offset:
    """Host clock minus controller clock, within ± ``uncertainty_s``."""

    offset_s: float
    uncertainty_s: float
    samples: int


def estimate(samples: list[Sample]) -> Offset:
    best = min(samples, key=lambda s: s.round_trip_s)
    return Offset(best.remote - (best.sent + best.received) / 2, best.round_trip_s / 2, len(samples))


def drift(start: Offset, end: Offset) -> float | None:
    """How far the offset moved between two measurements, when more than their
    uncertainties together explain; else None."""
    moved = end.offset_s - start.offset_s
    return moved if abs(moved) > start.uncertainty_s + end.uncertainty_s else None


def exchange(
    send: Callable[[bytes], None], readline: Callable[[], str], n: int, now: Callable[[], float] = time.time
) -> list[Sample]:
    """``n`` timed exchanges over a line channel to one of the loops above."""
    samples = []
    for _ in range(n):
        sent = now()
        send(b"\n")
        reply = readline()
        received = now()
        samples.append(Sample(sent, float(reply), received))
    return samples


def _measure_with(transport, command: str, n: int) -> Offset:
    lines = transport.open_lines(command)
    try:
        exchange(lines.send, lambda: lines.readline(REPLY_TIMEOUT_S), 1)  # the loop has started
        return estimate(exchange(lines.send, lambda: lines.readline(REPLY_TIMEOUT_S), n))
    finally:
        lines.close()


def measure(transport, n: int = SAMPLES, python: str = "python3") -> Offset:
    """The offset of the host behind ``transport`` (see ``Transport.open_lines``)."""
    try:
        return _measure_with(transport, DATE_LOOP, n)
    except ValueError as error:  # not a clock with fractions: date without %N
        reason = f"date +%s.%N: {error}"
    try:
        return _measure_with(transport, python_loop(python), n)
    except (ValueError, TransportError) as error:
        raise TransportError(
            transport.host, f"no clock reading with fractions of a second ({reason}; {python}: {error})"
        ) from None
