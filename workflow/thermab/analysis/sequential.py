"""Repeats until decided (``until: decided``): where the looks fall, the α each look may
spend, the crossover order of each repeat, and when to stop.  Pure functions; the
simulation of tests/integration/test_sequential.py checks the error rate they give.

The run adds one repeat at a time in crossover order (the reference order, then its reverse;
for more than two arms the rows of a Williams design in turn), and from the first repeat
whose arm + position fit of ``stats`` has ``MIN_DF`` residual df every question is tested
again (``questions.answer``) at the look's α after each repeat; the position term takes up
the imbalance of a repeat past a balanced block.  The run stops when every question is
``yes`` or ``no``, or at ``max_repeats``.

Error control: **a group-sequential boundary by Lan–DeMets alpha spending, the Pocock-type
function** α(t) = α·ln(1 + (e − 1)t) (``METHOD``), t the information fraction of a look:
it spends α nearly evenly, so the few looks a cluster-time budget reaches can decide
(docs/statistics.md, "Repeats until decided", measures it against O'Brien–Fleming-type
spending, which keeps α for looks a budget may never reach).  The boundary zₖ of look k
is found so that, with no true difference, the
chance of a first crossing at look k is α(tₖ) − α(tₖ₋₁); those chances come from the joint
normal law of the looks' statistics (corr √(tⱼ/tₖ)), integrated numerically on a grid (the
recursion of Armitage, McPherson and Rowe, with scipy's normal law, trapezoid rule and
Brent's root finder).  Each look then tests at the nominal one-sided α′ₖ = 1 − Φ(zₖ) with
the exact t quantile of its residual degrees of freedom (the nominal-significance-level use
of a z boundary for t statistics).

The information fraction is measured in **residual degrees of freedom less one**
((dfₖ − 1) / (df − 1) at ``max_repeats``), not in repeats, because the looks' t statistics
estimate the variance afresh: on 3–13 df they correlate less than the z statistics'
√(rⱼ/rₖ) (simulated: 0.78 between 4 and 6 repeats of two arms, where √(4/6) = 0.82), and
their joint tails are heavier than the normal law the boundary is computed on.  Measured by
simulation (tests/integration/test_sequential.py and test_decision_time.py, looks after
every repeat from 3): a boundary built on repeats lets 0.0575 through in 50,000 null
experiments, one on dfₖ / df 0.0527 in 100,000 (95 % Wilson 0.0513–0.0541), and one on
(dfₖ − 1) / (df − 1) 0.0500 (0.0487–0.0514) at 8 repeats and at 16; it also makes the
looks' nominal levels rise from each look to the next, so a later look never tests the same
phases at a smaller α than an earlier one.  The scale is thus calibrated, not derived: a
rule with other looks would be measured again.  There are no looks below
``MIN_DF`` residual df (a t quantile on 1 df is ±6.3 at 5 %: such a look cannot decide;
``config.first_testing_repeats``).  The O'Brien–Fleming-type function
α(t) = 2 − 2Φ(z₁₋α/₂ / √t) and the union bound (Bonferroni: equal shares summing
to α) are kept as ``METHODS`` for that simulation's comparison (docs/statistics.md,
"Repeats until decided").  Why not a library: spotify-confidence's boundaries are this Lan–DeMets
computation for z statistics; anytime-valid confidence sequences (confseq, savvi) allow
unlimited looks but are far wider at the 4–8 phases per arm a thermal study affords.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy import integrate, optimize, stats as scipy_stats

from thermab.analysis.questions import ALPHA, NO, UNDECIDED, YES
from thermab.config import MIN_DF as MIN_DF, read_bounded, residual_df as residual_df  # re-exported
from thermab.errors import UserError
from thermab.experiment.plan import (  # re-exported: the looks' arithmetic is read here
    looks as looks,
    order_of_repeat as order_of_repeat,
    pair_size as pair_size,
    phases as phases,
    williams_orders as williams_orders,
)
from thermab.layout import RunDir
from thermab.load_levels import Level

FloatArray = npt.NDArray[np.float64]

OBRIEN_FLEMING, POCOCK, BONFERRONI = "obrien_fleming", "pocock", "bonferroni"
METHODS = (OBRIEN_FLEMING, POCOCK, BONFERRONI)
METHOD = POCOCK
METHOD_WORDS = {OBRIEN_FLEMING: "O'Brien–Fleming-type", POCOCK: "Pocock-type", BONFERRONI: "Bonferroni"}
DF_LESS_ONE, DF, REPEATS = "df_less_one", "df", "repeats"  # the information scales (module docstring)
INFORMATION = DF_LESS_ONE
GRID_POINTS = 601  # per look: the boundaries to about 1e-5 in z (tests/integration/test_sequential.py checks 1e-4)


def spent(fraction: float, alpha: float = ALPHA, method: str = METHOD) -> float:
    """The one-sided α spent by information fraction ``fraction`` (0–1): Lan–DeMets spending."""
    if fraction <= 0:
        return 0.0
    fraction = min(fraction, 1.0)
    if method == OBRIEN_FLEMING:
        return float(2 * scipy_stats.norm.sf(scipy_stats.norm.isf(alpha / 2) / math.sqrt(fraction)))
    if method == POCOCK:
        return float(alpha * math.log(1 + (math.e - 1) * fraction))
    raise ValueError(f"no spending function {method!r}: one of {OBRIEN_FLEMING}, {POCOCK}")


def boundaries(fractions: Sequence[float], alpha: float = ALPHA, method: str = METHOD) -> list[float]:
    """The one-sided z boundaries of looks at increasing information ``fractions``: with no
    true difference, the chance of a first crossing at look k is spent(tₖ) − spent(tₖ₋₁).
    The density of the score Sₖ = Zₖ√tₖ on the continuation region is carried from look to
    look (Sₖ − Sₖ₋₁ ~ N(0, tₖ − tₖ₋₁)) and integrated on a grid."""
    norm = scipy_stats.norm
    bounds: list[float] = []
    carried: tuple[FloatArray, FloatArray] | None = None  # the last look's grid and density on it
    previous_t, previous_spent = 0.0, 0.0
    for t in fractions:
        step, target = t - previous_t, spent(t, alpha, method) - previous_spent
        if carried is None:  # the first look: a plain normal tail
            z = float(norm.isf(target))
        else:
            sd = math.sqrt(step)

            def crossing(
                z: float,
                carried: tuple[FloatArray, FloatArray] = carried,
                sd: float = sd,
                t: float = t,
                target: float = target,
            ) -> float:
                grid, density = carried
                return float(integrate.trapezoid(density * norm.sf((z * math.sqrt(t) - grid) / sd), grid)) - target

            z = float(optimize.brentq(crossing, -10.0, 40.0, xtol=1e-10))
        upper = z * math.sqrt(t)
        new_grid = np.linspace(min(-10.0 * math.sqrt(t), upper - 1.0), upper, GRID_POINTS)
        density: FloatArray
        if carried is None:
            density = norm.pdf(new_grid, scale=math.sqrt(t))
        else:
            grid, old_density = carried
            # the trapezoid rule over the old grid as one product: density × weights, by the kernel
            weights = np.full(len(grid), grid[1] - grid[0])
            weights[[0, -1]] /= 2
            gap = (new_grid[:, None] - grid[None, :]) / math.sqrt(step)
            density = np.exp(-0.5 * gap * gap) @ (weights * old_density) / math.sqrt(2 * math.pi * step)
        carried, previous_t, previous_spent = (new_grid, density), t, previous_spent + target
        bounds.append(z)
    return bounds


def information_fractions(
    order: str, max_repeats: int, repeats: Iterable[int], information: str = INFORMATION
) -> list[float]:
    """The information fractions of looks at ``repeats``: residual df less one over the last
    look's (``df_less_one``, the rule), residual df over the last look's (``df``), or
    repeats over ``max_repeats`` (``repeats``, the textbook's for a known variance)."""
    if information == REPEATS:
        return [r / max_repeats for r in repeats]
    # a cap below MIN_DF has its one look, at the whole of the information
    less = 1 if information == DF_LESS_ONE and residual_df(len(order), max_repeats) > 1 else 0
    last = residual_df(len(order), max_repeats) - less
    return [(residual_df(len(order), r) - less) / last for r in repeats]


def look_alphas(
    order: str,
    max_repeats: int,
    alpha: float = ALPHA,
    method: str = METHOD,
    information: str = INFORMATION,
    points: list[int] | None = None,
) -> dict[int, float]:
    """repeat → the nominal one-sided α its look tests at (zero below MIN_DF residual df).
    Spending methods: 1 − Φ(zₖ) of the Lan–DeMets boundary over the looks that test, at
    their ``information_fractions``; ``bonferroni``: equal shares summing to α.  ``points``:
    the looks' repeats, ``looks`` where None (the simulations compare other schedules)."""
    points = looks(order, max_repeats) if points is None else points
    testing = [r for r in points if residual_df(len(order), r) >= MIN_DF] or points[-1:]
    if method == BONFERRONI:
        nominal = [alpha / len(testing)] * len(testing)
    else:
        z = boundaries(information_fractions(order, max_repeats, testing, information), alpha, method)
        nominal = [float(scipy_stats.norm.sf(bound)) for bound in z]
    levels = dict(zip(testing, nominal, strict=False))
    return {r: levels.get(r, 0.0) for r in points}


def look_alpha(order: str, max_repeats: int, repeats: int, alpha: float = ALPHA, method: str = METHOD) -> float:
    """The α of the look at ``repeats`` (the last look's at or before it; 0 before the first)."""
    levels = {r: a for r, a in look_alphas(order, max_repeats, alpha, method).items() if r <= repeats}
    return levels[max(levels)] if levels else 0.0


def decided(verdicts: Iterable[str]) -> bool:
    return all(v != UNDECIDED for v in verdicts)


def next_repeats(order: str, max_repeats: int, repeats: int, verdicts: Iterable[str]) -> int | None:
    """The repeats to reach next, or None to stop: every question decided, or max_repeats."""
    if decided(verdicts) or repeats >= max_repeats:
        return None
    return min(max_repeats, next(r for r in looks(order, max_repeats) if r > repeats))


def completed_repeats(run_dir: Path, order: str, every: list[Level] | None = None) -> int:
    """Repeats whose every phase (every level's, ``every`` the levels, ``plan.levels``, or
    None) has its phase.json, counted from the first."""
    run, rep = RunDir(run_dir), 0
    while rep < 100 and all(
        run.phase(phase.id).phase_json.exists()
        for phase in phases(order, rep + 1, crossover=True, every=every)
        if phase.rep == rep + 1
    ):
        rep += 1
    return rep


def resume_repeats(run_dir: Path, order: str, max_repeats: int, every: list[Level] | None = None) -> int:
    """The repeats this invocation of an ``until: decided`` run should reach, from what is on
    disk: the first look not yet run, or, where the look's questions.csv is written, the
    next look it asks for (the same look when it is decided or the cap is reached).  So an
    interrupted run picks up where it stopped."""
    done = completed_repeats(run_dir, order, every)
    points = looks(order, max_repeats)
    target = next((r for r in points if r >= done), points[-1])
    answers_path = RunDir(run_dir).table("questions")
    if done >= target and answers_path.exists():
        answers = read_answers(answers_path)
        if len(answers) and answers["phases_per_arm"].max() >= target:
            return next_repeats(order, max_repeats, target, answers["verdict"]) or target
    return target


MAX_ANSWERS_BYTES = 16 * 2**20  # a questions.csv of at most 50 questions at each of 32 levels is far less


def read_answers(path: Path, columns: Iterable[str] = ()) -> pd.DataFrame:
    """questions.csv with its ``phases_per_arm`` and ``verdict`` checked, and ``columns``
    required too: a file that is not such a table (not CSV, not UTF-8, a column missing, a
    count that is not a whole number, a verdict that is none) is a UserError naming it,
    never taken as decided."""
    try:
        answers = pd.read_csv(io.BytesIO(read_bounded(path, MAX_ANSWERS_BYTES)), encoding="utf-8")
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not a table of answers: {' '.join(str(error).split())[:200]}") from None
    required = dict.fromkeys([*columns, "phases_per_arm", "verdict"])
    missing = [column for column in required if column not in answers.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}")
    counts = pd.to_numeric(answers["phases_per_arm"], errors="coerce")
    if not (counts.notna() & np.isfinite(counts) & (counts >= 0) & (counts == counts.round())).all():
        raise UserError(f"{path}: column 'phases_per_arm' holds a value that is not a whole number of phases")
    unknown = sorted(set(map(str, answers["verdict"])) - {YES, NO, UNDECIDED})
    if unknown:
        raise UserError(f"{path}: column 'verdict' holds {unknown[0][:40]!r}, not {YES}, {NO} or {UNDECIDED}")
    return answers.assign(phases_per_arm=counts)
