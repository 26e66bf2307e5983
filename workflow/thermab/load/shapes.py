"""The shapes of a load and how each is judged (docs/design.md, "Load shapes"): pure functions.

- ``closed``: ``users`` slots, each sending its next request the moment the last one ends;
- ``think``: the same slots, each waiting a think time drawn afresh before every request
  after its first (exponential with mean ``think_s``);
- ``rate``: an open loop, requests arriving at ``rate`` per second whatever the server
  does, the gaps between arrivals drawn from a gamma distribution of shape ``burstiness``
  (1: Poisson; below 1 burstier, above 1 more even), as ``vllm bench serve
  --request-rate --burstiness`` draws them; ``users`` is then the cap on requests in
  flight, and an arrival that finds the cap reached waits for a slot.

Draws come from streams seeded by ``seed`` and the slot (or the arrivals), never by the
arm, so every arm meets the same arrivals and think times (common random numbers).

A shape's requests carry when the shape wanted them to leave (``t_due``), the think time
drawn (``think_s``) and the time an arrival waited for a slot (``slot_wait_s``); the
client's own delay is ``t_start - t_due - slot_wait_s``: its scheduling, its prompt
building and the event loop's lag behind the other streams.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from thermab.load_levels import RATE, THINK, kind_of, value_problem

WAKEUP = "wakeup"  # the kind of a wake-up probe's record: after the load, whatever its shape
# The achieved rate (or the drawn think times' mean) is judged against the configured one
# within RATE_TOLERANCE, or within TOLERANCE_SD standard deviations of what the draw itself
# varies by over the window when that is wider (a few arrivals cannot hit 5 %).
RATE_TOLERANCE = 0.05
TOLERANCE_SD = 3.0
LATE_S = 0.05  # a request the client itself started this much after it was due is late,
MAX_LATE_SHARE = 0.01  # and more than this share late, or delayed by the cap, falls short


@dataclass(frozen=True)
class Shape:
    """One load shape; ``users``: the slots of a loop, or the cap of an open loop."""

    users: int
    rate: float | None = None
    burstiness: float = 1.0
    think_s: float | None = None
    seed: int = 0

    @property
    def kind(self) -> str:
        return kind_of(self.rate, self.think_s)

    def describe(self) -> str:
        if self.kind == RATE:
            arrivals = "Poisson" if self.burstiness == 1 else f"gamma, burstiness {self.burstiness:g}"
            return f"{self.rate:g} requests/s ({arrivals}), at most {self.users} in flight"
        if self.kind == THINK:
            return f"{self.users} users thinking {self.think_s:g} s on average"
        return f"{self.users} users, closed loop"


def shape_problem(key: str, value) -> str | None:
    """Why ``value`` cannot be the shape key ``key`` (``rate``, ``think_s``, ``burstiness``):
    each must be a finite number above 0; None where it can (or is unset)."""
    if value is None and key != "burstiness":
        return None
    return value_problem(key, value)


def arrival_stream(rate: float, burstiness: float, seed: int):
    """Arrival times in seconds from the start of the load, without end: gaps drawn from a
    gamma distribution of shape ``burstiness`` and mean ``1 / rate``."""
    rng = random.Random(f"{seed}/arrivals")
    scale = 1.0 / (rate * burstiness)
    t = 0.0
    while True:
        t += rng.gammavariate(burstiness, scale)
        yield t


def think_stream(think_s: float, seed: int, user: int):
    """The think times of slot ``user``, without end: exponential with mean ``think_s``."""
    rng = random.Random(f"{seed}/think/{user}")
    while True:
        yield rng.expovariate(1.0 / think_s)


def tolerance(expected_n: float, cv: float) -> float:
    """The relative tolerance around a mean of ``expected_n`` draws whose spread has
    coefficient of variation ``cv``: RATE_TOLERANCE, or TOLERANCE_SD standard errors when
    wider (a gamma renewal process counts with variance n·cv², an exponential mean has
    standard error 1/√n)."""
    if not expected_n > 0:
        return math.inf
    return max(RATE_TOLERANCE, TOLERANCE_SD * cv / math.sqrt(expected_n))
