"""What a server start draws: the drafter's acceptance and the kernels' speed.

A real server's speed moves between restarts although its setting and its output text do
not: the target's logits are not bit-identical from one start to the next, near-ties flip,
and the drafter accepts a different share of its drafts (vLLM's MTP drafter, throughput CV
across restarts 9.85 %, 19.65 % and 7.50 % at 1, 2 and 4 streams); a fresh kernel autotune
picks other kernels (a few % of step time).  The simulated server draws both once per
start (:func:`draw`): the acceptance of each of the ``MTP_DRAFT_TOKENS`` draft positions,
around ``ACCEPTANCE`` on the logit scale (one shift shared by every position, the restart's,
plus a little of each position's own), and a log-normal factor on the step time.  The
spreads are chosen so that raw output throughput at 4 users has a restart CV of about 7.5 %
(:func:`throughput_cv`; docs/simulation.md gives the calibration and its sources).

``THERMAB_SIM_DRAFT_ACCEPTANCE`` (:data:`ENV_ACCEPTANCE`) set in the server's environment
replaces the drawn acceptance by that probability at every position, so that a config
whose setting is that variable (``setting.method: env``) makes arms that really differ in
acceptance.  Pure functions: the server gives them its random stream.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MTP_DRAFT_TOKENS = 5  # the study's drafter proposed 5 tokens a step
ACCEPTANCE = 0.6  # each drafted token accepted with this chance, while the previous one was
# Restart spreads (docs/simulation.md): the logit shift shared by every position carries the
# restart's acceptance, the per-position part keeps positions from moving in lockstep, and
# the step factor is the kernel choice.
ACCEPTANCE_LOGIT_SD = 0.14
POSITION_LOGIT_SD = 0.05
STEP_FACTOR_SD = 0.025  # of log step time
ENV_ACCEPTANCE = "THERMAB_SIM_DRAFT_ACCEPTANCE"


@dataclass(frozen=True)
class StartDraw:
    """One server start: each draft position's acceptance probability (while the previous
    position was accepted) and the factor on every step's GPU time."""

    acceptance: tuple[float, ...]
    step_factor: float

    def describe(self) -> str:
        return "draft acceptance %s, step time x%.3f" % (
            ", ".join("%.3f" % p for p in self.acceptance),
            self.step_factor,
        )


FIXED = StartDraw((ACCEPTANCE,) * MTP_DRAFT_TOKENS, 1.0)  # restart variance off


def _logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def draw(
    rng: random.Random,
    acceptance: float = ACCEPTANCE,
    acceptance_logit_sd: float = ACCEPTANCE_LOGIT_SD,
    position_logit_sd: float = POSITION_LOGIT_SD,
    step_factor_sd: float = STEP_FACTOR_SD,
    positions: int = MTP_DRAFT_TOKENS,
) -> StartDraw:
    """One start's draw from ``rng``."""
    centre = math.log(acceptance / (1 - acceptance)) + rng.gauss(0.0, acceptance_logit_sd)
    per_position = tuple(_logistic(centre + rng.gauss(0.0, position_logit_sd)) for _ in range(positions))
    return StartDraw(per_position, math.exp(rng.gauss(0.0, step_factor_sd)))


def parse_acceptance(text: str) -> float:
    """``THERMAB_SIM_DRAFT_ACCEPTANCE``'s value: a probability in [0, 1]; ValueError saying
    why not."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError("%s=%r is not a number" % (ENV_ACCEPTANCE, text)) from None
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError("%s=%r is not a probability in [0, 1]" % (ENV_ACCEPTANCE, text))
    return value


def start_draw(rng: random.Random, varies: bool, environ) -> StartDraw:
    """The draw a server start runs with: :func:`draw` when restart variance is on, else
    :data:`FIXED`; the acceptance replaced by ``THERMAB_SIM_DRAFT_ACCEPTANCE`` where
    ``environ`` sets it (ValueError on a bad value)."""
    chosen = draw(rng) if varies else FIXED
    text = environ.get(ENV_ACCEPTANCE)
    if text is None or text == "":
        return chosen
    return StartDraw((parse_acceptance(text),) * len(chosen.acceptance), chosen.step_factor)


def acceptance_length(acceptance) -> float:
    """Expected tokens a drafting step yields for one request: one, plus the drafted
    tokens accepted in a row (vLLM's mean acceptance length, 1 + accepted / drafts)."""
    length, chain = 1.0, 1.0
    for p in acceptance:
        chain *= p
        length += chain
    return length


def throughput_cv(rng: random.Random, starts: int = 20000, **spreads) -> float:
    """CV of the steady decode throughput across starts (acceptance length over step time):
    what the draw alone gives a closed loop whose batch hides the host's work."""
    speeds = []
    for _ in range(starts):
        start = draw(rng, **spreads)
        speeds.append(acceptance_length(start.acceptance) / start.step_factor)
    mean = sum(speeds) / len(speeds)
    sd = math.sqrt(sum((s - mean) ** 2 for s in speeds) / (len(speeds) - 1))
    return sd / mean
