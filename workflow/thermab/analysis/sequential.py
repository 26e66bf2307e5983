"""Repeats until decided (``until: decided``): where the looks fall, the α each look may
spend, the crossover order of each repeat, and when to stop.  Pure functions; the
simulation of tests/test_sequential.py checks the error rate they give.

The run adds one crossover pair of repeats at a time (the reference order, then its reverse;
for more than two arms the rows of a Williams design), so arm and position stay balanced and
the OLS arm + position fit of ``stats`` applies at every look.  After each pair every
question is tested again (``questions.answer``) at the look's α; the run stops when every
question is ``yes`` or ``no``, or at ``max_repeats``.

Error control: **alpha spending by the union bound** (Bonferroni over the looks).  Look k
tests at αₖ with Σ αₖ = α, so the chance of a wrong ``yes`` at any look is at most α
whatever the looks' correlation, with the exact t quantile of each look's residual degrees
of freedom.  Looks with fewer than ``MIN_DF`` residual df spend nothing (a t quantile on 1 df
is ±6.3 at 5 %: such a look cannot decide, so its α would be wasted); the rest share α
equally.  Why not the alternatives (README, "Repeats until decided"): group-sequential
boundaries (O'Brien–Fleming, Pocock via Lan–DeMets spending, e.g. spotify-confidence) are
exact for normal statistics with known variance, not for t statistics on 1–13 df; anytime-
valid confidence sequences (confseq, savvi) allow unlimited looks but are far wider at the
4–8 phases per arm a thermal study affords.  The union bound is conservative (a wrong-yes
rate of about 0.04 at α = 0.05 in the simulation) and needs no library beyond statsmodels'
t machinery.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from thermab.analysis.questions import ALPHA, UNDECIDED
from thermab.experiment.plan import order_of_repeat, phases, williams_orders  # noqa: F401 (re-exported)
from thermab.layout import RunDir

MIN_DF = 3


def pair_size(order: str) -> int:
    """Repeats per balanced block: 2 for two arms (AB then BA), the Williams rows otherwise."""
    return len(williams_orders(order))


def looks(order: str, max_repeats: int) -> list[int]:
    """The repeats after which the questions are tested: after every balanced block, and at
    ``max_repeats``."""
    block = pair_size(order)
    points = list(range(block, max_repeats + 1, block))
    return points if points and points[-1] == max_repeats else points + [max_repeats]


def residual_df(arms: int, repeats: int) -> int:
    """Residual df of ``value ~ arm + position`` over ``repeats`` repeats of every arm."""
    return arms * repeats - arms - 1


def look_alphas(order: str, max_repeats: int, alpha: float = ALPHA) -> dict[int, float]:
    """repeat → the one-sided α its look spends (zero below MIN_DF residual df); they sum to α."""
    points = looks(order, max_repeats)
    spending = [r for r in points if residual_df(len(order), r) >= MIN_DF] or points[-1:]
    return {r: (alpha / len(spending) if r in spending else 0.0) for r in points}


def look_alpha(order: str, max_repeats: int, repeats: int, alpha: float = ALPHA) -> float:
    """The α of the look at ``repeats`` (the last look's at or before it; 0 before the first)."""
    spent = {r: a for r, a in look_alphas(order, max_repeats, alpha).items() if r <= repeats}
    return spent[max(spent)] if spent else 0.0


def decided(verdicts) -> bool:
    return all(v != UNDECIDED for v in verdicts)


def next_repeats(order: str, max_repeats: int, repeats: int, verdicts) -> int | None:
    """The repeats to reach next, or None to stop: every question decided, or max_repeats."""
    if decided(verdicts) or repeats >= max_repeats:
        return None
    return min(max_repeats, next(r for r in looks(order, max_repeats) if r > repeats))


def completed_repeats(run_dir: Path, order: str) -> int:
    """Repeats whose every phase has its phase.json, counted from the first."""
    done = {phase.id for phase in phases(order, 100, crossover=True)
            if RunDir(run_dir).phase(phase.id).phase_json.exists()}
    rep = 0
    while all(f"rep{rep + 1}-{arm}" in done for arm in order) and rep < 100:
        rep += 1
    return rep


def resume_repeats(run_dir: Path, order: str, max_repeats: int) -> int:
    """The repeats this invocation of an ``until: decided`` run should reach, from what is on
    disk: the first look not yet run, or, where the look's questions.csv is written, the
    next look it asks for (the same look when it is decided or the cap is reached).  So an
    interrupted run picks up where it stopped."""
    done = completed_repeats(run_dir, order)
    points = looks(order, max_repeats)
    target = next((r for r in points if r >= done), points[-1])
    answers_path = RunDir(run_dir).table("questions")
    if done >= target and answers_path.exists():
        answers = pd.read_csv(answers_path)
        if len(answers) and answers["phases_per_arm"].max() >= target:
            return next_repeats(order, max_repeats, target, answers["verdict"]) or target
    return target
