"""Repeats until decided as Snakemake checkpoints, seen by Snakemake's dry run: a run
directory after its look at 3 repeats, the look's decision as the checkpoint wrote it, and
what `snakemake -n all --config until=decided` plans from there (one process, the lock on)."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from support.command_line import run_snakemake
from support.paths import REPO
from thermab import config, layout
from thermab.contracts import Decision

DEFAULT = config.load(REPO / "config" / "config.yaml", REPO)
CLUSTER, ORDER = next(iter(DEFAULT["clusters"])), DEFAULT["order"]


def looked(workdir, decision: bytes) -> layout.RunDir:
    """The files of a run whose first block (repeats 1 to 3) ran and whose look at 3 wrote
    ``decision``, each written after the files it was made from (Snakemake compares times)."""
    run = layout.RunDir(workdir / layout.run_dir(CLUSTER, ORDER).path)
    look = run.look(3)
    made = [run.preflight, run.run_json, run.started, run.phase(layout.BASELINE).phase_json]
    for phase_id in ("rep1-A", "rep1-B", "rep2-B", "rep2-A", "rep3-A", "rep3-B"):
        made += [run.phase(phase_id).phase_json, run.phase(phase_id).requests]
    made += [look.stopped, look.table("questions"), look.decision]
    for when, path in enumerate(made):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(decision if path == look.decision else b"{}")
        os.utime(path, (1e9 + when, 1e9 + when))
    return run


def as_bytes(decision: Decision) -> bytes:
    return json.dumps(dataclasses.asdict(decision)).encode()


def dry_run(workdir):
    # files written here have no metadata of Snakemake: only their times tell what is done
    result = run_snakemake(
        workdir, "-n", "all", "--rerun-triggers", "mtime", "--config", "until=decided", "max_repeats=6"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout + result.stderr


def planned(text: str, rule: str) -> list[str]:
    """The wildcards line of each job of ``rule`` in a dry run's listing."""
    blocks = re.split(r"\n(?:rule|checkpoint) ", text)[1:]
    return [
        line.strip()
        for block in blocks
        if block.startswith(f"{rule}:")
        for line in block.splitlines()
        if "wildcards:" in line
    ]


def test_a_look_that_goes_on_plans_the_next_block_and_its_look_only(tmp_path):
    looked(tmp_path, as_bytes(Decision(3, 4, 30, "questions still open")))
    text = dry_run(tmp_path)
    phases = planned(text, "phase")
    assert sorted(phases) == sorted(f"wildcards: cluster={CLUSTER}, order={ORDER}, rep=4, arm={arm}" for arm in "BA"), (
        "the phases that ran are kept, the next block's planned"
    )
    assert planned(text, "look") == [f"wildcards: cluster={CLUSTER}, order={ORDER}, repeats=4"]
    assert "--nolock" not in text and "checkpoint jobs" in text  # the DAG grows after the look, in this process
    assert planned(text, "monitor_stop") and planned(text, "figures")  # the run's end waits for the look


def test_a_look_that_stops_plans_the_run_end_from_it(tmp_path):
    run = looked(tmp_path, as_bytes(Decision(3, None, None, "every question decided")))
    text = dry_run(tmp_path)
    assert not planned(text, "phase") and not planned(text, "look")
    stop = re.split(r"\n(?:rule|checkpoint) ", text.split("\nrule monitor_stop:")[1])[0]
    assert str(run.look(3).stopped.relative_to(tmp_path)) in stop  # the run's stop is its last look's


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe garbage \x00", b'{"repeats": 3}', b'{"repeats": 3, "next_repeats": 1, "load_s": 30, "why": ""}'],
)
def test_a_damaged_decision_stops_snakemake_in_one_line(tmp_path, content):
    """The workflow reads each look's decision as Snakemake builds the DAG (even for `-n`):
    a damaged one is one line naming it, exit 2, no traceback; never a look taken as decided."""
    run = looked(tmp_path, content)
    result = run_snakemake(tmp_path, "-n", "all", "--rerun-triggers", "mtime", "--config", "until=decided")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"thermab: {run.look(3).decision.relative_to(tmp_path)}: not a look's decision"), last
