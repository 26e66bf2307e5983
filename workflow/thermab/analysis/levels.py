"""A run of levels (``load.users`` a list, docs/design.md "Levels of load"), analysed one
level at a time: each level's windows, requests and validity reports are a run of their own
to the tables, variance, verdicts and questions, whose rows then carry ``users`` and
``load_level`` (the level's label, ``load_levels.Level``: levels of equal users may differ in
shape).  A run with one number of users is one level.  Pure functions over the frames of
model.RunData.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from thermab import load_levels
from thermab.analysis.model import Plan, RunData
from thermab.config import question_words, thaw
from thermab.load_levels import Level

LOAD_MARKS = ("load_start", "probe_start", "probe_end", "load_end")  # the marks a level's window is cut by
USERS = "users"
LEVEL = "load_level"  # the level's label, in events, requests, validity.json and every table


def _parsed(config: Plan) -> list[Level]:
    """The plan's levels: load_levels reads the dicts and lists run.json holds."""
    return load_levels.parse(thaw(config))


def of_run(config: Plan) -> list[Level | None]:
    """The levels of a run's plan in the order an odd repeat runs them (ascending by users,
    levels of equal users in the list's order); ``[None]`` for a plan without users (an
    imported run), whose every window is its one level."""
    if config.users is None:
        return [None]
    return list(load_levels.ascending(_parsed(config)))


def single_level(config: Plan) -> Level | None:
    """The one level of a plan whose users is a number (what a load mark without a level,
    written before levels, was run at); None for a run of levels or a plan without users."""
    return _parsed(config)[0] if isinstance(config.users, int) else None


def labels(frame: pd.DataFrame, config: Plan, fallback: str) -> pd.Series:
    """Each row's level, by label: its own ``load_level``; else, in a file written before
    levels of mixed shapes, the level of its ``users`` at the plan's shape; else ``fallback``."""
    shape = load_levels.run_shape(config)
    out = pd.Series(fallback, index=frame.index, dtype="object")
    if USERS in frame:
        users = pd.to_numeric(frame[USERS], errors="coerce")
        known = users.notna()
        out[known] = pd.Series([Level(int(u), **shape).label for u in users[known]], index=users.index[known])
    if LEVEL in frame:
        own = frame[LEVEL].astype("object")
        known = own.notna()
        out[known] = own[known]
    return out


def plan_at(config: Plan, level: Level | None) -> Plan:
    """The plan of one level: its users and shape as the run's, its label, and the questions
    asked at it (``asked_at``); the whole plan for ``level`` None."""
    if level is None:
        return config
    asked = asked_at(config.questions, level, _parsed(config))
    return Plan({**config, USERS: level.users, **level.shape, LEVEL: level.label, "questions": asked})


def at_level(run: RunData, level: Level | None) -> RunData:
    """``run`` as if only the windows at ``level`` had been run: load marks, requests and
    validity reports of other levels left out (every other event kept: a cooldown of the
    level before is what this one starts after).  ``level`` None keeps every window."""
    events, requests = run.events, run.requests
    if level is None:
        validity = {key[:3]: report for key, report in run.validity.items()}
        return dataclasses.replace(run, validity=validity)
    fallback = (single_level(run.plan) or level).label
    events = events[~events["event"].isin(LOAD_MARKS) | (labels(events, run.plan, fallback) == level.label)]
    events = events.reset_index(drop=True)
    if requests is not None and (USERS in requests or LEVEL in requests):
        requests = requests[labels(requests, run.plan, fallback) == level.label].reset_index(drop=True)
        requests = None if requests.empty else requests
    keys = pd.DataFrame([key[3:] for key in run.validity], columns=[USERS, LEVEL])
    kept = labels(keys, run.plan, fallback) == level.label
    validity = {key[:3]: run.validity[key] for key, keep in zip(run.validity, kept, strict=True) if keep}
    return dataclasses.replace(run, events=events, requests=requests, validity=validity, plan=plan_at(run.plan, level))


def asked_at(
    questions: Iterable[Mapping[str, Any]], level: Level | None, every: list[Level]
) -> list[Mapping[str, Any]]:
    """The questions asked at ``level`` of the levels ``every`` (as the list gives them):
    those naming it by users or by label or index, and those naming none."""
    return [q for q in questions if level is None or level in load_levels.asked_levels(q, every)]


def with_level(frame: pd.DataFrame, level: Level | None) -> pd.DataFrame:
    """``frame`` with its level in the columns ``users`` and ``load_level`` after every
    earlier column (readers of a run made before levels read it as before); ``users`` kept
    where it has one (validity.csv states the users its load was run with), with
    ``load_level`` right after it."""
    out = frame.copy()
    if USERS not in out.columns:
        out[USERS] = pd.array([None if level is None else level.users] * len(out), dtype="Int64")
    if LEVEL not in out.columns:
        label = pd.Series(None if level is None else level.label, index=out.index, dtype="string")
        out.insert(list(out.columns).index(USERS) + 1, LEVEL, label)
    return out


def combine(parts: list[dict[str, pd.DataFrame]], every: list[Level | None]) -> dict[str, pd.DataFrame]:
    """The tables of every level as one, each row with its ``users`` and ``load_level``."""
    names = [name for name in parts[0] if all(name in part for part in parts)]
    return {
        name: pd.concat(
            [with_level(part[name], level) for part, level in zip(parts, every, strict=True)], ignore_index=True
        )
        for name in names
    }


def tables_at(tables: dict[str, pd.DataFrame], level: Level) -> dict[str, pd.DataFrame]:
    """The rows of each table at one level."""
    return {name: frame[frame[LEVEL] == level.label].reset_index(drop=True) for name, frame in tables.items()}


def rows_of(answers: pd.DataFrame, question: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of questions.csv that answer ``question`` (its words, then any note)."""
    words = question_words(question)
    text = answers["question"].astype(str)
    return answers[(text == words) | text.str.startswith(words + " (") | text.str.startswith(words + ": ")]


def answer_changes(answers: pd.DataFrame, questions: Iterable[Mapping[str, Any]], order: list[str]) -> pd.DataFrame:
    """For each declared question and arm of questions.csv, the levels at which its answer
    changes from the level before it, ``order`` giving the levels' labels in the run's order
    (``of_run``); NA where it is the same at every level it was asked at: columns question,
    arm, changes_at (the labels, the first first), verdicts (``1 user: yes, 4 users: no``)."""
    columns = ["question", "arm", "changes_at", "verdicts"]
    if answers.empty or LEVEL not in answers:
        return pd.DataFrame(columns=columns)
    rank = {label: position for position, label in enumerate(order)}
    rows = []
    for question in questions:
        mine = rows_of(answers, question)
        for arm, group in mine.groupby("arm", sort=False):
            verdicts = sorted(
                zip(group[LEVEL].astype(str), group["verdict"], strict=True),
                key=lambda pair: rank.get(pair[0], len(rank)),
            )
            changes = [
                label
                for (label, verdict), (_, before) in zip(verdicts[1:], verdicts, strict=False)
                if verdict != before
            ]
            rows.append(
                {
                    "question": question_words(question),
                    "arm": arm,
                    "changes_at": ", ".join(changes) if changes else pd.NA,
                    "verdicts": ", ".join(f"{label}: {verdict}" for label, verdict in verdicts),
                }
            )
    return pd.DataFrame(rows, columns=columns)
