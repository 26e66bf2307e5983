"""Rule analyze: read a run directory (and the runs pooled with it) and write its numbers,
the ``analysis/`` folder (contracts.py): every table with its types, the load windows, the
acceptance balance, the telemetry's completeness, the pooled per-phase metrics, the open
questions' plan and ``analysis.json``. Nothing here is in words: the report room reads
these files back (``read_numbers``) and writes tables/*.csv and *.md, summary.md,
evidence.md and the figures from them.

The per-phase tables (thresholds, zones, cpu, performance, validity, energy) describe the
run directory. variance and the answers pool its phases with those of every run directory
given in ``also``, so that AB and BA runs together separate the order (period) effect from
the arm effect. Pooled runs must have the same arms."""

# This module does the I/O of the numbers; the computations are the pure functions of
# metrics, energy, stats, speed and questions.

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from thermab import atomic, metric_names
from thermab.analysis import (
    NUMBERS,
    energy,
    latency_table,
    levels,
    load_validity,
    metrics,
    phase_length,
    planning,
    questions,
    rest,
    sequential,
    speed,
    stats,
    wakeup,
    wall_gaps,
    washout,
)
from thermab.analysis.completeness import completeness, measured_intervals
from thermab.analysis.model import (
    Analysis,
    Plan,
    RunData,
    distinct_runs,
    load_run,
    ordered_hosts,
    read_latency,
    read_preflight,
)
from thermab.contracts import (
    ACCEPTANCE_COLUMNS,
    COMPLETENESS_COLUMNS,
    PLAN_COLUMNS,
    POOLED_COLUMNS,
    WINDOW_COLUMNS,
    AnalysisRecord,
    PhaseValidity,
)
from thermab.errors import UserError
from thermab.experiment import plan
from thermab.layout import RunDir

log = logging.getLogger(__name__)


def phase_tables(run: RunData) -> dict[str, pd.DataFrame]:
    """The load windows and the per-phase tables of one run, every row marked with whether
    its phase's load was the configured one (``load_valid``)."""
    windows = metrics.load_windows(run.events)
    reports: dict[load_validity.PhaseKey, PhaseValidity | load_validity.DerivedValidity] = {
        **load_validity.derived_reports(run.requests, windows, run.events, run.plan, run.validity),
        **run.validity,
    }
    validity = washout.with_starts(
        wall_gaps.with_wall_gaps(
            load_validity.server_view(load_validity.validity_table(reports, windows), run.telemetry, windows),
            run.telemetry,
            windows,
        ),
        windows,
        run.telemetry,
        run.events,
        run.plan.head,
        run.plan.timeline_zone,
    )
    performance = metrics.performance(run.requests, windows)
    tables = {
        "windows": windows,
        "thresholds": metrics.time_to_threshold(run.telemetry, windows, run.plan.thresholds_c),
        "zones": metrics.zone_stats(run.telemetry, windows),
        "cpu": metrics.cpu_stats(run.telemetry, windows),
        "performance": performance,
        "energy": energy.energy_table(
            run.telemetry,
            windows,
            run.events,
            run.requests,
            ordered_hosts(run.plan),
            energy.wall_meter_records(read_preflight(RunDir(run.path).preflight)),
        ),
        "speed": speed.phase_speed(run.telemetry, windows, run.plan.head),
        "latency": latency_table.latency_table(
            run.requests, windows, latency_table.sketches(read_latency(run.path), run.requests), run.plan.slo
        ),
    }
    # energy.csv keeps docs/design.md's columns exactly; a short phase's energy rows are
    # marked in the summary (its arm's †) and in the verdicts built on them
    return {
        **{name: frame if name == "energy" else load_validity.mark(frame, validity) for name, frame in tables.items()},
        "validity": validity,
        "wakeup": wakeup.wakeup_table(run.requests),  # per arm and gap, not per phase
    }


def run_metrics(run: RunData, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The per-phase metrics; in a crossover run (``until: decided``) each repeat carries its
    own order, so that the fit separates the position from the arm."""
    config = run.plan
    values = _run_metrics(run, tables)
    if config.until == "decided" and len(values):
        values["order"] = [plan.order_of_repeat(config.order, int(rep)) for rep in values["rep"]]
    return values


def _run_metrics(run: RunData, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every metric of every phase, but for heat and the others outside speed and energy per
    token the phases of the run's full window only, each with its window (``phase_length.with_windows``)."""
    config = run.plan
    values = load_validity.mark(
        pd.concat(
            [
                metrics.phase_metrics(
                    tables["zones"],
                    tables["cpu"],
                    tables["performance"],
                    ordered_hosts(config),
                    config.timeline_zone,
                ),
                energy.phase_metrics(tables["energy"]),
                wakeup.phase_metrics(run.requests),
                rest.rest_metrics(run.telemetry, run.events, ordered_hosts(config), config.timeline_zone),
                speed.phase_metrics(tables["speed"]),
                latency_table.phase_metrics(tables["latency"]),
            ],
            ignore_index=True,
        ),
        tables["validity"],
    )
    return phase_length.with_windows(values, tables["validity"])


def _check_poolable(runs: list[RunData]) -> None:
    first = runs[0].plan
    for run in runs[1:]:
        for key in ("cluster", "arms", "reference_arm"):
            if getattr(run.plan, key) != getattr(first, key):
                raise UserError(f"cannot pool {run.path} with {runs[0].path}: {key} differs")


def compute(
    run_dir: str | Path,
    also: Iterable[str | Path] = (),
    detect_pct: float = 5.0,
    analysis: dict[str, Any] | None = None,
) -> Analysis:
    """Every number the tables, summary and figures show, without writing anything.
    ``analysis``: settings in place of run.json's (``model.load_run``), for every run pooled.
    A run of levels is analysed one level at a time (analysis.levels), every row of every
    table with its ``users`` and ``load_level``."""
    unique, dropped = distinct_runs([run_dir, *also])
    for other, same in dropped:  # pooled twice, one run's sd would be 0 and its n doubled
        log.warning("%s is the same run as %s: pooled once", other, same)
    runs = [load_run(path, analysis) for path in unique]
    _check_poolable(runs)
    every = levels.of_run(runs[0].plan)
    parts = [compute_level([levels.at_level(r, level) for r in runs], detect_pct) for level in every]
    tables = levels.combine([tables for tables, _pooled, _best in parts], every)
    pooled = pd.concat(
        [levels.with_level(pooled, level) for (_t, pooled, _b), level in zip(parts, every, strict=True)],
        ignore_index=True,
    )
    best = parts[0][2] if len(parts) == 1 else None  # a sweep's best setting: of a run of one level
    run = runs[0]
    intervals = measured_intervals(run.telemetry, run.plan.head, run.sources)
    result = Analysis(run, [str(r.path) for r in runs], tables, pooled, best, sample_intervals_s=intervals)
    return dataclasses.replace(result, open_plan=_open_plan(result))


def compute_level(
    runs: list[RunData], detect_pct: float = 5.0
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame, dict[str, Any] | None]:
    """The tables, the pooled per-phase metrics and a sweep's best setting of runs at one level."""
    run = runs[0]
    config = run.plan
    every = [phase_tables(r) for r in runs]
    tables = every[0]
    pooled = pd.concat([run_metrics(r, t) for r, t in zip(runs, every, strict=False)], ignore_index=True)
    variance = stats.compare(pooled, config.arms, config.reference_arm, detect_pct=detect_pct)
    unmeasured = speed.not_measured(tables["speed"], config.arms)
    if len(unmeasured):
        variance = pd.concat([variance, unmeasured], ignore_index=True)
    tables["variance"] = variance = with_load_short(variance, pooled)
    tables["completeness"] = completeness(
        run.telemetry,
        tables["windows"],
        ordered_hosts(config),
        config.sample_intervals_s,
        config.hosts_without_zones,
        run.sources,
    )
    alpha = questions.ALPHA
    if config.until == "decided":  # each look tests at its boundary's level (analysis.sequential)
        repeats = int(pooled.groupby("arm")["rep"].nunique().min()) if len(pooled) else 0
        alpha = sequential.look_alpha(config.order, config.max_repeats, repeats)
    # the level's plan asks the questions asked at it (levels.plan_at)
    tables["questions"], tables["acceptance"] = answer_questions(
        config, pooled, pd.concat([phase_length.full_window_phases(t["validity"]) for t in every]), alpha
    )
    chosen = None
    if variance["arm"].nunique() > 2:
        chosen = stats.best_setting(
            variance,
            config.arms,
            config.reference_arm,
            metric_names.zone_mean(config.head, config.timeline_zone),
        )
    # as analysis.json records it; the choice weighs every arm's phases
    best = None if chosen is None else {**chosen, "load_short": load_validity.short_phases(pooled)}
    return tables, pooled, best


def answer_questions(
    config: Plan, pooled: pd.DataFrame, validity: pd.DataFrame, alpha: float = questions.ALPHA
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The answers (questions.csv's numbers) from the pooled per-phase metrics: a yes is
    withheld where a load fell short or, for a temperature, where the arms' starts were not
    balanced (``validity``: the phases a temperature pools, the full windows); speed and
    energy per token are answered adjusted for what each restart draws
    (``speed.adjusted_effects``).  Also the acceptance check per arm (``speed.balance_frame``), which the report puts in
    words in the answers' ``balance``."""
    unbalanced = washout.unbalanced(validity, config.reference_arm, config.start_balance_c)
    effects = stats.arm_effects(pooled, config.reference_arm)
    balance = speed.acceptance_balance(effects, config.acceptance_margin_pct, alpha)
    effects.update(speed.adjusted_effects(effects, pooled, config.reference_arm, config.covariates, questions.ALPHA))
    answers = questions.answer(
        config.questions,
        effects,
        config,
        alpha=alpha,
        withheld=questions.withheld_yes(pooled, unbalanced),
    )
    return answers, speed.balance_frame(balance, config.reference_arm)


def with_load_short(variance: pd.DataFrame, pooled: pd.DataFrame) -> pd.DataFrame:
    """``variance`` with ``load_short``, the phases behind each row (its arm's and, for a
    difference, the reference's) whose load fell short (the report's verdicts say so)."""

    def phases(row: pd.Series) -> str:
        arms = [row["arm"]] + ([row["reference"]] if pd.notna(row["reference"]) else [])
        return ", ".join(
            load_validity.short_phases(pooled[(pooled["metric"] == row["metric"]) & pooled["arm"].isin(arms)])
        )

    load_short = (variance.apply(phases, axis=1) if len(variance) else pd.Series(dtype="string")).astype("string")
    return variance.assign(load_short=load_short)


def _open_plan(result: Analysis) -> tuple[planning.Timings | None, pd.DataFrame] | None:
    """What would decide the open questions of a run of one level (a run of levels:
    ``thermab plan``)."""
    if "questions" not in result.tables or len(levels.of_run(result.run.plan)) > 1:
        return None
    tables = result.tables
    return planning.study_plan(result.run, tables["performance"], result.pooled, tables["questions"])


# --- the numbers: rule analyze's outputs, the report rules' inputs ----------------------


def write_numbers(result: Analysis) -> None:
    """RUN_DIR/analysis/ (contracts.py): every table with its types (a CSV cannot tell an
    empty text from a missing value), the load windows, the acceptance balance, the
    telemetry's completeness, the pooled per-phase metrics, the open questions' plan and
    analysis.json: everything the tables users read, the words and the figures are made from."""
    files = RunDir(result.run.path)
    files.numbers.mkdir(parents=True, exist_ok=True)
    timings, rows = result.open_plan or (None, pd.DataFrame(columns=PLAN_COLUMNS))
    frames = {files.frame(name): result.tables[name] for name in NUMBERS}
    for path, frame in {**frames, files.pooled: result.pooled, files.open_plan: rows}.items():
        with atomic.replacing(path) as temporary:
            frame.to_parquet(temporary, index=False)
    AnalysisRecord(
        result.sources,
        result.best,
        None if timings is None else dataclasses.asdict(timings),
        result.sample_intervals_s,
    ).write(files.analysis_record)


def read_numbers(run_dir: str | Path, analysis: dict[str, Any] | None = None) -> Analysis:
    """What ``write_numbers`` wrote in RUN_DIR, with the run's own data (run.json, events,
    tidy telemetry and requests) beside it: the analysis as the report rules see it."""
    files = RunDir(Path(run_dir))
    run = load_run(files.path, analysis)
    tables = {name: _read_frame(files.frame(name), FRAME_COLUMNS.get(name, ())) for name in NUMBERS}
    record = AnalysisRecord.read(files.analysis_record)
    open_plan = None
    if len(levels.of_run(run.plan)) == 1:
        timings = None if record.timings is None else planning.Timings(**record.timings)
        open_plan = (timings, _read_frame(files.open_plan, PLAN_COLUMNS))
    pooled = _read_frame(files.pooled, POOLED_COLUMNS)
    return Analysis(run, record.sources, tables, pooled, record.best, open_plan, record.sample_intervals_s)


FRAME_COLUMNS = {"windows": WINDOW_COLUMNS, "acceptance": ACCEPTANCE_COLUMNS, "completeness": COMPLETENESS_COLUMNS}


def _read_frame(path: Path, columns: Iterable[str]) -> pd.DataFrame:
    """One frame of analysis/, or a UserError naming the file where it is none or lacks a
    column of its contract."""
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a frame of the analysis: {' '.join(str(error).split())[:160]}") from None
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise UserError(f"{path}: lacks the column(s) {', '.join(missing)}")
    return frame
