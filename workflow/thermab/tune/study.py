"""The search's Optuna study: its sampler, its SQLite storage in the tune directory, and the
ask-and-tell of trials (docs/tune.md says why TPE is the default).

A trial's result (``plan.Trial``) is kept in the study as a user attribute, so the study is
the one record of the search: an interrupted tune opens it again, finishes the trial that
was running (its directory resumes like any run) and goes on asking."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import optuna

from thermab.config import ConfigError
from thermab.tune.plan import Trial, initial_values, rounded, violation

STUDY_NAME = "thermab-tune"
PARAM = "value"
SEARCH_KEYS = ("min", "max", "scale", "objective", "better")  # a study answers one search


def sampler(tune: dict) -> optuna.samplers.BaseSampler:
    # the constraint comes with each trial (Trial.set_constraint, tell): both samplers use it.
    # The initial design is the grid enqueued in the study (open_study), so the sampler
    # models from its first trial of its own on (a random start would only repeat the grid's role).
    options = dict(n_startup_trials=1, seed=tune["seed"])
    if tune["sampler"] == "gp":
        return optuna.samplers.GPSampler(**options)
    return optuna.samplers.TPESampler(**options)


def distribution(tune: dict) -> optuna.distributions.FloatDistribution:
    return optuna.distributions.FloatDistribution(tune["min"], tune["max"], log=tune["scale"] == "log")


def open_study(tune: dict, storage: Path, reference: float) -> optuna.Study:
    """The tune directory's study, created or opened again; one of another search is refused.
    A new study is given the initial design (``plan.initial_values``) as its first trials."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage.parent.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=f"sqlite:///{storage}",
        sampler=sampler(tune),
        direction="maximize" if tune["better"] == "higher" else "minimize",
        load_if_exists=True,
    )
    search = {key: tune[key] for key in SEARCH_KEYS}
    if not study.user_attrs:
        for value in initial_values(tune, reference):
            study.enqueue_trial({PARAM: value}, skip_if_exists=True)  # an interrupted start enqueues once
        for key, value in search.items():
            study.set_user_attr(key, value)
    elif {key: study.user_attrs.get(key) for key in SEARCH_KEYS} != search:
        raise ConfigError(
            f"config key 'tune': {storage} holds a search of another range or objective "
            f"({ {key: study.user_attrs.get(key) for key in SEARCH_KEYS} }); move that tune "
            "directory away to start a new one"
        )
    return study


def interrupted(study: optuna.Study) -> list[tuple[int, float]]:
    """(number, value) of trials asked but never told: a tune stopped while they ran."""
    return [
        (t.number, t.user_attrs["tried"])
        for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.RUNNING and "tried" in t.user_attrs
    ]


def ask(study: optuna.Study, tune: dict) -> tuple[int, float]:
    """A new trial's number and the value it tries (rounded to ``tune.digits``)."""
    trial = study.ask({PARAM: distribution(tune)})
    value = min(tune["max"], max(tune["min"], rounded(trial.params[PARAM], tune["digits"])))
    trial.set_user_attr("tried", value)
    return trial.number, value


def tell(study: optuna.Study, result: Trial) -> None:
    frozen = study.get_trials(deepcopy=False)[result.number]
    trial = optuna.trial.Trial(study, frozen._trial_id)
    trial.set_constraint("violation", violation(result))
    trial.set_user_attr("result", dataclasses.asdict(result))
    if math.isfinite(result.objective):
        study.tell(result.number, result.objective)
    else:  # no estimate (no data for the objective): nothing for the sampler to learn from
        study.tell(result.number, state=optuna.trial.TrialState.FAIL)


def results(study: optuna.Study) -> list[Trial]:
    """Every told trial's result, in trial order."""
    return [Trial(**t.user_attrs["result"]) for t in study.get_trials(deepcopy=False) if "result" in t.user_attrs]
