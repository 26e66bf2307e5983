"""`until: decided` on the simulated cluster, whole: one Snakemake process with its lock
runs the first block (3 repeats), its look (a checkpoint) goes on, the DAG grows by the
next repeat in the same process, the look at ``max_repeats`` stops the run, and the run's
own tables are the last look's.  Tier e2e (eight phase jobs of the short config, minutes)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from support.command_line import snakemake_command
from support.sim_runs import CONFIGS, assert_clean, ports_file
from thermab import layout
from thermab.config import default_questions
from thermab.contracts import Decision

STUDY = ["--config", "until=decided", "max_repeats=4"]
# beside the default questions, one no run can decide (equivalence within ± 0 is never
# `yes`, and `no` would need the arms' stall gaps to differ significantly), so the look at
# 3 repeats goes on whatever the others answer
UNDECIDABLE = {"metric": "stall gaps", "kind": "equivalent", "margin": 0}


def questions_file(workdir: Path) -> str:
    path = workdir / "questions.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump({"questions": [*default_questions(), UNDECIDABLE]}))
    return str(path)


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    configfiles = [*CONFIGS, ports_file(workdir), questions_file(workdir)]
    command = snakemake_command(workdir, *args, configfiles=configfiles)
    result = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    (workdir / f"snakemake-{len(list(workdir.glob('snakemake-*.log')))}.log").write_text(result.stdout + result.stderr)
    return result


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("until-decided")
    result = snakemake(workdir, "all", *STUDY)
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir, result.stdout + result.stderr


def run_of(workdir: Path) -> layout.RunDir:
    return layout.RunDir(workdir / layout.run_dir("sim", "AB").path)


def test_one_snakemake_process_runs_every_look(study):
    workdir, output = study
    # one DAG built, grown at each look: no second snakemake started on the directory
    assert output.count("Building DAG of jobs") == 1 and output.count("Complete log(s):") == 1
    # both blocks, both looks and the run's end: the last count is every job the grown DAG had
    steps = [(int(done), int(total)) for done, total in re.findall(r"(\d+) of (\d+) steps", output)]
    assert steps and steps[-1][0] == steps[-1][1] == max(total for _, total in steps), steps
    run = run_of(workdir)
    first, last = Decision.read(run.look(3).decision), Decision.read(run.look(4).decision)
    assert first.next_repeats == 4 and first.load_s is not None  # the first look that tests: 3 residual df
    assert not last.goes_on and "thermab: until decided: stopped at 4 repeats" in output
    assert len(list(run.phases.glob("rep*/phase.json"))) == 8


def test_the_runs_tables_are_its_last_looks(study):
    run = run_of(study[0])
    final, looked = pd.read_csv(run.table("questions")), pd.read_csv(run.look(4).table("questions"))
    assert final["phases_per_arm"].max() == 4
    columns = ["question", "arm", "verdict", "estimate", "ci_low", "ci_high"]
    pd.testing.assert_frame_equal(final[columns], looked[columns])
    assert json.loads(run.stopped.read_text()) == json.loads(run.look(4).stopped.read_text())


def test_the_archived_dag_shows_every_look(study):
    dag = (run_of(study[0]).provenance / "dag.mmd").read_text()
    looks = [line for line in dag.splitlines() if '["look' in line]
    assert len(looks) == 2 and all(any(f"repeats: {r}" in line for line in looks) for r in (3, 4))


def test_a_dry_run_after_the_study_has_nothing_to_do_and_nothing_was_left_running(study):
    workdir, _ = study
    dry = snakemake(workdir, "all", "-n", *STUDY)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    assert_clean(workdir, run_of(workdir).path)


def test_a_raised_max_repeats_decides_the_last_look_again_and_keeps_every_phase(study):
    """The look that stopped the run decides again with the new cap; the look that went on
    and every phase that ran are kept (a dry run lists that one look and what waits on it)."""
    workdir, _ = study
    dry = snakemake(workdir, "all", "-n", "--config", "until=decided", "max_repeats=6")
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0, text[-3000:]
    jobs = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):\n(?:.*\n)*?\s+wildcards: (.*)$", text, flags=re.M)
    assert [wildcards for rule, wildcards in jobs if rule == "look"] == ["cluster=sim, order=AB, repeats=4"]
    assert not [rule for rule, _ in jobs if rule in ("phase", "baseline", "preflight", "monitor_start")]
