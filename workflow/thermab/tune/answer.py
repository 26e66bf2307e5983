"""The tune's answer with its evidence, in ``results/{cluster}/tune/`` (docs/tune.md):
``best.json``, ``trials.csv``, ``tune.png`` and ``summary.md``, all from the trials' results.

Every objective is the candidate's estimate against the reference arm of its own trial
(candidate − reference, the arm effect of that trial's questions.csv, with the interval
its look tested at), so trials run at other times, from other start temperatures, compare."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from thermab import layout
from thermab.analysis.questions import YES
from thermab.config import Config
from thermab.markup import md_text
from thermab.tune import racing

TRIAL_COLUMNS = [
    "trial",
    "value",
    "phases",
    "objective",
    "ci_low",
    "ci_high",
    "level",
    "feasible",
    "beats_reference",
    "stopped",
    "why_dropped",
    "constraints",
]


def _number(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def trials_table(trials: list[racing.Trial]) -> pd.DataFrame:
    rows = [
        {
            "trial": t.number,
            "value": t.value,
            "phases": t.phases,
            "objective": t.objective,
            "ci_low": t.ci_low,
            "ci_high": t.ci_high,
            "level": t.level,
            "feasible": t.feasible,
            "beats_reference": t.beats_reference,
            "stopped": t.action,
            "why_dropped": t.why,
            "constraints": "; ".join(f"{c['question']}: {c['verdict']}" for c in t.constraints),
        }
        for t in trials
    ]
    return pd.DataFrame(rows, columns=TRIAL_COLUMNS)


def verdict_line(trials: list[racing.Trial], chosen: racing.Trial | None, config: Config) -> str:
    """What the search found, said plainly."""
    tune, name = config.tune, config.setting.name
    ran_out = [t for t in trials if t.action == racing.BUDGET]
    lines = []
    if not trials:
        lines.append("No trial ran: the budget holds no decision.")
    elif chosen is None:
        lines.append(
            f"No candidate met every constraint: none of the {len(trials)} trials is chosen, and the "
            "reference arm stays the answer."
        )
    elif chosen.beats_reference != YES:
        lines.append(
            f"No candidate beat the reference: the best feasible trial, {name} = {chosen.value:g}, has "
            f"{tune.objective} {chosen.objective:+.4g} against it (interval {chosen.ci_low:+.4g} to "
            f"{chosen.ci_high:+.4g}), which does not tell it from the reference "
            f"({tune.better} was asked: {chosen.beats_reference})."
        )
    else:
        lines.append(
            f"Best: {name} = {chosen.value:g}, {tune.objective} {chosen.objective:+.4g} against the "
            f"reference (interval {chosen.ci_low:+.4g} to {chosen.ci_high:+.4g}, {tune.better}: yes), "
            "every constraint yes."
        )
    if ran_out:
        lines.append(
            "The budget ran out before a decision in "
            + ", ".join(f"trial {t.number} ({name} = {t.value:g})" for t in ran_out)
            + "."
        )
    return " ".join(lines)


def best_record(trials: list[racing.Trial], chosen: racing.Trial | None, config: Config) -> dict:
    tune = config.tune
    record = {
        "setting": config.setting.name,
        "reference_value": next(iter(config.arms.values())).value,
        "objective_metric": tune.objective,
        "better": tune.better,
        "phases_used": sum(t.phases for t in trials),
        "budget_phases": tune.budget_phases,
        "trials": len(trials),
        "budget_ran_out": any(t.action == racing.BUDGET for t in trials),
        "verdict": verdict_line(trials, chosen, config),
    }
    if chosen is None:
        return {
            "value": None,
            "objective": None,
            "objective_ci_low": None,
            "objective_ci_high": None,
            "constraints": {},
            **record,
        }
    return {
        "value": chosen.value,
        "objective": _number(chosen.objective),
        "objective_ci_low": _number(chosen.ci_low),
        "objective_ci_high": _number(chosen.ci_high),
        "objective_level": chosen.level,
        "beats_reference": chosen.beats_reference,
        "constraints": {
            c["question"]: {
                "verdict": c["verdict"],
                "estimate": _number(c["estimate"]),
                "ci_low": _number(c["ci_low"]),
                "ci_high": _number(c["ci_high"]),
            }
            for c in chosen.constraints
        },
        "trial": chosen.number,
        "phases": chosen.phases,
        **record,
    }


def figure(path: Path, trials: list[racing.Trial], chosen: racing.Trial | None, config: Config) -> None:
    """Objective (against the reference) over value: each trial with its interval; hollow
    red where infeasible, the chosen one starred."""
    from thermab.headless import plt  # the Agg backend, literal text; only when a figure is drawn

    tune = config.tune
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.axhline(0, color="0.4", lw=1, ls="--", label="reference arm")
    for feasible, style in (
        (True, dict(fmt="o", color="tab:blue", label="feasible")),
        (False, dict(fmt="o", color="tab:red", mfc="none", label="infeasible (a constraint no or undecided)")),
    ):
        shown = [t for t in trials if t.feasible == feasible and math.isfinite(t.objective)]
        if not shown:
            continue
        lows = [t.objective - t.ci_low if math.isfinite(t.ci_low) else 0 for t in shown]
        highs = [t.ci_high - t.objective if math.isfinite(t.ci_high) else 0 for t in shown]
        ax.errorbar([t.value for t in shown], [t.objective for t in shown], yerr=[lows, highs], capsize=3, **style)
    if chosen is not None:
        ax.plot(
            [chosen.value],
            [chosen.objective],
            marker="*",
            ms=16,
            color="gold",
            mec="k",
            ls="none",
            label=f"chosen ({chosen.value:g})",
        )
    if tune.scale == "log":
        ax.set_xscale("log")
    ax.set_xlim(tune.min, tune.max)
    ax.set_xlabel(config.setting.name)
    ax.set_ylabel(f"{tune.objective}\n(candidate − reference; {tune.better} is better)")
    ax.set_title(
        f"tune: {len(trials)} trial{'' if len(trials) == 1 else 's'}, "
        f"{sum(t.phases for t in trials)} of {tune.budget_phases} phases"
    )
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(trials: list[racing.Trial], chosen: racing.Trial | None, config: Config) -> str:
    tune = config.tune
    name, reference = md_text(config.setting.name), md_text(next(iter(config.arms.values())).value)
    lines = [
        f"# Tune of {name} in [{tune.min:g}, {tune.max:g}] ({tune.scale})",
        "",
        md_text(verdict_line(trials, chosen, config)),
        "",
        f"Objective: {tune.objective} ({tune.better} is better), each trial's candidate against the "
        f"reference arm ({name} = {reference}) of its own trial. Phases: {sum(t.phases for t in trials)} "
        f"of a budget of {tune.budget_phases}; sampler {tune.sampler}, trials racing (docs/tune.md).",
        "",
    ]
    if chosen is not None:
        lines += [
            "## The chosen value's constraints",
            "",
            "| question | verdict | estimate | interval |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {c['question']} | {c['verdict']} | {c['estimate']:.4g} | {c['ci_low']:.4g} to {c['ci_high']:.4g} |"
            for c in chosen.constraints
        ]
        lines.append("")
    lines += [
        "## Trials",
        "",
        trials_table(trials).to_markdown(index=False, floatfmt=".4g"),
        "",
        "![objective against value](tune.png)",
        "",
    ]
    return "\n".join(lines)


def write(tune_dir: layout.TuneDir, config: Config, trials: list[racing.Trial]) -> None:
    chosen = racing.best(trials, config.tune.better)
    tune_dir.path.mkdir(parents=True, exist_ok=True)
    tune_dir.best.write_text(json.dumps(best_record(trials, chosen, config), indent=2, allow_nan=False) + "\n")
    trials_table(trials).to_csv(tune_dir.trials, index=False)
    figure(tune_dir.figure, trials, chosen, config)
    tune_dir.summary.write_text(summary(trials, chosen, config))
