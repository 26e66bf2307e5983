"""``python -m thermab tune CONFIG [CONFIG ...]``: search ``tune``'s range for the setting's
best value, each trial a real run of the workflow (docs/tune.md).

Why a command and not a Snakemake target: the search is sequential and adaptive (the next
value depends on every result so far, and a trial's next look on its last), while
Snakemake's DAG is fixed when it starts.  So the tuner is the loop and Snakemake the
experiment: each look of each trial is one invocation of the workflow in the trial's own
directory (``layout.TrialDir``), with ``until: decided`` reaching one look at a time
(``ONE_LOOK_ENV``), and everything a run does (patch, restart, load, cool down, restore,
the guardian) happens as in any run.  Interrupted and run again, it opens its study,
finishes the trial that was running (that run resumes at its look) and goes on."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

import thermab
from thermab import config as thermab_config, layout
from thermab.analysis.sequential import completed_repeats, looks
from thermab.errors import StageFailed, UserError
from thermab.experiment import plan as experiment_plan
from thermab.tune import ONE_LOOK_ENV, plan, report, study as tune_study

SNAKEFILE = Path(thermab.__file__).resolve().parents[2] / "Snakefile"  # the checkout's (an editable install)


def read_config(paths: list[str]) -> dict:
    """The files merged as Snakemake merges several ``--configfile``s, then validated."""
    from snakemake.utils import update_config

    merged: dict = {}
    for path in paths:
        update_config(merged, thermab_config.read_file(path))
    try:
        config = thermab_config.validate(merged)
    except thermab_config.ConfigError as error:
        raise thermab_config.ConfigError(f"{paths[-1]}: {error}") from None
    if "tune" not in config:
        raise UserError(f"{paths[-1]}: no 'tune' section (config/README.md, 'tune')")
    plan.check_budget(config)
    return config


def phases_run(trial: layout.TrialDir, cluster: str, users=None) -> int:
    """Phase jobs the trial has run (in a run of levels each a restart and a window per level)."""
    return len(plan.ORDER) * completed_repeats(
        trial.run(cluster, plan.ORDER).path, plan.ORDER, experiment_plan.levels(users)
    )


def finished_look(
    trial: layout.TrialDir, cluster: str, max_repeats: int, keys: list[tuple[int, int | None]], users=None
) -> plan.Look | None:
    """The trial's last look, where its questions.csv answers the repeats on disk (``keys``:
    ``plan.answer_keys``; ``users``: load.users)."""
    run = trial.run(cluster, plan.ORDER)
    done = completed_repeats(run.path, plan.ORDER, experiment_plan.levels(users))
    answers_path = run.table("questions")
    if done not in looks(plan.ORDER, max_repeats) or not answers_path.exists():
        return None
    answers = pd.read_csv(answers_path)
    answers = answers[answers["arm"] == plan.CANDIDATE]
    if len(answers) != len(keys) or answers["phases_per_arm"].max() < done:
        return None  # written by an earlier look
    return plan.of_answers(done, answers.to_dict("records"), keys)


def snakemake_look(trial: layout.TrialDir, cluster: str, cores: int, snakefile: Path) -> None:
    """One invocation of the workflow in the trial's directory: up to its next look."""
    target = trial.run(cluster, plan.ORDER).table("questions").relative_to(trial.path)
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(snakefile),
        "--directory",
        str(trial.path),
        "--configfile",
        str(trial.config.resolve()),
        "--cores",
        str(cores),
        "--rerun-incomplete",
        str(target),
    ]
    with open(trial.log, "a") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, ONE_LOOK_ENV: "1"})
    if code:
        raise StageFailed(
            f"{trial.path.name}: the workflow failed (exit status {code}; {trial.log}); run the same "
            "tune again to resume it"
        )


def run_trial(
    config: dict,
    tune_dir: layout.TuneDir,
    number: int,
    value: float,
    used_elsewhere: int,
    best_estimate: float | None,
    cores: int,
    snakefile: Path,
) -> plan.Trial:
    """A trial's looks, until racing stops it (``plan.judge``)."""
    cluster = next(iter(config["clusters"]))
    tune, max_repeats = config["tune"], config["max_repeats"]
    trial = tune_dir.trial(number)
    trial.path.mkdir(parents=True, exist_ok=True)
    trial.config.write_text(yaml.safe_dump(plan.trial_config(config, value), sort_keys=False))
    keys = plan.answer_keys(tune, config["load"]["users"])
    while True:
        left = tune["budget_phases"] - used_elsewhere - phases_run(trial, cluster, config["load"]["users"])
        look = finished_look(trial, cluster, max_repeats, keys, config["load"]["users"])
        if look is not None:
            action, why = plan.judge(look, tune["better"], best_estimate, max_repeats, left)
            say(
                f"{trial.path.name} ({config['setting']['name']} = {value:g}): look at {look.phases} phases: "
                f"{action}{': ' + why if why else ''}"
            )
            if action != plan.CONTINUE:
                return plan.trial_from_look(number, value, look, action, why)
        say(
            f"{trial.path.name} ({config['setting']['name']} = {value:g}): running to its next look "
            f"({left} phases of the budget left)"
        )
        snakemake_look(trial, cluster, cores, snakefile)


def say(text: str) -> None:
    print(f"thermab tune: {text}", file=sys.stderr, flush=True)


def tune(config: dict, cores: int = 1, snakefile: Path = SNAKEFILE) -> layout.TuneDir:
    """The whole search: trials while the budget holds a decision, then the report."""
    cluster = next(iter(config["clusters"]))
    tune_cfg = config["tune"]
    tune_dir = layout.tune_dir(cluster)
    study = tune_study.open_study(tune_cfg, tune_dir.study, float(next(iter(config["arms"].values()))["value"]))
    budget, needed = tune_cfg["budget_phases"], plan.decision_phases(config["max_repeats"])
    pending = tune_study.interrupted(study)
    while True:
        told = tune_study.results(study)
        used = sum(t.phases for t in told)
        if pending:
            number, value = pending.pop(0)
        elif budget - used < needed:
            break  # no room left for one more decision
        else:
            number, value = tune_study.ask(study, tune_cfg)
        result = run_trial(
            config, tune_dir, number, value, used, plan.best_estimate(told, tune_cfg["better"]), cores, snakefile
        )
        tune_study.tell(study, result)
        report.write(tune_dir, config, tune_study.results(study))  # the answer so far, after every trial
    report.write(tune_dir, config, tune_study.results(study))
    return tune_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="thermab tune", description=__doc__.splitlines()[0])
    parser.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG",
        help="config files, merged in order as Snakemake's --configfile merges them",
    )
    parser.add_argument("--cores", type=int, default=1, help="Snakemake's --cores for each look (default 1)")
    parser.add_argument("--snakefile", type=Path, default=SNAKEFILE, help="the workflow (default: this checkout's)")
    args = parser.parse_args(argv)
    if not args.snakefile.is_file():  # a non-editable install has no checkout beside it
        raise UserError(f"--snakefile {args.snakefile}: no such file (give the checkout's Snakefile)")
    config = read_config(args.configs)
    tune_dir = tune(config, args.cores, args.snakefile)
    print(tune_dir.summary.read_text())
    return 0
