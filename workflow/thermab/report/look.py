"""A look of ``until: decided``: the Snakemake checkpoint ``look`` (workflow/rules/analyze.smk).

The phases up to the look are stopped, ingested and analysed by the same functions as the
run's end (``monitor.monitor_stop``, ``ingest.ingest``, ``analyze.analyze``), in the look's
own run directory (``layout.RunDir.look``: ``looks/{repeats}/``, the run's files and the
look's phases linked in), so one DAG holds every look and the run's own tables are made
once, at its end.  The look then writes its decision (``contracts.Decision``): whether the
study goes on, to which look, and the next block's load window; the workflow's input
functions read it (docs/design.md, "Repeats until decided").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from thermab.analysis import phase_length, planning, sequential
from thermab.contracts import Decision
from thermab.experiment import monitor, plan
from thermab.experiment.cluster import ClusterRun
from thermab.layout import BASELINE, RunDir
from thermab.load_levels import Level
from thermab.report.analyze import analyze
from thermab.telemetry import ingest


def _link(path: Path, target: Path) -> None:
    """``path`` a relative link to ``target`` (kept where a resumed look made it already)."""
    if not path.is_symlink():
        path.symlink_to(os.path.relpath(target, path.parent))


def view(run_dir: Path, repeats: int, order: str, every: list[Level] | None) -> RunDir:
    """``looks/{repeats}/`` as a run directory of the phases up to the look: run.json,
    preflight.json, events.jsonl, the baseline and those phases, and each host's pulled
    logs linked from the run; its monitor/stopped.json, tidy/ and tables/ its own."""
    run, look = RunDir(run_dir), RunDir(run_dir).look(repeats)
    look.phases.mkdir(parents=True, exist_ok=True)
    look.monitor.mkdir(exist_ok=True)
    for shared in (run.run_json, run.preflight, run.events):
        _link(look.path / shared.name, shared)
    for phase_id in [BASELINE, *(phase.id for phase in plan.phases(order, repeats, True, every))]:
        _link(look.phase(phase_id).path, run.phase(phase_id).path)
    for host_logs in (entry for entry in run.monitor.iterdir() if entry.is_dir()):
        _link(look.monitor / host_logs.name, host_logs)
    return look


def decide(look: RunDir, run: ClusterRun, repeats: int, settings: dict[str, Any]) -> Decision:
    """The look's decision from its own tables: the next look while a question is open,
    ``max_repeats`` is not reached and the next look fits in ``budget_hours`` (``settings``:
    what it decides with, kept in the decision)."""
    config, order, every = run.config, run.order, plan.levels(run.config.load)
    timings = config.timings
    if sequential.resume_repeats(look.path, order, config.max_repeats, every) > repeats:
        window = phase_length.next_block_window(
            look.path, order, next(iter(config.arms)), timings.load_s, timings.min_load_s
        )
        jobs = planning.NextJobs(window, timings.load_s, timings.cooldown_max_s, len(every or [None]))
        reached = planning.resume_within_budget(
            look.path, order, config.max_repeats, every, config.budget_hours, timings.time_scale, jobs
        )
        if reached > repeats:
            return Decision(repeats, reached, window, f"questions still open: going on to {reached} repeats", settings)
        why = f"the next look does not fit in budget_hours {config.budget_hours:g}"
    elif repeats >= config.max_repeats:
        why = f"max_repeats {config.max_repeats} reached"
    else:
        why = "every question decided"
    return Decision(repeats, None, None, why, settings)


def look(run: ClusterRun, repeats: int, settings: dict[str, Any], out: Path) -> Decision:
    """The look at ``repeats``: every host put back and its logs pulled (the phases after it
    bring them up again), the look's tables, and its decision written to ``out``
    (``settings``: the rule's, ``analysis`` among them; the command a look prints comes from
    run.json's record of how the run was started)."""
    every = plan.levels(run.config.load)
    stopped = RunDir(run.run_dir).look(repeats).stopped
    stopped.parent.mkdir(parents=True, exist_ok=True)
    monitor.monitor_stop(run, stopped)  # before the view: it links the logs this pulls
    files = view(run.run_dir, repeats, run.order, every)
    requests = [files.phase(phase.id).requests for phase in plan.phases(run.order, repeats, True, every)]
    ingest.ingest(files.path, requests, files.tidy_telemetry, files.tidy_requests)
    analyze(files.path, analysis=settings["analysis"])
    decision = decide(files, run, repeats, settings)
    decision.write(out)
    return decision
