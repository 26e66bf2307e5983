"""The value axis of a per-arm comparison, held to the scale of the question.

An autoscaled axis spans the data alone, so two arms 0.2 % apart fill the plot's height and
look as far apart as two arms 20 % apart.  Here the axis always spans the reference arm's
mean ± the question's margin (``questions.decisive_bounds`` in the metric's unit) and at
least ± ``FLOOR_PCT`` % of that mean, the difference the verdicts' repeats-needed estimate
is sized for; the data widen it, never narrow it.  The margins are drawn as dashed lines,
so a gap reads against what the question would call a loss.  Pure arithmetic, and one
function that applies it to a matplotlib axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from thermab.analysis import questions
from thermab.analysis.model import Plan
from thermab.report import verdict

if TYPE_CHECKING:  # the arithmetic alone needs no matplotlib
    from thermab.headless import Axes

FLOOR_PCT = 5.0  # the smallest half-span, in % of the reference mean (stats' detect_pct default)
PAD = 0.08  # of the span, above and below


def margin_offsets(answers: pd.DataFrame | None, plan: Plan) -> dict[str, list[float]]:
    """metric → where its questions' decisive bounds lie, as offsets from the reference mean
    in the metric's unit (0 left out: the reference's own line)."""
    offsets: dict[str, list[float]] = {}
    if answers is None or answers.empty:
        return offsets
    for row in verdict.answer_rows(answers.dropna(subset=["margin"])):
        question = next(
            (
                q
                for q in plan.questions
                if questions.resolve_metric(q["metric"], plan) == row.metric and q["kind"] == row.kind
            ),
            None,
        )
        if question is None:
            continue
        bounds = [b for b in questions.decisive_bounds(question, row.margin) if b and math.isfinite(b)]
        offsets.setdefault(row.metric, [])
        offsets[row.metric] += [b for b in bounds if b not in offsets[row.metric]]
    return offsets


def held_limits(
    values: Iterable[float],
    reference: float,
    offsets: Sequence[float] = (),
    floor_pct: float = FLOOR_PCT,
    at_least: float = 0.0,
) -> tuple[float, float] | None:
    """(low, high) of an axis showing ``values`` beside ``reference`` ± its margins and at
    least ± ``floor_pct`` % of it (± ``at_least`` in the unit, for a reference of 0); None
    where the reference is unknown (matplotlib's own then)."""
    finite = [float(v) for v in values if v is not None and not pd.isna(v) and math.isfinite(float(v))]
    if reference is None or pd.isna(reference) or not math.isfinite(reference):
        return None
    half = max([abs(reference) * floor_pct / 100, at_least, *(abs(o) for o in offsets)])
    low = min([reference - half, *(reference + o for o in offsets), *finite])
    high = max([reference + half, *(reference + o for o in offsets), *finite])
    if high <= low:  # a reference of 0 with no margin and no spread
        low, high = low - 1, high + 1
    pad = (high - low) * PAD
    return low - pad, high + pad


def hold(ax: Axes, values: Iterable[float], reference: float, offsets: Sequence[float] = (), unit: str = "") -> None:
    """Set ``ax``'s value axis by ``held_limits`` and draw each margin as a dashed line."""
    limits = held_limits(values, reference, offsets)
    if limits is None:
        return
    ax.set_ylim(*limits)
    for offset in offsets:
        ax.axhline(reference + offset, color="#444444", ls="--", lw=1)
        ax.annotate(
            f"margin {offset:+.3g} {unit}".rstrip().replace("-", "−"),
            (1, reference + offset),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            fontsize=7,
            color="#444444",
        )
