"""The verdict line: one per question and arm, the same in ``evidence.md``, ``summary.md`` and
``status`` (``figures/questions.png`` titles each panel with its label and draws it in its
unit)::

    NO — stall gaps no worse than 0.5 (lower is better): +1.2 gaps per phase [+0.8, +1.6 gaps
    per phase] vs margin +0.5 gaps per phase, 4 phases per arm

the verdict, the question's words (at most ``LABEL_CHARS`` characters), the estimate
(arm − reference) and its interval in the metric's unit, the bound the interval must clear,
and the phases per arm; for an undecided one, what would decide it (``to_decide``).  The
method, the adjustment, the acceptance balance and the caveats are questions.csv's own
columns, never in the line.

Read from a row of questions.csv alone (its ``unit`` and ``better`` columns; a table written
before them gives numbers without a unit), so a reader of the file says what the report says.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Protocol

import pandas as pd

from thermab.analysis.levels import LEVEL
from thermab.analysis.questions import UNDECIDED, decisive_bounds
from thermab.report.table_rows import tuple_rows
from thermab.report.units import DIGITS, fmt

LABEL_CHARS = 60
# units read better in other terms: (factor, unit, decimals); CPU in cores with the % of one
# core beside the estimate, a count of stall gaps per phase (each phase's count is the value)
RESTATED = {"% of one core": (0.01, "cores", 2), "gaps": (1.0, "gaps per phase", 1)}


class AnswerRow(Protocol):
    """One row of questions.csv as the report reads it (``itertuples`` or a Series); ``unit``,
    ``better`` and the level are read where the table has them."""

    @property
    def question(self) -> str: ...
    @property
    def verdict(self) -> str: ...
    @property
    def arm(self) -> str: ...
    @property
    def reference(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def margin(self) -> float: ...
    @property
    def estimate(self) -> float: ...
    @property
    def ci_low(self) -> float: ...
    @property
    def ci_high(self) -> float: ...
    @property
    def phases_per_arm(self) -> float: ...
    @property
    def phases_needed(self) -> float: ...


# questions.csv's rows
answer_rows: Callable[[pd.DataFrame], Iterator[AnswerRow]] = tuple_rows


def _text(row: AnswerRow, column: str) -> str:
    value = getattr(row, column, "")
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _number(value: float, digits: int, sign: bool) -> str:
    return fmt(value, "", digits, sign=sign)


def quantity(value: float, unit: str, sign: bool = True) -> str:
    """A value in its unit: ``−1.89 cores (−189 % of one core)``, ``+0.5 gaps per phase``,
    ``−8.9 °C``."""
    if unit in RESTATED:
        factor, shown, digits = RESTATED[unit]
        text = f"{_number(value * factor, digits, sign)} {shown}"
        if unit == "% of one core" and not math.isnan(value):
            text += f" ({_number(value, DIGITS[unit], sign)} % of one core)"
        return text
    return fmt(value, unit, sign=sign)


def span(low: float, high: float, unit: str) -> str:
    """An interval in its unit: ``[−2.10, −1.68 cores]``; ``[no interval]`` without one."""
    if math.isnan(low) or math.isnan(high):
        return "[no interval]"
    factor, shown, digits = RESTATED.get(unit, (1.0, unit, DIGITS.get(unit, 2)))
    numbers = f"{_number(low * factor, digits, True)}, {_number(high * factor, digits, True)}"
    return f"[{numbers} {shown}]" if shown else f"[{numbers}]"


def margin_text(row: AnswerRow) -> str:
    """The bound (or bounds) the interval must clear, in the metric's unit: ``−10.5 tok/s``,
    ``± 0.5 °C``, ``0 cores`` (a superiority question without ``by``); ``unknown`` where the
    margin is in % of a reference mean that cannot be told from zero."""
    unit, kind, margin = _text(row, "unit"), row.kind, row.margin
    if math.isnan(margin):
        if kind not in ("lower", "higher"):
            return "unknown"
        margin = 0.0
    if kind == "equivalent":
        return f"± {quantity(margin, unit, sign=False)}"
    better = _text(row, "better") or kind
    (bound,) = decisive_bounds({"kind": kind, "better": better}, margin)
    if bound == 0:  # no loss at all, or any gain: a zero has no digits to show
        shown = RESTATED.get(unit, (1.0, unit))[1]
        return f"0 {shown}" if shown else "0"
    return quantity(bound, unit)


def label(row: AnswerRow) -> str:
    """The question's words in at most ``LABEL_CHARS`` characters (the figure's label too)."""
    words = " ".join(str(row.question).split())
    return words if len(words) <= LABEL_CHARS else words[: LABEL_CHARS - 1].rstrip() + "…"


def _who(row: AnswerRow, arms: int, levels: int) -> str:
    """Which arm and level, where the run has more than one of either."""
    parts = []
    if arms > 1:
        parts.append(f"{row.arm} vs {row.reference}")
    if levels > 1 and _text(row, LEVEL):
        parts.append(f"at {_text(row, LEVEL)}")
    return f" ({' '.join(parts)})" if parts else ""


def verdict_line(row: AnswerRow, *, arms: int = 1, levels: int = 1, escape: Callable[[str], str] = str) -> str:
    """One row of questions.csv as its verdict line; ``arms`` and ``levels``: how many the
    answers hold (the arm and level are named where there is more than one); ``escape``:
    what the question's words and the level's label pass through (``markup.md_text`` in
    Markdown)."""
    head = f"{str(row.verdict).upper()} — {escape(label(row) + _who(row, arms, levels))}"
    if math.isnan(row.estimate):
        return f"{head}: not measured in this run"
    unit = _text(row, "unit")
    n = int(row.phases_per_arm)
    return (
        f"{head}: {quantity(row.estimate, unit)} {span(row.ci_low, row.ci_high, unit)}"
        f" vs margin {margin_text(row)}, {n} phase{'' if n == 1 else 's'} per arm"
    )


def to_decide(row: AnswerRow, command: str) -> str:
    """What follows an undecided verdict line: the phases per arm that would decide it and
    ``command`` (the command with its cluster-hours); "" for a decided one, and for one not
    measured in the run (no number of repeats measures what the run has no source for)."""
    if row.verdict != UNDECIDED or math.isnan(row.estimate):
        return ""
    if math.isnan(row.phases_needed):
        need = "a spread between phases needs at least two phases per arm"
    else:
        need = f"about {row.phases_needed:.0f} phases per arm at the spread seen"
    return f"; to decide: {need}, {command}"


def verdict_lines(answers: pd.DataFrame, command: str = "", *, escape: Callable[[str], str] = str) -> list[str]:
    """Every row of questions.csv as its verdict line, each undecided one followed by
    ``to_decide`` where ``command`` is given."""
    arms = answers["arm"].nunique() if "arm" in answers else 1
    levels = answers[LEVEL].nunique() if LEVEL in answers else 1
    lines = []
    for row in answer_rows(answers):
        line = verdict_line(row, arms=arms, levels=levels, escape=escape)
        lines.append(line + (to_decide(row, command) if command else ""))
    return lines
