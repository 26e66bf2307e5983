"""summary.md of a run of levels: the questions across the levels first, with the levels at
which each answer changes, then the trade-off across traffic (each level's heat, CPU, energy
per token and latency per arm: report/traffic.py's table), then each level's own summary
(summary.summary_markdown of that level's tables) under a heading of its own."""

from __future__ import annotations

import re

import pandas as pd

from thermab.analysis import levels
from thermab.analysis.model import Plan
from thermab.markup import md_text
from thermab.report import traffic
from thermab.report.summary import markdown_table


def markdown(config: Plan, tables: dict[str, pd.DataFrame], pooled: pd.DataFrame, texts: dict[str, str]) -> str:
    """``tables``: the run's (every level's rows); ``pooled``: its per-phase metrics;
    ``texts``: each level's summary.md, by its label."""
    order = [label for label in traffic.level_order(config) if label in texts]
    shown = ", ".join(order)
    parts = [
        f"# thermab: {md_text(config.cluster)} — {md_text(config.setting)} at {len(order)} levels of load",
        "",
        f"Levels of load: {shown}. Each repeat of each arm restarted the server once and ran one load"
        " window per level, each after the cooldown (ascending by users in odd repeats, levels of equal"
        " users in the list's order, and the other way round in even ones); every table has `users` and"
        " `load_level` columns, each level is judged by its own shape's rule and analysed on its own phases"
        ' (docs/design.md, "Levels of load"). figures/tradeoff.png draws each arm\'s metrics at each level.',
        "",
        "## Questions across levels",
        "",
    ]
    changes = levels.answer_changes(tables["questions"], config.questions, order)
    if changes.empty:
        parts += ["No question was declared, or none was asked at any level.", ""]
    else:
        labels = {arm: spec.label for arm, spec in config.arms.items()}
        table = pd.DataFrame(
            {
                "question": changes["question"],
                "arm": [labels.get(arm, arm) for arm in changes["arm"]],
                "verdict by level": changes["verdicts"],
                "answer changes at": [
                    value if pd.notna(value) else "never (same at every level)" for value in changes["changes_at"]
                ],
            }
        )
        parts += [
            markdown_table(table),
            '"Answer changes at": each level whose verdict differs from the level before it in the run\'s'
            " order (questions.csv has each level's test).",
            "",
        ]
    parts += [
        "## The trade-off across traffic",
        "",
        markdown_table(traffic.table(pooled, config)),
        "Each level's mean over its phases ± the half width of its 95 % t interval (none for one phase);"
        " † a phase's load fell short there; latency is the median time to first token of the load's own"
        " requests.",
        "",
    ]
    for label in order:
        parts += [f"## At {label}", "", _demoted(texts[label]), ""]
    return "\n".join(parts).rstrip() + "\n"


def _demoted(text: str) -> str:
    """A level's summary without its title, each heading one level down."""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(re.sub(r"^(#+) ", r"#\1 ", line) for line in lines).strip()
