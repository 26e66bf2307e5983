"""Import published chart data, or any wide CSV of zone temperatures, as a run directory.

    python -m thermab import-chart SOURCE OUT_DIR [--load-minutes 30] [--arm stock=1 ...]

SOURCE is either the study's chart JSON (``head``: [{t, zone...}], ``workerTsoc``: [{t, TSOC}],
``marks``: [{t, m}], t in minutes) or a wide CSV: a time column and one column per zone of
the head, ``HOST:ZONE`` columns for other hosts, with the marks from ``--marks`` (a CSV with
columns t, m).  The result is a run directory (run.json, events.jsonl,
tidy/telemetry.parquet; no requests) that ``analyze`` and ``plots`` treat like a measured one.

Time base: chart times have no wall-clock date, so the start of the recording is placed at
``epoch_s`` (default 0 = 1970-01-01 00:00 UTC) and t [s] = epoch_s + 60 × t [min].  All
intervals, which is all the analysis uses, are exact.

Marks become events: ``<label>-load-start`` is the load_start of the next arm (letters A, B, …
in mark order, repeats of a label counted as rep 2, 3, …) and its load_end follows after the
load duration (the chart has no end mark); ``<label>-boot-start`` is that arm's
restart_start; ``baseline-start``, ``baseline-end`` and ``cooldown-end`` become the event of
that name (a cooldown_end belongs to the phase before it); any other mark is kept as a
``note`` event with the mark in ``detail``.  run_start and run_end are the first and last
samples.  The study's labels carry a prefix that is dropped: ``ustock`` → stock,
``upatched`` → patched.
"""

import contextlib
import io
import json
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from thermab import cli
from thermab.config import read_bounded
from thermab.errors import UserError
from thermab.experiment import plan
from thermab.layout import RunDir
from thermab.telemetry import ingest

STUDY_LABELS = {"ustock": "stock", "upatched": "patched"}
NAMED_MARKS = {"baseline-start": "baseline_start", "baseline-end": "baseline_end", "cooldown-end": "cooldown_end"}
# run.json default: the study's GB10 nodes
DEFAULTS = {"trip_point_c": 104.8}
MAX_SOURCE_BYTES = 2**30  # a chart source or marks file
SOURCE_KINDS = {".json": "the study's chart JSON, .json", ".csv": "a wide CSV, .csv"}
Mark = tuple[float, str]  # (t, name), t in the source's unit


class Phase(TypedDict):
    order: str
    rep: int
    arm: str


class _Event(TypedDict):
    t: float
    event: str


class Event(_Event, total=False):
    """An event of the imported run (events.jsonl): a phase's keys where it belongs to one."""

    order: str
    rep: int
    arm: str
    detail: str


def chart_frames(
    chart: Mapping[str, list[dict[str, float | str]]], head: str = "head", worker: str = "worker"
) -> tuple[dict[str, pd.DataFrame], list[tuple[object, object]]]:
    """The chart JSON as {host: wide frame (t in minutes)} and [(t, mark)]."""
    frames = {head: pd.DataFrame(chart["head"])}
    if chart.get("workerTsoc"):
        frames[worker] = pd.DataFrame(chart["workerTsoc"])
    return frames, [(m["t"], m["m"]) for m in chart.get("marks", [])]


def csv_frames(table: pd.DataFrame, time_col: str = "t", head: str = "head") -> dict[str, pd.DataFrame]:
    """A wide CSV as {host: wide frame}: ``ZONE`` columns are the head's, ``HOST:ZONE`` another host's.
    Each host's frame is one selection, not a column inserted at a time (10,000 zones)."""
    columns: dict[str, list[str]] = {}
    for column in table.columns.drop(time_col):
        host, _, _zone = str(column).rpartition(":")
        columns.setdefault(host or head, []).append(column)
    return {
        host: table[[time_col, *names]].set_axis(["t", *(str(n).rpartition(":")[2] for n in names)], axis=1)
        for host, names in columns.items()
    }


def telemetry_from_frames(frames: Mapping[str, pd.DataFrame], epoch_s: float, minutes: bool = True) -> pd.DataFrame:
    """Long tidy telemetry (t, host, kind=thermal, sensor, value) from wide frames."""
    scale = 60.0 if minutes else 1.0
    # long by reshaping the value matrix at once (melt goes column by column: minutes for 10,000 zones)
    parts = [
        pd.DataFrame(
            {
                "t": np.repeat(frame["t"].to_numpy(), frame.shape[1] - 1),
                "sensor": np.tile(np.asarray(frame.columns.drop("t"), dtype=object), len(frame)),
                "value": frame.drop(columns="t").to_numpy().ravel(),
                "host": host,
            }
        )
        for host, frame in frames.items()
        if frame.shape[1] > 1
    ]
    if not parts:
        raise UserError("no zone columns beside the time")
    long = pd.concat(parts, ignore_index=True).dropna(subset=["value"])
    if long.empty:
        raise UserError("no samples: the table has no rows with a value")
    try:
        long["value"] = long["value"].astype("float64")
        times = long["t"].astype("float64")
    except (ValueError, TypeError):
        raise UserError("a time or a zone's value is not a number") from None
    if not np.isfinite(times).all():
        raise UserError("a sample's time is empty or not a finite number")
    long["t"] = epoch_s + long["t"].astype(float) * scale
    long["kind"] = "thermal"
    long = long.astype({"host": "string", "kind": "string", "sensor": "string", "value": "float64"})
    return long[["t", "host", "kind", "sensor", "value"]].sort_values(["t", "host", "sensor"], ignore_index=True)


def events_from_marks(
    marks: Iterable[tuple[object, object]],
    load_s: float,
    start_s: float,
    end_s: float,
    epoch_s: float,
    minutes: bool = True,
) -> tuple[list[Event], dict[str, str], str]:
    """(events, {letter: label}, order) from chart marks; see the module docstring for the rules."""
    scale = 60.0 if minutes else 1.0
    times = sorted((epoch_s + t * scale, name) for t, name in check_marks(marks))
    letters: dict[str, str] = {}
    reps: dict[str, int] = {}
    order = ""
    for _, name in times:
        if name.endswith("-load-start"):
            label = _label(name.removesuffix("-load-start"))
            if label not in letters:
                letters[label] = chr(ord("A") + len(letters))
                order += letters[label]
    events: list[Event] = [{"t": start_s, "event": "run_start"}]
    current: Phase | None = None
    for t, name in times:
        detail = f"mark {name}"
        if name.endswith("-load-start"):
            label = _label(name.removesuffix("-load-start"))
            reps[label] = reps.get(label, 0) + 1
            current = {"order": order, "rep": reps[label], "arm": letters[label]}
            events.append({"t": t, "event": "load_start", **current, "detail": detail})
            events.append(
                {
                    "t": t + load_s,
                    "event": "load_end",
                    **current,
                    "detail": f"load_start + {load_s / 60:g} min (no end mark)",
                }
            )
        elif name.endswith("-boot-start") and _label(name.removesuffix("-boot-start")) in letters:
            label = _label(name.removesuffix("-boot-start"))
            events.append(
                {
                    "t": t,
                    "event": "restart_start",
                    "order": order,
                    "rep": reps.get(label, 0) + 1,
                    "arm": letters[label],
                    "detail": detail,
                }
            )
        elif name in NAMED_MARKS:
            if NAMED_MARKS[name] == "cooldown_end" and current:
                events.append({"t": t, "event": NAMED_MARKS[name], **current, "detail": detail})
            else:
                events.append({"t": t, "event": NAMED_MARKS[name], "detail": detail})
        else:
            events.append({"t": t, "event": "note", "detail": name})
    events.append({"t": end_s, "event": "run_end"})
    events.sort(key=lambda e: e["t"])
    return events, {letter: label for label, letter in letters.items()}, order


def check_marks(marks: Iterable[tuple[object, object]]) -> list[Mark]:
    """The marks, each a name (printable text, not blank) at a finite time, or a UserError saying which."""
    checked = []
    for t, name in marks:
        if not isinstance(name, str) or not name.strip() or not name.isprintable():
            raise UserError(f"mark {_shown(name)} at t = {_shown(t)} is not a name (text on one line)")
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t):
            raise UserError(f"mark {name!r}: its time {_shown(t)} is not a finite number")
        checked.append((float(t), name))
    return checked


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _label(mark_prefix: str) -> str:
    return STUDY_LABELS.get(mark_prefix, mark_prefix)


def write_run(
    out_dir: str | Path,
    frames: Mapping[str, pd.DataFrame],
    marks: Iterable[tuple[object, object]],
    load_minutes: float = 30.0,
    arms: Mapping[str, str] | None = None,
    *,
    minutes: bool = True,
    cluster: str = "imported",
    setting: str = "setting",
    epoch_s: float = 0.0,
    source: str = "",
    **run_options: Any,  # run.json's facts, JSON values as plan.run_plan takes them
) -> Path:
    """Write the run directory from wide frames and marks.  ``arms`` maps a label to its
    setting value (e.g. {"stock": "1", "patched": "0.002"}); ``run_options`` override the
    run.json DEFAULTS.  Returns the run directory."""
    out = Path(out_dir)
    files = RunDir(out)
    telemetry = telemetry_from_frames(frames, epoch_s, minutes)
    events, letters, order = events_from_marks(
        marks, load_minutes * 60, telemetry["t"].min(), telemetry["t"].max(), epoch_s, minutes
    )
    if not letters:
        raise UserError("no '<label>-load-start' mark: nothing to analyse")
    unknown = sorted(set(arms or {}) - set(letters.values()))
    if unknown:
        raise UserError(
            f"--arm {', '.join(unknown)}: no arm of that name in its marks (its arms: {', '.join(letters.values())})"
        )
    files.tidy_telemetry.parent.mkdir(parents=True, exist_ok=True)
    hosts = list(frames)
    options = {**DEFAULTS, **run_options}
    analysis = {key: options.pop(key) for key in plan.DEFAULT_ANALYSIS if key in options}
    plan.write_run_json(
        out,
        plan.run_plan(
            cluster=cluster,
            order=order,
            repeats=max(e.get("rep", 1) for e in events),
            arms={
                letter: {"label": label, "value": str((arms or {}).get(label, ""))}
                for letter, label in sorted(letters.items())
            },
            setting=setting,
            head=hosts[0],
            hosts=hosts,
            analysis=analysis,
            **options,
            imported_from=source,
            epoch_s=epoch_s,
        ),
    )
    with open(files.events, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(event) + "\n" for event in events)
    ingest.write_frame(telemetry, files.tidy_telemetry)  # the layout ingest writes
    return out


@contextlib.contextmanager
def _reading(path: object) -> Iterator[None]:
    """What is wrong with a file the user gave becomes one line naming it."""
    try:
        yield
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except (ValueError, KeyError, TypeError, IndexError, pd.errors.ParserError) as error:
        raise UserError(f"{path}: {type(error).__name__}: {' '.join(str(error).split())[:200]}") from None


def _read_csv(path: str | Path) -> pd.DataFrame:
    """A CSV the user named: bounded (read_bounded), then parsed; a header alone is no table."""
    try:
        table = pd.read_csv(io.BytesIO(read_bounded(path, MAX_SOURCE_BYTES)), engine="c")
    except pd.errors.EmptyDataError:
        raise UserError("empty: no header and no rows") from None
    if table.empty:
        raise UserError(
            f"a header ({', '.join(map(str, table.columns[:5]))}{', …' if len(table.columns) > 5 else ''}) and no rows"
        )
    return table


def import_chart(
    json_path: str | Path,
    out_dir: str | Path,
    load_minutes: float = 30.0,
    arms: Mapping[str, str] | None = None,
    **options: Any,  # write_run's
) -> Path:
    """The study's chart JSON → run directory (see ``write_run`` for ``arms`` and options)."""
    with _reading(json_path):
        chart = json.loads(read_bounded(json_path, MAX_SOURCE_BYTES).decode("utf-8"))
        if not isinstance(chart, dict) or not isinstance(chart.get("head"), list) or not chart["head"]:
            raise UserError("not the study's chart JSON: no 'head' list of samples")
        frames, marks = chart_frames(chart)
        return write_run(out_dir, frames, marks, load_minutes, arms, source=str(json_path), **options)


def import_wide_csv(
    csv_path: str | Path,
    out_dir: str | Path,
    marks: str | Path | Iterable[tuple[object, object]],
    load_minutes: float = 30.0,
    arms: Mapping[str, str] | None = None,
    *,
    time_col: str = "t",
    time_unit: str = "min",
    **options: Any,  # write_run's
) -> Path:
    """A wide CSV → run directory.  ``marks``: [(t, name)] or the path of a CSV with columns
    t, m, in the same time unit as the table (``min`` or ``s``)."""
    if isinstance(marks, (str, Path)):
        with _reading(marks):
            table = _read_csv(marks)
            if not {"t", "m"} <= set(table.columns):
                raise UserError(f"needs columns t and m (has {', '.join(map(str, table.columns))})")
            marks = check_marks(table[["t", "m"]].itertuples(index=False, name=None))
    with _reading(csv_path):
        table = _read_csv(csv_path)
        if time_col not in table.columns:
            raise UserError(f"no time column '{time_col}' (columns: {', '.join(map(str, table.columns))[:200]})")
        return write_run(
            out_dir,
            csv_frames(table, time_col),
            marks,
            load_minutes,
            arms,
            minutes=time_unit == "min",
            source=str(csv_path),
            **options,
        )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(
        "import-chart",
        "Import the study's chart data (.json) or a wide CSV of zone temperatures (.csv) as a run\n"
        "directory that analyze reads like a measured one (no requests: temperatures only).\n\n"
        "A wide CSV has a time column and one column per zone of the head (HOST:ZONE for another\n"
        "host); its marks (<label>-load-start, <label>-boot-start, baseline-start, ...) come from\n"
        "--marks. Each load lasts --load-minutes from its mark.",
    )
    parser.add_argument("source", help="the chart JSON (.json) or a wide CSV (.csv)")
    parser.add_argument("out_dir", help="run directory to write")
    parser.add_argument("--load-minutes", type=cli.number(1 / 60), default=30.0, help="minutes each load phase lasts")
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="the setting's value in an arm named by its marks, e.g. --arm stock=1 --arm patched=0.002",
    )
    parser.add_argument("--setting", default="setting", help="name of the manipulated setting, e.g. busy_loop_s")
    parser.add_argument("--cluster", default="imported", help="the cluster's name in run.json")
    parser.add_argument("--epoch-s", type=cli.number(0), default=0.0, help="epoch seconds of chart time 0")
    parser.add_argument("--marks", help="CSV with columns t, m (wide CSV sources)")
    parser.add_argument("--time-col", default="t", help="time column of a wide CSV")
    parser.add_argument("--time-unit", choices=["min", "s"], default="min", help="time unit of a wide CSV")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.arm):
        parser.error("--arm takes LABEL=VALUE")
    arms = dict(item.split("=", 1) for item in args.arm)
    options = {"setting": args.setting, "cluster": args.cluster, "epoch_s": args.epoch_s}
    kind = Path(args.source).suffix.lower()
    if kind not in SOURCE_KINDS:
        raise UserError(f"{args.source}: not a source import-chart reads ({' or '.join(SOURCE_KINDS.values())})")
    if kind == ".json":
        out = import_chart(args.source, args.out_dir, args.load_minutes, arms, **options)
    else:
        if not args.marks:
            parser.error("a wide CSV needs --marks")
        out = import_wide_csv(
            args.source,
            args.out_dir,
            args.marks,
            args.load_minutes,
            arms,
            time_col=args.time_col,
            time_unit=args.time_unit,
            **options,
        )
    print(out)
    return 0
