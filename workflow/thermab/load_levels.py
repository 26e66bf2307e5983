"""The levels of load (``load.users``; docs/design.md, "Levels of load"): what each level is,
its label, the order levels run in, which a question names, and what is wrong with a list
of them.  Pure functions, in the bottom room: the config's checks, the plan, the load and the
analysis read levels through here alone.

``load.users`` is a number of users or a list of levels.  A level is

- a number: that many users at the run's own shape (``load.rate``, ``load.burstiness``,
  ``load.think_s``: a closed loop unless they are set), as a list of numbers always was;
- a mapping of a shape of its own, in load's own keys: ``{users: 4}`` a closed loop,
  ``{think_s: 2, users: 4}`` a think-time loop, ``{rate: 0.5, users: 4}`` an open loop of
  0.5 requests/s with at most 4 in flight (``burstiness`` beside ``rate``; 1, Poisson, where
  unset).  The run's shape keys do not apply to it.

Levels run ascending by users, levels of equal users in the list's order, and the other way
round in even repeats (``in_order``).  Each has a label that tables, figures and questions
name it by (``4 users``, ``0.5 req/s ≤4``, ``4 users think 2 s``) and a slug that names its
phase directory (``u4``, ``r0.5-u4``, ``u4-think2``); both are as exact as its numbers, so two
levels differ in them exactly when they differ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CLOSED, THINK, RATE = "closed", "think", "rate"
USERS = "users"
SHAPE_KEYS = ("rate", "burstiness", "think_s")  # load's keys that make a loop's shape
LEVEL_KEYS = (USERS, *SHAPE_KEYS)  # the keys a level of a shape of its own may have


def kind_of(rate, think_s) -> str:
    """The shape ``rate`` and ``think_s`` make (either may be None): an open loop, a
    think-time loop or a closed loop."""
    return RATE if rate else THINK if think_s else CLOSED


def number(value) -> str:
    """``value`` as the shortest text that reads back as it: ``2`` for 2.0, ``0.5``, ``1e-05``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Level:
    """One level of load: ``users`` the slots of a loop, or the cap of an open loop."""

    users: int
    rate: float | None = None
    burstiness: float = 1.0  # of an open loop only: 1 everywhere else, so that equal levels are equal
    think_s: float | None = None

    @property
    def kind(self) -> str:
        return kind_of(self.rate, self.think_s)

    @property
    def shape(self) -> dict:
        """The level's shape keys, as ``load`` holds them."""
        return {"rate": self.rate, "burstiness": self.burstiness, "think_s": self.think_s}

    @property
    def label(self) -> str:
        users = f"{self.users} user{'' if self.users == 1 else 's'}"
        if self.kind == RATE:
            bursts = f" burstiness {number(self.burstiness)}" if self.burstiness != 1 else ""
            return f"{number(self.rate)} req/s ≤{self.users}{bursts}"
        if self.kind == THINK:
            return f"{users} think {number(self.think_s)} s"
        return users

    @property
    def slug(self) -> str:
        if self.kind == RATE:
            return f"r{number(self.rate)}-u{self.users}" + (
                f"-b{number(self.burstiness)}" if self.burstiness != 1 else ""
            )
        if self.kind == THINK:
            return f"u{self.users}-think{number(self.think_s)}"
        return f"u{self.users}"


def run_shape(load: Mapping[str, Any]) -> dict:
    """The shape a number of users is run at: ``load``'s (or run.json's) shape keys, the
    burstiness only with a rate."""
    rate = load.get("rate")
    return {
        "rate": rate,
        "burstiness": load.get("burstiness", 1.0) if rate else 1.0,
        "think_s": load.get("think_s"),
    }


def level(item, shape: dict) -> Level:
    """One item of ``load.users`` (checked: ``problems``) as its level, a number at ``shape``."""
    if isinstance(item, dict):
        return Level(item[USERS], **run_shape(item))
    return Level(item, **shape)


def parse(load: dict) -> list[Level]:
    """The levels of ``load`` (the config's ``load`` or run.json: ``users`` and the shape
    keys), in the list's order; a number of users is one level."""
    users = load[USERS]
    shape = run_shape(load)
    return [level(item, shape) for item in (users if isinstance(users, list) else [users])]


def ascending(levels: list[Level]) -> list[Level]:
    """The order an odd repeat runs ``levels`` in: by users, levels of equal users in the
    list's order."""
    return sorted(levels, key=lambda one: one.users)


def in_order(levels: list[Level], rep: int) -> list[Level]:
    """The levels of repeat ``rep`` in the order they run: ascending in odd repeats, the
    other way round in even ones, so that a level's position is balanced as an arm's is."""
    up = ascending(levels)
    return up if rep % 2 else up[::-1]


# -- checks ---------------------------------------------------------------------------------


def _positive(value) -> str | None:
    """Why ``value`` is no finite number above 0, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"{value!r} is not a finite number above 0"
    return None


def value_problem(name: str, value, bounds: dict | None = None) -> str | None:
    """Why ``value`` cannot be a level's ``name`` (``users``, ``rate``, ``burstiness``,
    ``think_s``): users a whole number from 1, the others finite numbers above 0, each at most
    its ``bounds`` (the schema's ``maximum``) where given; None where it can."""
    bound = (bounds or {}).get(name)
    if name == USERS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{value!r} is not a whole number of users, at least 1"
    elif _positive(value):
        return _positive(value)
    if bound is not None and value > bound:
        return f"{value!r} is above {bound:g}"
    return None


def _mapping_problems(where: str, item: dict, bounds: dict | None) -> list[str]:
    problems = []
    unknown = [name for name in item if name not in LEVEL_KEYS]
    for name in unknown:
        problems.append(f"config key '{where}.{name}': unknown key (a level's keys: {', '.join(LEVEL_KEYS)})")
    if USERS not in item:
        problems.append(f"config key '{where}.users': required (the loop's users, or the open loop's cap)")
    for name in LEVEL_KEYS:
        if name in item and not (item[name] is None and name in ("rate", "think_s")):
            problem = value_problem(name, item[name], bounds)
            if problem:
                problems.append(f"config key '{where}.{name}': {problem}")
    if item.get("rate") is not None and item.get("think_s") is not None:
        problems.append(
            f"config key '{where}.think_s': a think time belongs to a loop of users, and '{where}.rate' "
            "makes this level an open loop; give one of them"
        )
    problem = burstiness_problem(item, where, "this level")
    if problem and not any(p.startswith(f"config key '{where}.burstiness'") for p in problems):
        problems.append(problem)
    return problems


def burstiness_problem(shape: dict, where: str, whose: str) -> str | None:
    """The one rule of a burstiness, a level's or the run's (``load``): it shapes the gaps
    between arrivals of a rate, so one other than 1 (Poisson, the default, what it means
    where unset) without a rate beside it is a mistake, named at ``where.burstiness``."""
    burstiness = shape.get("burstiness", 1)
    if shape.get("rate") is None and burstiness != 1:
        return (
            f"config key '{where}.burstiness': {burstiness!r} shapes the gaps between arrivals of a rate, "
            f"and {whose} has none ('{where}.rate')"
        )
    return None


def problems(load: dict, key: str = "load", bounds: dict | None = None) -> list[str]:
    """Every problem of ``load``'s ``users`` as levels, each a line naming the key at fault
    (``load.users.2.rate``): a number or mapping that is no level (``value_problem``, unknown
    keys, a rate with a think time, a burstiness other than 1 without a rate, the run's own
    too), an empty list, or a level
    given twice (``4`` and ``{users: 4}`` in a closed-loop run are one level).  [] where
    ``parse`` reads it.  ``bounds``: the most each key may be (the schema's maxima)."""
    run = burstiness_problem(load, key, "the run")
    return ([run] if run else []) + _users_problems(load, key, bounds)


def _users_problems(load: dict, key: str, bounds: dict | None) -> list[str]:
    users = load.get(USERS)
    base = f"{key}.{USERS}"
    if not isinstance(users, list):
        problem = value_problem(USERS, users, bounds)
        return [f"config key '{base}': {problem}"] if problem else []
    if not users:
        return [f"config key '{base}': an empty list has no level"]
    found = []
    for index, item in enumerate(users):
        where = f"{base}.{index}"
        if isinstance(item, dict):
            found += _mapping_problems(where, item, bounds)
        elif value_problem(USERS, item, bounds):
            found.append(f"config key '{where}': {value_problem(USERS, item, bounds)}")
    if found:
        return found
    first: dict[Level, int] = {}
    for index, one in enumerate(parse(load)):
        if one in first:
            found.append(
                f"config key '{base}.{index}': the level '{one.label}' is given twice (first as '{base}.{first[one]}')"
            )
        first.setdefault(one, index)
    return found


# -- the levels a question is asked at ------------------------------------------------------

NAMES = "levels"  # a question's key naming levels by label or index (``users`` names them by users)


def asked_levels(question: Mapping[str, Any], levels: list[Level]) -> list[Level]:
    """The levels (of ``levels``, in the list's order) a question is asked at: those whose
    users its ``users`` names, those its ``levels`` names by label or by index in the list
    (from 0, as ``load.users.N`` counts), or every level where it names none.  A name that is
    no level of the run names none (``question_problems`` says so)."""
    if USERS in question:
        return [one for one in levels if one.users in question[USERS]]
    if NAMES in question:
        named = set()
        for name in question[NAMES]:
            if isinstance(name, int) and not isinstance(name, bool) and 0 <= name < len(levels):
                named.add(levels[name])
            named |= {one for one in levels if one.label == name}
        return [one for one in levels if one in named]
    return list(levels)


def question_problems(question: dict, levels: list[Level]) -> list[tuple[str, str]]:
    """(the question's key, the problem) for each name of ``users`` or ``levels`` that is no
    level of ``levels``, and for a question naming levels both ways."""
    found = []
    if USERS in question and NAMES in question:
        found.append((NAMES, "name the levels by users or by levels, not both"))
    outside = [users for users in question.get(USERS, []) if users not in {one.users for one in levels}]
    if outside:
        known = ", ".join(str(users) for users in dict.fromkeys(one.users for one in ascending(levels)))
        found.append((USERS, f"{', '.join(map(str, outside))} not among the users of 'load.users' ({known})"))
    labels = [one.label for one in levels]
    unknown = [
        name
        for name in question.get(NAMES, [])
        if not (isinstance(name, int) and not isinstance(name, bool) and 0 <= name < len(levels)) and name not in labels
    ]
    if unknown:
        found.append(
            (
                NAMES,
                f"{', '.join(map(repr, unknown))} names no level of 'load.users' (a label: "
                f"{', '.join(map(repr, labels))}; or an index from 0 to {len(levels) - 1})",
            )
        )
    return found
