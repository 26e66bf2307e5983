"""The search's Optuna study: its sampler, its SQLite storage in the tune directory, and the
ask-and-tell of trials (docs/tune.md says why TPE is the default).

A trial's result (``plan.Trial``) is kept in the study as a user attribute, so the study is
the one record of the search: an interrupted tune opens it again, finishes the trial that
was running (its directory resumes like any run) and goes on asking."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import optuna
import sqlalchemy

from thermab.config import ConfigError, Tune, check_file
from thermab.errors import UserError
from thermab.tune.racing import Trial, initial_values, rounded, violation

STUDY_NAME = "thermab-tune"
PARAM = "value"
SEARCH_KEYS = ("min", "max", "scale", "objective", "better")  # a study answers one search


def sampler(tune: Tune) -> optuna.samplers.BaseSampler:
    # the constraint comes with each trial (Trial.set_constraint, tell): both samplers use it.
    # The initial design is the grid enqueued in the study (open_study), so the sampler
    # models from its first trial of its own on (a random start would only repeat the grid's role).
    options = dict(n_startup_trials=1, seed=tune.seed)
    if tune.sampler == "gp":
        return optuna.samplers.GPSampler(**options)
    return optuna.samplers.TPESampler(**options)


def distribution(tune: Tune) -> optuna.distributions.FloatDistribution:
    return optuna.distributions.FloatDistribution(tune.min, tune.max, log=tune.scale == "log")


SQLITE_HEADER = b"SQLite format 3\0"
# what opening a study that is no study of this Optuna raises: SQLAlchemy's errors (not a
# database, locked, a table missing), Optuna's (a schema newer than this Optuna's is a RuntimeError)
STUDY_ERRORS = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.OptunaError, RuntimeError, ValueError, KeyError)


def unreadable(storage: Path, error: Exception) -> UserError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return UserError(
        f"{storage}: not a study this thermab can open ({type(error).__name__}: {first}); move that tune "
        "directory away to start a new search"
    )


def _check_storage(storage: Path) -> None:
    """A study file that is there is a regular SQLite file, or a UserError naming it (a
    directory or a FIFO is never opened: SQLite would fail late or block)."""
    if not os.path.lexists(storage):
        return
    check_file(storage, sys.maxsize)
    with open(storage, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header and header != SQLITE_HEADER:
        raise UserError(f"{storage}: not an SQLite database; move that tune directory away to start a new search")


def open_study(tune: Tune, storage: Path, reference: float) -> optuna.Study:
    """The tune directory's study, created or opened again; one of another search is refused,
    and so is a file that is no study of this Optuna, naming it.  A new study is given the
    initial design (``plan.initial_values``) as its first trials."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage.parent.mkdir(parents=True, exist_ok=True)
    _check_storage(storage)
    try:
        return _open(tune, storage, reference)
    except ConfigError:
        raise
    except STUDY_ERRORS as error:
        raise unreadable(storage, error) from None


def _open(tune: Tune, storage: Path, reference: float) -> optuna.Study:
    study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=f"sqlite:///{storage}",
        sampler=sampler(tune),
        direction="maximize" if tune.better == "higher" else "minimize",
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
        if t.state == optuna.trial.TrialState.RUNNING
        and type(t.user_attrs.get("tried")) is float  # as ask wrote it: anything else was never asked here
        and math.isfinite(t.user_attrs["tried"])
    ]


def ask(study: optuna.Study, tune: Tune) -> tuple[int, float]:
    """A new trial's number and the value it tries (rounded to ``tune.digits``)."""
    trial = study.ask({PARAM: distribution(tune)})
    value = min(tune.max, max(tune.min, rounded(trial.params[PARAM], tune.digits)))
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


def results(study: optuna.Study, storage: Path) -> list[Trial]:
    """Every told trial's result, in trial order; a result of another shape (written by
    another version of thermab) is a UserError naming the study and the trial."""
    told = []
    for frozen in study.get_trials(deepcopy=False):
        if "result" not in frozen.user_attrs:
            continue
        result = frozen.user_attrs["result"]
        fields = {field.name for field in dataclasses.fields(Trial)}
        if not isinstance(result, dict) or set(result) != fields:
            shown = sorted(fields ^ set(result)) if isinstance(result, dict) else type(result).__name__
            raise UserError(
                f"{storage}: trial {frozen.number}'s result is not of this thermab's shape ({shown}); "
                "move that tune directory away to start a new search"
            )
        told.append(Trial(**result))
    return told
