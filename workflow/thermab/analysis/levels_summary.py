"""summary.md of a run of levels: the questions across the levels first, with the lowest
level at which each answer changes, then each level's own summary (summary.summary_markdown
of that level's tables) under a heading of its own."""

from __future__ import annotations

import re

import pandas as pd

from thermab.analysis import levels
from thermab.analysis.summary import markdown_table


def markdown(config: dict, answers: pd.DataFrame, texts: dict[int, str]) -> str:
    """``texts``: each level's summary.md, by users."""
    every = sorted(texts)
    shown = ", ".join(map(str, every))
    parts = [
        f"# thermab: {config.get('cluster', '')} — {config.get('setting', 'setting')} at {shown} users",
        "",
        f"Levels of load: {shown} users. Each repeat of each arm restarted the server once and ran one load"
        " window per level, each after the cooldown (ascending in odd repeats, descending in even ones);"
        " every table has a `users` column, and each level is analysed on its own phases"
        ' (docs/design.md, "Levels of load"). figures/tradeoff.png draws each arm\'s metrics against users.',
        "",
        "## Questions across levels",
        "",
    ]
    changes = levels.answer_changes(answers, config.get("questions", []))
    if changes.empty:
        parts += ["No question was declared, or none was asked at any level.", ""]
    else:
        labels = {arm: spec["label"] for arm, spec in config["arms"].items()}
        table = pd.DataFrame(
            {
                "question": changes["question"],
                "arm": [labels.get(arm, arm) for arm in changes["arm"]],
                "verdict by users": changes["verdicts"],
                "answer changes at": [
                    f"{value} users" if pd.notna(value) else "never (same at every level)"
                    for value in changes["changes_at"]
                ],
            }
        )
        parts += [
            markdown_table(table),
            '"Answer changes at": the lowest level whose verdict differs from the level below it'
            " (questions.csv has each level's test).",
            "",
        ]
    for users in every:
        parts += [f"## At {users} user{'s' if users != 1 else ''}", "", _demoted(texts[users]), ""]
    return "\n".join(parts).rstrip() + "\n"


def _demoted(text: str) -> str:
    """A level's summary without its title, each heading one level down."""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(re.sub(r"^(#+) ", r"#\1 ", line) for line in lines).strip()
