"""The phase sequence of a run, as pure functions: baseline once, then for each repeat
every arm in ``order``.  Phase ids are ``rep{rep}-{arm}`` (DESIGN.md)."""

from __future__ import annotations

from typing import NamedTuple

BASELINE = "baseline"


class Phase(NamedTuple):
    rep: int
    arm: str

    @property
    def id(self) -> str:
        return f"rep{self.rep}-{self.arm}"


def phases(order: str, repeats: int) -> list[Phase]:
    return [Phase(rep, arm) for rep in range(1, repeats + 1) for arm in order]


def previous(order: str, rep: int, arm: str) -> str:
    """Id of the phase that must finish before ``rep{rep}-{arm}``; the baseline for the first.

    Only earlier repeats are named, so raising ``repeats`` later never changes the chain
    of the phases that already ran."""
    sequence = phases(order, rep)
    index = sequence.index(Phase(rep, arm))
    return BASELINE if index == 0 else sequence[index - 1].id
