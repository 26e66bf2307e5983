"""Read a run directory, write its numbers (analysis/), its tables (tables/*.csv, *.md) and
its words (summary.md, evidence.md).

    python -m thermab analyze RUN_DIR [--also OTHER_RUN_DIR ...] [--siblings] [--figures]

The per-phase tables (thresholds, zones, cpu, performance, validity, energy) and summary.md
describe RUN_DIR. variance.csv and the verdicts pool the phases of RUN_DIR and of every run
directory given with --also (--siblings: every other directory next to RUN_DIR holding a
run.json of the same cluster, e.g. results/sim/BA for results/sim/AB), so that AB and BA
runs together separate the order (period) effect from the arm effect. Pooled runs must have
the same arms.
"""

# The report's side of the border: the analysis computes and writes the numbers
# (``run_analysis``, rule analyze); here they are put in words. The rules tables, summary
# and evidence read them back (``read_report``) and never compute; the command and a look
# do both in one process (``write_outputs``).

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from thermab import atomic, cli, metric_names
from thermab.analysis import TABLES, levels, speed
from thermab.analysis.model import Analysis, Plan, read_preflight, sibling_runs
from thermab.analysis.questions import ANSWER_COLUMNS, QUESTION_COLUMNS
from thermab.analysis.run_analysis import compute, read_numbers, write_numbers
from thermab.layout import RunDir
from thermab.markup import md_text
from thermab.report import evidence, levels_summary, plan_words, summary

log = logging.getLogger(__name__)


def analyze(
    run_dir: str | Path,
    also: Sequence[str | Path] = (),
    detect_pct: float = 5.0,
    analysis: dict[str, Any] | None = None,
) -> dict[str, pd.DataFrame]:
    """Write RUN_DIR's numbers (``run_analysis.write_numbers``), its tables and its words in
    one go, as the rules analyze, tables, summary and evidence do; return the tables in words."""
    return write_outputs(compute(run_dir, also, detect_pct, analysis))


def write_outputs(result: Analysis) -> dict[str, pd.DataFrame]:
    """Both sides in one process: the numbers, then the tables and words made from them."""
    write_numbers(result)
    worded = in_words(result)
    write_tables(worded)
    write_words(worded)
    return worded.tables


def read_report(run_dir: str | Path, analysis: dict[str, Any] | None = None) -> Analysis:
    """The numbers rule analyze wrote in RUN_DIR (``run_analysis.read_numbers``), in words:
    what the report rules read."""
    return in_words(read_numbers(run_dir, analysis))


# --- the word columns of the tables users read ------------------------------------------


def in_words(result: Analysis) -> Analysis:
    """``result`` with the word columns of its tables: variance's ``verdict`` (a sentence per
    row), the answers' ``adjustment`` and ``balance`` (questions.csv's columns, in its order);
    the codes they are made from left out."""
    tables = dict(result.tables)
    variance = tables["variance"]
    verdicts = summary.verdicts(variance)
    tables["variance"] = _placed(
        variance.drop(columns=[speed.NOT_MEASURED], errors="ignore"), "verdict", verdicts, anchor="load_short"
    )
    tables["questions"] = answers_in_words(tables["questions"], tables["acceptance"], result.run.plan)
    return dataclasses.replace(result, tables=tables)


def _placed(frame: pd.DataFrame, column: str, values: pd.Series, anchor: str) -> pd.DataFrame:
    """``frame`` with ``column`` in the place of ``anchor`` (that column one to the right), or last."""
    out = frame.drop(columns=[column], errors="ignore")
    out.insert(list(out.columns).index(anchor) if anchor in out.columns else len(out.columns), column, values)
    return out


def answers_in_words(answers: pd.DataFrame, acceptance: pd.DataFrame, config: Plan) -> pd.DataFrame:
    """questions.csv from the answers (``questions.ANSWER_COLUMNS``) and the acceptance check
    per arm (and level): the adjustment in words, and each answer on speed and energy per
    token with its arm's acceptance check in words."""
    leveled = levels.LEVEL in answers.columns and levels.LEVEL in acceptance.columns

    def key(arm: str, level: str | float | None) -> str | tuple[str, str | None]:
        return (arm, None if pd.isna(level) else str(level)) if leveled else arm

    checks = {key(row["arm"], row.get(levels.LEVEL)): row for row in acceptance.to_dict("records")}
    balance, adjustment = [], []
    for row in answers.to_dict("records"):
        check = checks.get(key(row["arm"], row.get(levels.LEVEL)))
        on_speed = row["metric"] in metric_names.ADJUSTED
        balance.append(
            summary.balance_words(row["arm"], row["reference"], check) if on_speed and check is not None else ""
        )
        code = row["adjustment"]  # NaN where the question had no data
        adjustment.append(
            summary.adjustment_words(code, row["adjustment_covariate"], row["adjustment_p"], config.covariates)
            if isinstance(code, str)
            else code
        )
    extra = [column for column in answers.columns if column not in ANSWER_COLUMNS]  # a run of levels' users, load_level
    out = answers.assign(adjustment=adjustment, balance=balance)
    return out[QUESTION_COLUMNS + extra]


# --- the tables users read: rule tables' outputs ----------------------------------------


def write_tables(result: Analysis) -> None:
    """RUN_DIR/tables/*.csv and *.md from the tables in words (``in_words``)."""
    out = RunDir(result.run.path).tables
    _write_csv(out, result.tables)
    _write_markdown(out, result.tables)


# --- the words: the report rules' outputs ----------------------------------------------


def write_words(result: Analysis) -> None:
    """RUN_DIR/summary.md and RUN_DIR/evidence.md."""
    write_summary(result)
    write_evidence(result)


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
            if level is not None  # of_run's None stands for a run without levels alone
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
    return summary.summary_markdown(
        config,
        tables,
        tables["variance"],
        sample_interval_s=result.sample_intervals_s,
        sources=result.sources,
        best=result.best,
        completeness=tables["completeness"],
        open_plan=_open_plan_words(result, tables, config),
    )


def _open_plan_words(result: Analysis, tables: dict[str, pd.DataFrame], config: Plan) -> list[str]:
    """The open questions' paragraph of a run of one level."""
    if result.open_plan is None:
        return []
    timings, rows = result.open_plan
    simulated = bool(evidence.simulated_hosts(read_preflight(RunDir(result.run.path).preflight)))
    repeats = int(rows["phases_per_arm"].max()) if len(rows) else 0
    check = plan_words.next_look_check(config, result.run.path, tables["performance"], tables["questions"], repeats)
    return plan_words.open_questions_section(
        rows, tables["questions"], config, timings, result.run.events, result.run.path, simulated, check
    )


def compare_runs(run_dirs: list[Path], out_dir: Path, analysis: dict[str, Any] | None = None) -> pd.DataFrame:
    """Pool every run of a cluster (AB and BA, all repeats) into one variance table and
    its verdicts: ``out_dir/variance.{csv,md}`` and ``out_dir/summary.md``. With both
    orders present the period effect is separated from the arm effect (stats.compare)."""
    result = in_words(compute(run_dirs[0], also=run_dirs[1:], analysis=analysis))
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


def main(argv: Sequence[str] | None = None) -> int:
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
