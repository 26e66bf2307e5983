"""``python -m thermab compare RUN_A RUN_B [RUN_C ...]``: any finished runs side by side
(other clusters, other versions, other days): each later run against the first, the arms
matched by their label, per metric the difference of the runs' phase means with its Welch
95 % interval. A comparison between runs, not the crossover's estimate within one run:
whatever else differs between the runs (a vLLM upgrade, another host, a hotter day) is in
the difference too, so what differs between their environments is listed first.

(``snakemake compare`` is another thing: every order of one cluster's run pooled into one
crossover analysis, ``analyze.compare_runs``.)

Bad input is one line and exit status 2: a directory that is no run, a run still in
progress, one run given twice, runs whose arms share no label."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pandas as pd

from thermab import atomic, cli, layout
from thermab.analysis import levels, run_analysis
from thermab.analysis.model import MAX_JSON_BYTES, distinct_runs
from thermab.analysis.stats import welch_interval
from thermab.config import Arm, read_bounded
from thermab.errors import UserError
from thermab.experiment import events
from thermab.report import summary
from thermab.report.status import ENDS

COLUMNS = [
    "run",
    "reference_run",
    "arm_label",
    levels.LEVEL,
    "metric",
    "unit",
    "n_reference",
    "n",
    "reference_mean",
    "mean",
    "diff",
    "diff_pct",
    "ci_low",
    "ci_high",
]
# what differs from run to run by nature, not by environment: left out of the differences
VOLATILE = {"run.json: epoch_s", "preflight.json: t"}
SHOWN_CHARS = 60


def finished_run(path: Path) -> Path:
    """``path`` if it is a run directory whose run has ended (or an imported one, which
    never ran here); else a UserError naming it."""
    files = layout.RunDir(path)
    if not path.is_dir() or not (files.run_json.is_file() or files.tidy_telemetry.is_file()):
        raise UserError(f"{path}: not a run directory (no run.json, no tidy/telemetry.parquet)")
    history = events.read(path) if files.events.is_file() else []
    started = any(event["event"] == "run_start" for event in history)
    if started and history[-1]["event"] not in ENDS:
        raise UserError(f"{path}: still in progress (last event {history[-1]['event']}); compare it once it has ended")
    return path


def _leaves(value: object, path: str = "") -> Iterator[tuple[str, str]]:
    """(``key.key``, its value as JSON) of each leaf of a JSON document."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, f"{path}.{key}" if path else str(key))
    else:
        yield path, json.dumps(value, sort_keys=True)


def environment(path: Path) -> dict[str, str]:
    """What a run records of its environment, flat (``FILE: key.key`` → its JSON): run.json
    (the plan and its settings), preflight.json (hosts, endpoint, safety) and
    provenance/versions.json (the controller's versions and commit); a file the run lacks
    adds nothing."""
    files = layout.RunDir(path)
    flat: dict[str, str] = {}
    for name, file in (
        ("run.json", files.run_json),
        ("preflight.json", files.preflight),
        ("provenance", files.provenance / "versions.json"),
    ):
        if file.is_file():
            try:
                document = json.loads(read_bounded(file, MAX_JSON_BYTES).decode("utf-8"))
            except (RecursionError, ValueError) as error:
                raise UserError(f"{file}: not JSON: {' '.join(str(error).split())[:160]}") from None
            flat.update((f"{name}: {key}", leaf) for key, leaf in _leaves(document))
    return {key: value for key, value in flat.items() if key not in VOLATILE and "clock_offset" not in key}


def _file_of(key: str) -> str:
    return key.split(": ", 1)[0]


def differences(environments: list[dict[str, str]], names: list[str]) -> list[str]:
    """One line per key whose value is not the same in every run (absent counts as a value);
    a file that only some runs have is one line, not one per key of it."""
    files = [{_file_of(key) for key in env} for env in environments]
    partial = sorted(set[str]().union(*files) - files[0].intersection(*files[1:]))
    lines = [
        f"{file}: only in {', '.join(name for name, own in zip(names, files, strict=True) if file in own)}"
        for file in partial
    ]
    for key in sorted(set().union(*environments)):
        values = [env.get(key) for env in environments]
        if _file_of(key) not in partial and len(set(values)) > 1:
            shown = ", ".join(f"{name}: {_short(value)}" for name, value in zip(names, values, strict=True))
            lines.append(f"{key}: {shown}")
    return lines


def _short(value: str | None) -> str:
    if value is None:
        return "(none)"
    return value if len(value) <= SHOWN_CHARS else value[: SHOWN_CHARS - 1] + "…"


def labelled(pooled: pd.DataFrame, arms: Mapping[str, Arm]) -> pd.DataFrame:
    """A run's per-phase metrics with each arm's label (``arm_label``)."""
    return pooled.assign(arm_label=pooled["arm"].map({arm: arms[arm].label for arm in arms}))


def comparison(reference: pd.DataFrame, other: pd.DataFrame, reference_name: str, name: str) -> pd.DataFrame:
    """Per arm label, level and metric both runs have: other − reference of the phase means,
    in the metric's unit and in % of the reference's mean, with its Welch 95 % interval
    (none below two phases a run). Pure."""
    keys = ["arm_label", levels.LEVEL, "metric"]
    reference, other = (frame.assign(**{levels.LEVEL: frame[levels.LEVEL].fillna("")}) for frame in (reference, other))
    mine = dict(tuple(other.groupby(keys, sort=False)))
    rows = []
    for key, base in reference.groupby(keys, sort=False):
        if key not in mine:
            continue
        values = mine[key]["value"]
        interval = welch_interval(base["value"], values)
        mean_ref = float(base["value"].mean())
        rows.append(
            {
                "run": name,
                "reference_run": reference_name,
                "arm_label": key[0],
                levels.LEVEL: key[1] or None,
                "metric": key[2],
                "unit": base["unit"].iloc[0],
                "n_reference": int(base["value"].count()),
                "n": int(values.count()),
                "reference_mean": mean_ref,
                "mean": float(values.mean()),
                **interval,
                "diff_pct": interval["diff"] / abs(mean_ref) * 100 if mean_ref else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def compare(paths: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """The comparison of each later run with the first, and the environments' differences."""
    paths = [finished_run(Path(path)) for path in paths]
    _unique, same = distinct_runs(paths)
    if same:
        other, first = same[0]
        raise UserError(f"{other} is the same run as {first}: give runs that differ")
    results = [run_analysis.compute(path) for path in paths]
    labels = [{arm.label for arm in result.run.plan.arms.values()} for result in results]
    shared = set.intersection(*labels)
    if not shared:
        shown = "; ".join(f"{path}: {', '.join(sorted(names))}" for path, names in zip(paths, labels, strict=True))
        raise UserError(f"the runs' arms share no label, so no arm can be matched ({shown})")
    names = [str(path) for path in paths]
    frames = [labelled(result.pooled, result.run.plan.arms) for result in results]
    parts = [comparison(frames[0], frame, names[0], name) for frame, name in zip(frames[1:], names[1:], strict=True)]
    table = pd.concat(parts, ignore_index=True)
    table = table[table["arm_label"].isin(shared)].reset_index(drop=True)
    return table, differences([environment(path) for path in paths], names)


def report(table: pd.DataFrame, differ: list[str], names: list[str]) -> str:
    lines = [
        f"# Between runs: {', '.join(names[1:])} against {names[0]}",
        "",
        "A comparison between runs, not a crossover's estimate within one run: everything that "
        "differs between them is in each difference, the arms matched by label. Each difference is the "
        "later run's phase mean less the first run's, with its Welch 95 % interval (none below two phases "
        "a run).",
        "",
        "## What differs between the runs' environments",
        "",
        *([f"- {line}" for line in differ] or ["- nothing that the runs record (run.json, preflight.json, versions)"]),
        "",
        "## Differences per arm and metric",
        "",
        summary.markdown_table(table),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(
        "compare",
        "Any finished runs side by side (other clusters, versions, days): each later run against\n"
        "the first, arms matched by label, per metric the difference with its 95 % interval, and\n"
        "what differs between the runs' environments first.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (at least two)")
    parser.add_argument("--out", type=Path, help="a directory for comparison.csv and comparison.md")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        raise UserError(f"thermab compare: give at least two run directories (got {len(args.runs)})")
    table, differ = compare(args.runs)
    text = report(table, differ, [str(path) for path in args.runs])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic.replacing(args.out / "comparison.csv") as temporary:
            table.to_csv(temporary, index=False)
        atomic.write_text(args.out / "comparison.md", text)
    print(text, end="")
    return 0
