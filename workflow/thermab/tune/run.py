"""Search the tune range for the setting's best value, each trial a real run of the
workflow (docs/tune.md).

    python -m thermab tune CONFIG [CONFIG ...] [--cores N]

Interrupted and run again, it opens its study, finishes the trial that was running (that run
resumes at its look) and goes on.
"""

# Why a command and not a Snakemake target: the search is sequential and adaptive (the next
# value depends on every result so far, and whether a trial goes on to its next look on the
# other trials' results, racing), which no one trial's DAG holds. So the tuner is the loop
# and Snakemake the experiment: each look of each trial is one invocation of the workflow in the trial's own
# directory (layout.TrialDir) whose target is that look's checkpoint (the look's decision,
# looks/{repeats}/look.json, as `until: decided` makes it), and everything a run does (patch,
# restart, load, cool down, restore, the guardian) happens as in any run.

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from thermab import cli, config as thermab_config, layout
from thermab.analysis.sequential import completed_repeats, looks, read_answers
from thermab.errors import StageFailed, UserError
from thermab.experiment import plan as experiment_plan
from thermab.experiment.launch import SNAKEFILE
from thermab.tune import answer, racing, study as tune_study


def read_config(paths: list[str]) -> thermab_config.Config:
    """The files merged as Snakemake merges several ``--configfile``s, validated, and the
    view the tune reads them through."""
    config = thermab_config.view(thermab_config.load(paths))
    if "tune" not in config:
        raise UserError(f"{paths[-1]}: no 'tune' section (config/README.md, 'tune')")
    racing.check_budget(config)
    return config


def phases_run(trial: layout.TrialDir, cluster: str, load: dict) -> int:
    """Phase jobs the trial has run (in a run of levels each a restart and a window per level)."""
    return len(racing.ORDER) * completed_repeats(
        trial.run(cluster, racing.ORDER).path, racing.ORDER, experiment_plan.levels(load)
    )


def finished_look(
    trial: layout.TrialDir, cluster: str, max_repeats: int, keys: list[tuple[int, str | None]], load: dict
) -> racing.Look | None:
    """The trial's last look, where the look's questions.csv answers the repeats on disk
    (``keys``: ``racing.answer_keys``; ``load``: the config's load)."""
    run = trial.run(cluster, racing.ORDER)
    done = completed_repeats(run.path, racing.ORDER, experiment_plan.levels(load))
    answers_path = run.look(done).table("questions")
    if done not in looks(racing.ORDER, max_repeats) or not answers_path.exists():
        return None
    answers = read_answers(answers_path)
    if "arm" not in answers.columns:
        raise UserError(f"{answers_path}: missing column(s) arm")
    answers = answers[answers["arm"] == racing.CANDIDATE]
    if len(answers) != len(keys) or answers["phases_per_arm"].max() < done:
        return None  # written by an earlier look
    return racing.of_answers(done, answers.to_dict("records"), keys)


def next_look(trial: layout.TrialDir, cluster: str, max_repeats: int, load: dict) -> int:
    """The repeats of the trial's next look: the first not yet decided at or after the
    repeats on disk (a look interrupted before its decision runs again)."""
    run = trial.run(cluster, racing.ORDER)
    done = completed_repeats(run.path, racing.ORDER, experiment_plan.levels(load))
    points = looks(racing.ORDER, max_repeats)
    return next((r for r in points if r >= done and not run.look(r).decision.exists()), points[-1])


def snakemake_look(trial: layout.TrialDir, cluster: str, repeats: int, cores: int, snakefile: Path) -> None:
    """One invocation of the workflow in the trial's directory: up to its look at ``repeats``."""
    target = trial.run(cluster, racing.ORDER).look(repeats).decision.relative_to(trial.path)
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
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    if code:
        raise StageFailed(
            f"{trial.path.name}: the workflow failed (exit status {code}; {trial.log}); run the same "
            "tune again to resume it"
        )


def run_trial(
    config: thermab_config.Config,
    tune_dir: layout.TuneDir,
    number: int,
    value: float,
    used_elsewhere: int,
    best_estimate: float | None,
    cores: int,
    snakefile: Path,
) -> racing.Trial:
    """A trial's looks, until racing stops it (``racing.judge``)."""
    cluster = next(iter(config.clusters))
    tune, max_repeats = config.tune, config.max_repeats
    # the experiment's functions take load as the config writes it (users a number or a list)
    load = thermab_config.thaw(config.load)
    trial = tune_dir.trial(number)
    trial.path.mkdir(parents=True, exist_ok=True)
    trial.config.write_text(yaml.safe_dump(racing.trial_config(config, value), sort_keys=False))
    keys = racing.answer_keys(tune, load)
    while True:
        left = tune.budget_phases - used_elsewhere - phases_run(trial, cluster, load)
        look = finished_look(trial, cluster, max_repeats, keys, load)
        if look is not None:
            action, why = racing.judge(look, tune.better, best_estimate, max_repeats, left)
            say(
                f"{trial.path.name} ({config.setting.name} = {value:g}): look at {look.phases} phases: "
                f"{action}{': ' + why if why else ''}"
            )
            if action != racing.CONTINUE:
                return racing.trial_from_look(number, value, look, action, why)
        say(
            f"{trial.path.name} ({config.setting.name} = {value:g}): running to its next look "
            f"({left} phases of the budget left)"
        )
        snakemake_look(trial, cluster, next_look(trial, cluster, max_repeats, load), cores, snakefile)


def say(text: str) -> None:
    print(f"thermab tune: {text}", file=sys.stderr, flush=True)


def tune(config: thermab_config.Config, cores: int = 1, snakefile: Path = SNAKEFILE) -> layout.TuneDir:
    """The whole search: trials while the budget holds a decision, then the report."""
    cluster = next(iter(config.clusters))
    tune_cfg = config.tune
    tune_dir = layout.tune_dir(cluster)
    reference = thermab_config.literal_number(next(iter(config.arms.values())).value)
    study = tune_study.open_study(tune_cfg, tune_dir.study, reference)
    budget, needed = tune_cfg.budget_phases, racing.decision_phases(config.max_repeats)
    pending = tune_study.interrupted(study)
    while True:
        told = tune_study.results(study, tune_dir.study)
        used = sum(t.phases for t in told)
        if pending:
            number, value = pending.pop(0)
        elif budget - used < needed:
            break  # no room left for one more decision
        else:
            number, value = tune_study.ask(study, tune_cfg)
            left_over(tune_dir.trial(number), tune_dir.study)
        result = run_trial(
            config, tune_dir, number, value, used, racing.best_estimate(told, tune_cfg.better), cores, snakefile
        )
        tune_study.tell(study, result)
        answer.write(tune_dir, config, tune_study.results(study, tune_dir.study))  # the answer so far
    answer.write(tune_dir, config, tune_study.results(study, tune_dir.study))
    return tune_dir


def left_over(trial: layout.TrialDir, storage: Path) -> None:
    """A trial the study has just asked for has no directory yet: one that is there was left
    by another search (its study moved or deleted), and its looks are not this trial's."""
    if os.path.lexists(trial.path):
        raise UserError(
            f"{trial.path}: left from another search ({storage} has just asked for this trial); "
            "move the tune directory away to start a new search"
        )


def main(argv: list[str]) -> int:
    parser = cli.parser("tune", __doc__)
    parser.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG",
        help="config files, merged in order as Snakemake's --configfile merges them",
    )
    parser.add_argument(
        "--cores",
        type=cli.number(1, cli.MAX_CORES, parse=int),
        default=1,
        help="Snakemake's --cores for each look (default 1)",
    )
    parser.add_argument("--snakefile", type=Path, default=SNAKEFILE, help="the workflow (default: this checkout's)")
    args = parser.parse_args(argv)
    if not args.snakefile.is_file():  # a non-editable install has no checkout beside it
        raise UserError(f"--snakefile {args.snakefile}: no such file (give the checkout's Snakefile)")
    config = read_config(args.configs)
    tune_dir = tune(config, args.cores, args.snakefile)
    print(tune_dir.summary.read_text())
    return 0
