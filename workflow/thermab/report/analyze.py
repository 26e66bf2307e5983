"""Read a run directory, write its numbers (tables/*.csv, analysis/) and its words
(tables/*.md, summary.md, evidence.md).

    python -m thermab analyze RUN_DIR [--also OTHER_RUN_DIR ...] [--siblings] [--figures]

The per-phase tables (thresholds, zones, cpu, performance, validity, energy) and summary.md
describe RUN_DIR. variance.csv and the verdicts pool the phases of RUN_DIR and of every run
directory given with --also (--siblings: every other directory next to RUN_DIR holding a
run.json of the same cluster, e.g. results/sim/BA for results/sim/AB), so that AB and BA
runs together separate the order (period) effect from the arm effect. Pooled runs must have
the same arms.
"""

# This module does the I/O; the computations are the pure functions of metrics, energy,
# stats and summary. The rules split it at the files: analyze computes and writes the
# numbers (``write_numbers``), summary, evidence and figures read them back
# (``read_numbers``) and never compute; the command and a look do both in one process.

import dataclasses
import logging
from pathlib import Path

import pandas as pd

from thermab import atomic, cli, metric_names
from thermab.analysis import (
    NUMBERS,
    TABLES,
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
    sibling_runs,
)
from thermab.contracts import (
    ACCEPTANCE_COLUMNS,
    PLAN_COLUMNS,
    POOLED_COLUMNS,
    WINDOW_COLUMNS,
    AnalysisRecord,
)
from thermab.errors import UserError
from thermab.experiment import plan
from thermab.layout import RunDir
from thermab.markup import md_text
from thermab.report import evidence, levels_summary, plan_words, summary

log = logging.getLogger(__name__)


def phase_tables(run: RunData) -> dict[str, pd.DataFrame]:
    """The load windows and the per-phase tables of one run, every row marked with whether
    its phase's load was the configured one (``load_valid``)."""
    windows = metrics.load_windows(run.events)
    reports = {
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
    token the phases of the run's full window only (``phase_length.full_window_only``)."""
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
    return phase_length.full_window_only(values, tables["validity"])


def _check_poolable(runs: list[RunData]) -> None:
    first = runs[0].plan
    for run in runs[1:]:
        for key in ("cluster", "arms", "reference_arm"):
            if getattr(run.plan, key) != getattr(first, key):
                raise UserError(f"cannot pool {run.path} with {runs[0].path}: {key} differs")


def compute(run_dir, also=(), detect_pct: float = 5.0, analysis: dict | None = None) -> Analysis:
    """Everything the tables, summary and figures show, without writing anything.
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
    result = Analysis(runs[0], [str(r.path) for r in runs], tables, pooled, best)
    return dataclasses.replace(result, open_plan=_open_plan(result))


def compute_level(runs: list[RunData], detect_pct: float = 5.0) -> tuple[dict, pd.DataFrame, dict | None]:
    """The tables, the pooled per-phase metrics and a sweep's best setting of runs at one level."""
    run = runs[0]
    config = run.plan
    every = [phase_tables(r) for r in runs]
    tables = every[0]
    pooled = pd.concat([run_metrics(r, t) for r, t in zip(runs, every, strict=False)], ignore_index=True)
    variance = stats.compare(pooled, config.arms, config.reference_arm, detect_pct=detect_pct)
    variance["verdict"] = summary.verdicts(variance)
    unmeasured = speed.not_measured(tables["speed"], config.arms)
    if len(unmeasured):
        variance = pd.concat([variance, unmeasured], ignore_index=True)
    tables["variance"] = variance = summary.note_verdicts(variance, pooled)
    alpha = questions.ALPHA
    if config.until == "decided":  # each look tests at its boundary's level (analysis.sequential)
        repeats = int(pooled.groupby("arm")["rep"].nunique().min()) if len(pooled) else 0
        alpha = sequential.look_alpha(config.order, config.max_repeats, repeats)
    # the level's plan asks the questions asked at it (levels.plan_at)
    tables["questions"], tables["acceptance"] = answer_questions(
        config, pooled, pd.concat([t["validity"] for t in every]), alpha
    )
    best = None
    if variance["arm"].nunique() > 2:
        best = stats.best_setting(
            variance,
            config.arms,
            config.reference_arm,
            metric_names.zone_mean(config.head, config.timeline_zone),
        )
    if best is not None:  # the choice weighs every arm's phases
        best["load_short"] = load_validity.short_phases(pooled)
    return tables, pooled, best


def answer_questions(config: Plan, pooled: pd.DataFrame, validity: pd.DataFrame, alpha: float = questions.ALPHA):
    """questions.csv from the pooled per-phase metrics: a yes is withheld where a load fell
    short or, for a temperature, where the arms' starts were not balanced; speed and energy
    per token are answered adjusted for what each restart draws (``speed.adjusted_effects``).
    Also the acceptance check per arm (``speed.balance_frame``), for the summary."""
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
        balance={arm: summary.balance_words(arm, config.reference_arm, check) for arm, check in balance.items()},
    )
    return answers, speed.balance_frame(balance, config.reference_arm)


def analyze(run_dir, also=(), detect_pct: float = 5.0, analysis: dict | None = None) -> dict[str, pd.DataFrame]:
    """Write RUN_DIR's numbers (``write_numbers``) and its words (``write_words``) in one go,
    as the rules analyze, summary and evidence do; return the frames (plus ``windows``)."""
    return write_outputs(compute(run_dir, also, detect_pct, analysis))


def write_outputs(result: Analysis) -> dict[str, pd.DataFrame]:
    """Both sides in one process: the numbers, then the words made from them."""
    write_numbers(result)
    write_words(result)
    return result.tables


def _open_plan(result: Analysis) -> tuple[planning.Timings | None, pd.DataFrame] | None:
    """What would decide the open questions of a run of one level (a run of levels:
    ``thermab plan``)."""
    if "questions" not in result.tables or len(levels.of_run(result.run.plan)) > 1:
        return None
    tables = result.tables
    return planning.study_plan(result.run, tables["performance"], result.pooled, tables["questions"])


# --- the numbers: rule analyze's outputs, the report rules' inputs ----------------------


def write_numbers(result: Analysis) -> None:
    """RUN_DIR/tables/*.csv, and RUN_DIR/analysis/ (contracts.py): every table with its
    types (a CSV cannot tell an empty text from a missing value), the load windows, the
    acceptance balance, the pooled per-phase metrics, the open questions' plan and
    analysis.json: everything the words and figures are made from."""
    files = RunDir(result.run.path)
    _write_csv(files.tables, result.tables)
    files.numbers.mkdir(parents=True, exist_ok=True)
    timings, rows = result.open_plan or (None, pd.DataFrame(columns=PLAN_COLUMNS))
    frames = {files.frame(name): result.tables[name] for name in NUMBERS}
    for path, frame in {**frames, files.pooled: result.pooled, files.open_plan: rows}.items():
        with atomic.replacing(path) as temporary:
            frame.to_parquet(temporary, index=False)
    AnalysisRecord(result.sources, result.best, None if timings is None else dataclasses.asdict(timings)).write(
        files.analysis_record
    )


def read_numbers(run_dir, analysis: dict | None = None) -> Analysis:
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
    return Analysis(run, record.sources, tables, pooled, record.best, open_plan)


FRAME_COLUMNS = {"windows": WINDOW_COLUMNS, "acceptance": ACCEPTANCE_COLUMNS}


def _read_frame(path: Path, columns) -> pd.DataFrame:
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


# --- the words: the report rules' outputs ----------------------------------------------


def write_words(result: Analysis) -> None:
    """RUN_DIR/tables/*.md, RUN_DIR/summary.md and RUN_DIR/evidence.md."""
    write_table_words(result)
    write_summary(result)
    write_evidence(result)


def write_table_words(result: Analysis) -> None:
    _write_markdown(RunDir(result.run.path).tables, result.tables)


def write_summary(result: Analysis) -> None:
    run = result.run
    files = RunDir(run.path)
    every = levels.of_run(run.plan)
    if len(every) == 1:
        text = _summary(result, result.tables, run.plan)
    else:  # each level's summary under the questions across levels
        texts = {
            level.label: _summary(result, levels.tables_at(result.tables, level), levels.plan_at(run.plan, level))
            for level in every
        }
        text = levels_summary.markdown(run.plan, result.tables, result.pooled, texts)
    tables = result.tables
    opening = evidence.opening(
        tables["questions"], tables["variance"], run.plan, read_preflight(files.preflight), run.events
    )
    title, _, rest = text.partition("\n")  # the answer first, under the title
    atomic.write_text(files.summary, "\n".join([title, "", *opening, rest.lstrip("\n")]))


def write_evidence(result: Analysis) -> None:
    run, tables = result.run, result.tables
    files = RunDir(run.path)
    atomic.write_text(
        files.evidence,
        evidence.evidence_markdown(
            run.plan,
            tables["questions"],
            tables["variance"],
            tables["windows"],
            preflight=read_preflight(files.preflight),
            events=run.events,
            sources=run.sources,
            asked_s=tables["validity"]["load_s"],
            energy=tables.get("energy"),
        ),
    )


def _summary(result: Analysis, tables: dict[str, pd.DataFrame], config: Plan) -> str:
    telemetry = result.run.telemetry
    return summary.summary_markdown(
        config,
        tables,
        tables["variance"],
        sample_interval_s=measured_intervals(telemetry, config.head, result.run.sources),
        sources=result.sources,
        best=result.best,
        completeness=completeness(
            telemetry,
            tables["windows"],
            ordered_hosts(config),
            config.sample_intervals_s,
            config.hosts_without_zones,
            result.run.sources,
        ),
        open_plan=_open_plan_words(result, tables, config),
    )


def _open_plan_words(result: Analysis, tables: dict[str, pd.DataFrame], config: Plan) -> list[str]:
    """The open questions' paragraph of a run of one level."""
    if result.open_plan is None:
        return []
    timings, rows = result.open_plan
    simulated = bool(evidence.simulated_hosts(read_preflight(RunDir(result.run.path).preflight)))
    return plan_words.open_questions_section(
        rows, tables["questions"], config, timings, result.run.events, result.run.path, simulated
    )


def compare_runs(run_dirs: list[Path], out_dir: Path, analysis: dict | None = None) -> pd.DataFrame:
    """Pool every run of a cluster (AB and BA, all repeats) into one variance table and
    its verdicts: ``out_dir/variance.{csv,md}`` and ``out_dir/summary.md``. With both
    orders present the period effect is separated from the arm effect (stats.compare)."""
    result = compute(run_dirs[0], also=run_dirs[1:], analysis=analysis)
    variance = result.tables["variance"]
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(out_dir, {"variance": variance})
    _write_markdown(out_dir, {"variance": variance})
    orders = sorted(pd.unique(result.pooled["order"]))
    lines = [
        f"# {md_text(result.run.plan.cluster)}: every run pooled",
        "",
        f"Runs: {', '.join(md_text(p) for p in run_dirs)} (orders {', '.join(map(md_text, orders))});"
        " n = phases per arm across them.",
        "",
        "## Verdicts",
        "",
    ]
    lines += [f"- {md_text(v)}" for v in variance["verdict"].dropna() if not v.startswith("reference")]
    lines += ["", "## Variance per arm", "", summary.markdown_table(variance), ""]
    atomic.write_text(out_dir / "summary.md", "\n".join(lines))
    return variance


def _write_csv(out: Path, tables: dict[str, pd.DataFrame]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in [n for n in TABLES if n in tables]:
        with atomic.replacing(out / f"{name}.csv") as temporary:
            tables[name].to_csv(temporary, index=False)


def _write_markdown(out: Path, tables: dict[str, pd.DataFrame]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in [n for n in TABLES if n in tables]:
        frame = tables[name]
        text = summary.markdown_table(frame)
        if name == "performance" and frame["requests_completed"].isna().all():
            text += "\nNo request data in this run (imported runs have none): performance is not measured.\n"
        if name in ("zones", "thresholds") and frame.empty:
            text += (
                "\nNo thermal zone was sampled on any host in the load windows: there are no temperatures"
                " in this run (empty, not zero).\n"
            )
        if name == "energy" and frame.empty:
            text += (
                "\nNo power domain was sampled on any host in the load windows: there is no energy"
                " in this run (empty, not zero).\n"
            )
        atomic.write_text(out / f"{name}.md", text)


def main(argv=None) -> int:
    parser = cli.parser("analyze", __doc__)
    parser.add_argument("run_dir", help="results/{cluster}/{order} or an imported run directory")
    parser.add_argument(
        "--also",
        nargs="*",
        default=[],
        metavar="RUN_DIR",
        help="further run directories of the same cluster to pool for variance.csv",
    )
    parser.add_argument(
        "--siblings", action="store_true", help="pool every other run directory next to RUN_DIR with the same cluster"
    )
    parser.add_argument(
        "--detect-pct",
        type=cli.number(0),
        default=5.0,
        help="difference in %% of the reference for the repeats-needed estimate",
    )
    parser.add_argument("--figures", action="store_true", help="also render RUN_DIR/figures/")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    also = list(args.also) + (sibling_runs(args.run_dir) if args.siblings else [])
    result = compute(args.run_dir, also=also, detect_pct=args.detect_pct)
    write_outputs(result)
    log.info("wrote %s and %s", RunDir(args.run_dir).tables, RunDir(args.run_dir).summary)
    if args.figures:
        from thermab.report import plots  # matplotlib and plotly only when figures are asked for

        for path in plots.render_figures(result):
            log.info("wrote %s", path)
    return 0
