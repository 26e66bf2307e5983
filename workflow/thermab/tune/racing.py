"""The tune's plan, as pure functions (docs/tune.md): what a trial runs, what one decision
costs, when a trial stops (racing), and which trial is the answer.

A trial is a two-arm run, ``A`` the config's reference arm and ``B`` the candidate value,
with ``until: decided`` and the config's ``max_repeats``: repeats in crossover order (AB,
BA, …) of restarted, loaded and cooled phases, looked at after every repeat from the first
that tests with the α that look may spend (``analysis.sequential``).  Its questions are the
tune's constraints and, last, the objective as a superiority question (``lower`` or
``higher`` than the reference), whose interval is the objective's.  After each look the tuner judges the trial:

- **drop**: a constraint is decided ``no`` (infeasible, measured no further);
- **beaten**: its objective cannot beat the best feasible trial so far (the optimistic
  bound of its interval is worse than that trial's estimate): not a contender;
- **decided**: every constraint ``yes`` and the objective question decided;
- **cap**: ``max_repeats`` reached with something undecided;
- **budget**: the next look would not fit in the phases left;
- otherwise **continue** to the next look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from thermab import load_levels
from thermab.analysis.questions import NO, UNDECIDED, YES
from thermab.analysis.sequential import look_alphas, looks
from thermab.config import Config, ConfigError, Tune, thaw
from thermab.experiment import plan as experiment_plan

ORDER = "AB"  # A: the reference arm, B: the candidate
REFERENCE, CANDIDATE = ORDER

CONTINUE, DROP, BEATEN, DECIDED, CAP, BUDGET = "continue", "drop", "beaten", "decided", "cap", "budget"


def rounded(value: float, digits: int) -> float:
    """A candidate as tried: ``digits`` significant digits (a value a user could type)."""
    return float(f"{value:.{digits}g}")


def initial_values(tune: Tune, reference: float) -> list[float]:
    """The search's initial design: ``startup_trials`` values evenly spaced on the scale
    across the range, both ends included (one: the middle), rounded as tried, the
    reference's own value left out (a trial of the reference against itself measures
    nothing).  A grid, not random draws: the first trials span the range whatever the seed."""
    low, high, count, log = tune.min, tune.max, tune.startup_trials, tune.scale == "log"
    ends = (math.log(low), math.log(high)) if log else (low, high)
    points = (
        [ends[0] + (ends[1] - ends[0]) * i / (count - 1) for i in range(count)]
        if count > 1
        else [(ends[0] + ends[1]) / 2]
    )
    values = [min(high, max(low, rounded(math.exp(p) if log else p, tune.digits))) for p in points]
    return [value for value in dict.fromkeys(values) if value != reference]


def literal(value: float) -> str:
    """The candidate as the arm's value (a Python literal the patcher writes)."""
    return repr(float(value))


def objective_question(tune: Tune, load: dict) -> dict:
    """The objective as a superiority question; in a run of levels (``load.users`` a list)
    asked at the last level the run's order reaches (the highest users) only, so that a
    trial has one objective."""
    question = {"metric": tune.objective, "kind": tune.better}
    levels = experiment_plan.levels(load)
    return {**question, load_levels.NAMES: [load_levels.ascending(levels)[-1].label]} if levels else question


def trial_questions(tune: Tune, load: dict) -> list[dict]:
    """The trial's questions: the constraints (each at the levels it names, or every level),
    then the objective (last)."""
    return [*thaw(tune.constraints), objective_question(tune, load)]


def answer_keys(tune: Tune, load: dict) -> list[tuple[int, str | None]]:
    """(index in ``trial_questions``, the level's label) of each of the candidate's rows of
    questions.csv, in its order: level by level in the run's order (analysis.levels), each
    level's questions in the order asked; the level None where ``load.users`` is a number."""
    questions = trial_questions(tune, load)
    every = experiment_plan.levels(load)
    return [
        (index, None if level is None else level.label)
        for level in (load_levels.ascending(every) if every else [None])
        for index, question in enumerate(questions)
        if level is None or level in load_levels.asked_levels(question, every)
    ]


def trial_config(config: Config, value: float) -> dict:
    """The config a trial runs (a dict to write out): the reference arm against ``value``,
    until decided."""
    trial = thaw(config)
    del trial["tune"]
    reference = thaw(next(iter(config.arms.values())))
    trial.update(
        order=ORDER,
        repeats=1,
        until="decided",
        questions=trial_questions(config.tune, trial["load"]),
        arms={REFERENCE: reference, CANDIDATE: {"label": f"try-{value:g}", "value": literal(value)}},
    )
    return trial


def decision_phases(max_repeats: int) -> int:
    """Load phases a trial runs before its first look that may decide anything (spends α)."""
    alphas = look_alphas(ORDER, max_repeats)
    return len(ORDER) * min(r for r, alpha in alphas.items() if alpha > 0)


def check_budget(config: Config) -> None:
    """A budget below one decision is a config error, naming the key."""
    needed = decision_phases(config.max_repeats)
    budget = config.tune.budget_phases
    if budget < needed:
        raise ConfigError(
            f"config key 'tune.budget_phases': {budget} phases is below what one decision needs "
            f"({needed}: both arms up to the first look that spends alpha, with max_repeats "
            f"{config.max_repeats})"
        )


def next_look_phases(max_repeats: int, repeats_done: int) -> int | None:
    """Phases the trial's next look adds, or None when it has reached its cap."""
    later = [r for r in looks(ORDER, max_repeats) if r > repeats_done]
    return len(ORDER) * (later[0] - repeats_done) if later else None


@dataclass
class Look:
    """A trial's state after a look: questions.csv's rows, by question, for the candidate."""

    repeats: int
    rows: list[dict]  # the constraints' rows, each level's, then the objective's (``of_answers`` orders them)

    @property
    def phases(self) -> int:
        return len(ORDER) * self.repeats

    @property
    def constraints(self) -> list[dict]:
        return self.rows[:-1]

    @property
    def objective(self) -> dict:
        return self.rows[-1]


def of_answers(repeats: int, rows: list[dict], keys: list[tuple[int, str | None]]) -> Look:
    """The look from the candidate's rows of questions.csv (``answer_keys`` names each): the
    objective's row last, each constraint's row at a level named with that level."""
    objective = max(index for index, _level in keys)
    constraints = [
        {**row, "question": row["question"] + (f" at {level}" if level is not None else "")}
        for row, (index, level) in zip(rows, keys, strict=False)
        if index != objective
    ]
    return Look(
        repeats=repeats,
        rows=[*constraints, *(row for row, (index, _l) in zip(rows, keys, strict=False) if index == objective)],
    )


def gain(better: str, value: float) -> float:
    """The objective turned so that larger is better."""
    return value if better == "higher" else -value


def contender(look: Look, better: str, best_estimate: float | None) -> bool:
    """Whether the trial's objective may still beat the best feasible trial's estimate: its
    interval's optimistic bound is better (an unknown interval is a contender)."""
    if best_estimate is None:
        return True
    bounds = [look.objective["ci_low"], look.objective["ci_high"]]
    if any(not isinstance(b, (int, float)) or math.isnan(b) for b in bounds):
        return True
    return max(gain(better, b) for b in bounds) > gain(better, best_estimate)


def judge(look: Look, better: str, best_estimate: float | None, max_repeats: int, phases_left: int) -> tuple[str, str]:
    """(action, why) after a look: racing as the module says."""
    refused = [row["question"] for row in look.constraints if row["verdict"] == NO]
    if refused:
        return DROP, "decided no: " + "; ".join(refused)
    if not contender(look, better, best_estimate):
        return BEATEN, (
            f"not a contender: its objective interval ({look.objective['ci_low']:.4g} to "
            f"{look.objective['ci_high']:.4g}) cannot beat the best so far ({best_estimate:.4g})"
        )
    open_ = [row["question"] for row in look.rows if row["verdict"] == UNDECIDED]
    if not open_:
        return DECIDED, ""
    following = next_look_phases(max_repeats, look.repeats)
    if following is None:
        return CAP, f"undecided at max_repeats {max_repeats}: " + "; ".join(open_)
    if following > phases_left:
        return BUDGET, (
            f"the budget ran out before a decision (the next look needs {following} phases, "
            f"{phases_left} left): undecided: " + "; ".join(open_)
        )
    return CONTINUE, ""


@dataclass
class Trial:
    """A finished (or stopped) trial as the report shows it."""

    number: int
    value: float
    phases: int
    objective: float
    ci_low: float
    ci_high: float
    level: float
    beats_reference: str  # the objective question's verdict
    constraints: list[dict] = field(default_factory=list)  # question, verdict, estimate, ci_low, ci_high
    action: str = ""
    why: str = ""

    @property
    def feasible(self) -> bool:
        return all(c["verdict"] == YES for c in self.constraints)


def trial_from_look(number: int, value: float, look: Look, action: str, why: str) -> Trial:
    objective = look.objective
    return Trial(
        number=number,
        value=value,
        phases=look.phases,
        objective=float(objective["estimate"]),
        ci_low=float(objective["ci_low"]),
        ci_high=float(objective["ci_high"]),
        level=float(objective["level"]),
        beats_reference=objective["verdict"],
        constraints=[
            {key: row[key] for key in ("question", "verdict", "estimate", "ci_low", "ci_high")}
            for row in look.constraints
        ],
        action=action,
        why=why,
    )


def best(trials: list[Trial], better: str) -> Trial | None:
    """The feasible trial with the best objective estimate (the first of equals), or None."""
    feasible = [t for t in trials if t.feasible and not math.isnan(t.objective)]
    return max(feasible, key=lambda t: (gain(better, t.objective), -t.number), default=None)


def best_estimate(trials: list[Trial], better: str) -> float | None:
    chosen = best(trials, better)
    return None if chosen is None else chosen.objective


def violation(trial: Trial) -> float:
    """Optuna's constraint value (feasible when ≤ 0): one per constraint decided no, a half
    per one left undecided."""
    return sum(1.0 if c["verdict"] == NO else 0.5 if c["verdict"] == UNDECIDED else 0.0 for c in trial.constraints)
