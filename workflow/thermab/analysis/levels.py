"""A run of levels (``load.users`` a list, docs/design.md "Levels of load"), analysed one
level at a time: each level's windows, requests and validity reports are a run of their own
to the tables, variance, verdicts and questions, whose rows then carry ``users``.  A run
with one number of users is one level.  Pure functions over the frames of model.RunData.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from thermab.analysis.model import RunData
from thermab.config import question_words, user_levels

LOAD_MARKS = ("load_start", "probe_start", "probe_end", "load_end")  # the marks a level's window is cut by
USERS = "users"


def of_run(config: dict) -> list[int | None]:
    """The levels of a run's plan, ascending; ``[None]`` for a plan without users (an
    imported run), whose every window is its one level."""
    users = config.get(USERS)
    return [None] if users is None else user_levels(users)


def single_level(config: dict) -> int | None:
    """The one level of a plan whose users is a number (what a load mark without ``users``,
    written before levels, was run at); None for a run of levels or a plan without users."""
    users = config.get(USERS)
    return users if isinstance(users, int) else None


def at_level(run: RunData, users: int | None) -> RunData:
    """``run`` as if only the windows at ``users`` had been run: load marks, requests and
    validity reports of other levels left out (every other event kept: a cooldown of the
    level before is what this one starts after).  ``users`` None keeps every window."""
    default = single_level(run.plan)
    events, requests = run.events, run.requests
    if users is not None:
        if USERS in events:
            level = pd.to_numeric(events[USERS], errors="coerce").fillna(default if default is not None else users)
        else:
            level = pd.Series(default if default is not None else users, index=events.index)
        events = events[~events["event"].isin(LOAD_MARKS) | (level == users)].reset_index(drop=True)
        if requests is not None and USERS in requests:
            requests = requests[requests[USERS].fillna(users) == users].reset_index(drop=True)
            requests = None if requests.empty else requests
    validity = {
        key[:3]: report
        for key, report in run.validity.items()
        if users is None or (key[3] if key[3] is not None else default or users) == users
    }
    plan = {**run.plan, USERS: users} if users is not None else run.plan
    return dataclasses.replace(run, events=events, requests=requests, validity=validity, plan=plan)


def asked_at(questions: list[dict], users: int | None) -> list[dict]:
    """The questions asked at a level: those naming it under ``users``, and those naming none."""
    return [q for q in questions if users is None or users in q.get(USERS, [users])]


def with_users(frame: pd.DataFrame, users: int | None) -> pd.DataFrame:
    """``frame`` with its level in a last column ``users`` (every earlier column where it
    was: readers of a run made before levels read it as before); kept where it has one
    (validity.csv states the users its load was run with)."""
    if USERS in frame.columns:
        return frame
    return frame.assign(**{USERS: pd.array([users] * len(frame), dtype="Int64")})


def combine(parts: list[dict[str, pd.DataFrame]], levels: list[int | None]) -> dict[str, pd.DataFrame]:
    """The tables of every level as one, each row with its ``users``."""
    names = [name for name in parts[0] if all(name in part for part in parts)]
    return {
        name: pd.concat(
            [with_users(part[name], level) for part, level in zip(parts, levels, strict=False)], ignore_index=True
        )
        for name in names
    }


def tables_at(tables: dict[str, pd.DataFrame], users: int) -> dict[str, pd.DataFrame]:
    """The rows of each table at one level."""
    return {name: frame[frame[USERS] == users].reset_index(drop=True) for name, frame in tables.items()}


def rows_of(answers: pd.DataFrame, question: dict) -> pd.DataFrame:
    """The rows of questions.csv that answer ``question`` (its words, then any note)."""
    words = question_words(question)
    text = answers["question"].astype(str)
    return answers[(text == words) | text.str.startswith(words + " (") | text.str.startswith(words + ": ")]


def answer_changes(answers: pd.DataFrame, questions: list[dict]) -> pd.DataFrame:
    """For each declared question and arm of questions.csv, the lowest level at which its
    answer changes (from the level below it), or NA where it is the same at every level it
    was asked at: columns question, arm, changes_at, verdicts (``1: yes, 4: no, …``)."""
    columns = ["question", "arm", "changes_at", "verdicts"]
    if answers.empty or USERS not in answers:
        return pd.DataFrame(columns=columns)
    rows = []
    for question in questions:
        words = question_words(question)
        mine = rows_of(answers, question)
        for arm, group in mine.groupby("arm", sort=False):
            verdicts = list(zip(group[USERS].astype(int), group["verdict"], strict=False))
            verdicts.sort()
            changes = [
                users
                for (users, verdict), (_, before) in zip(verdicts[1:], verdicts, strict=False)
                if verdict != before
            ]
            rows.append(
                {
                    "question": words,
                    "arm": arm,
                    "changes_at": changes[0] if changes else pd.NA,
                    "verdicts": ", ".join(f"{users}: {verdict}" for users, verdict in verdicts),
                }
            )
    return pd.DataFrame(rows, columns=columns)
