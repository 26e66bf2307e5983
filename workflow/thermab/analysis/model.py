"""A run directory as the analysis reads it (docs/design.md's contracts): the plan
(``run.json``), the events, the tidy telemetry and requests, each phase's load validity
(``phases/*/validity.json``); and ``Analysis``, everything the tables, summary and figures
of a run show."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from thermab.config import UserError, check_file, question_kinds, read_bounded
from thermab.contracts import REQUEST_COLUMNS, REQUIRED_REQUEST_COLUMNS, PhaseValidity, validity_key
from thermab.experiment import events as events_file, plan
from thermab.jsonl import MAX_JSONL_BYTES
from thermab.layout import RunDir
from thermab.telemetry.ingest import SERIES_KEYS, TELEMETRY_COLUMNS

INDEX_COLUMNS = SERIES_KEYS + ["rows", "t_min", "t_max", "where"]
MAX_JSON_BYTES = 64 * 2**20  # run.json, validity.json: a larger one is not thermab's
MAX_PARQUET_BYTES = 64 * 2**30  # read by row group and column, never whole: a bound on what a run can be
TELEMETRY_DTYPES = {"t": "float64", "value": "float64", "host": "string", "kind": "string", "sensor": "string"}


def _dtype_kind(dtype) -> str:
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_numeric_dtype(dtype):
        return "number"
    if pd.api.types.is_string_dtype(dtype) or isinstance(dtype, pd.CategoricalDtype):
        return "string"
    return str(dtype)


def check_columns(path, frame: pd.DataFrame, dtypes: dict[str, str], required) -> None:
    """A parquet file another tool wrote: the ``required`` columns there, and every known
    column of the kind docs/design.md gives it (times and values numbers, not timestamps
    or text), or a UserError naming the file and the column."""
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}")
    for column, dtype in dtypes.items():
        if column not in frame.columns:
            continue
        wanted = "bool" if dtype == "bool" else "number" if dtype[0] in "fiI" else "string"
        kind = _dtype_kind(frame[column].dtype)
        if kind != wanted and not (wanted == "string" and kind == "object"):
            shown = {"number": "numbers (seconds since the epoch for times)", "string": "text", "bool": "true/false"}[
                wanted
            ]
            raise UserError(f"{path}: column '{column}' holds {kind}, not {shown}")


class Telemetry:
    """tidy/telemetry.parquet as the analysis reads it: one series (host, kind, sensor) at a
    time, in time order, reading only the series and columns asked for.

    A week at 1 Hz is tens of millions of rows; held whole as a frame it takes gigabytes
    (three string columns), while each table needs a few series and, of those, the samples
    inside the load windows.  Ingest writes every series into row groups of its own
    (telemetry/ingest.py), so the footer's statistics name each row group's series and a
    read touches only the row groups and columns asked for.  A file whose row groups mix
    series (written before that, or by hand) is read whole once and sorted in memory.

    ``index``: one row per series, sorted by (host, kind, sensor): its number of rows, first
    and last t, and ``where`` (its row groups, or its rows in the sorted frame).
    """

    def __init__(self, index: pd.DataFrame, read: Callable[[object, list[str]], dict[str, np.ndarray]]):
        self.index = index.reindex(columns=INDEX_COLUMNS)
        self._read = read

    @classmethod
    def open(cls, path) -> Telemetry:
        check_file(path, MAX_PARQUET_BYTES)
        check_columns(
            path, pq.ParquetFile(path).schema_arrow.empty_table().to_pandas(), TELEMETRY_DTYPES, TELEMETRY_COLUMNS
        )
        metadata = pq.ParquetFile(path).metadata
        index = _row_group_index(metadata)
        if index is None:
            return cls.from_frame(
                pq.read_table(path, columns=TELEMETRY_COLUMNS, read_dictionary=SERIES_KEYS).to_pandas()
            )
        return cls(index, partial(_read_row_groups, path, metadata))  # its footer parsed once, not per series

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Telemetry:
        """Any long frame (t, host, kind, sensor, value), sorted stably by series and t; rows
        without host, kind or sensor are left out, as a groupby over those keys leaves them."""
        codes = [_sorted_categories(frame[key]) for key in SERIES_KEYS]
        known = np.logical_and.reduce([c.codes >= 0 for c in codes])
        t = frame["t"].to_numpy("float64")[known]
        value = frame["value"].to_numpy("float64")[known]
        keys = [c.codes[known] for c in codes]
        order = np.lexsort([t] + keys[::-1])
        t, value, keys = t[order], value[order], [k[order] for k in keys]
        boundaries = np.flatnonzero(np.logical_or.reduce([np.diff(k) != 0 for k in keys])) + 1
        starts, stops = (np.r_[0, boundaries], np.r_[boundaries, len(t)]) if len(t) else (np.zeros(0, int),) * 2
        index = pd.DataFrame(
            {
                key: np.asarray(c.categories, dtype=object)[k[starts]]
                for key, c, k in zip(SERIES_KEYS, codes, keys, strict=False)
            }
        )
        index = index.assign(
            rows=stops - starts,
            t_min=t[starts],
            t_max=t[stops - 1],
            where=[slice(a, b) for a, b in zip(starts, stops, strict=False)],
        )
        columns = {"t": t, "value": value}
        return cls(index, lambda where, names: {name: columns[name][where] for name in names})

    def select(self, kind: str | None = None, sensor: str | None = None, host: str | None = None) -> pd.DataFrame:
        """The index rows of the series that match every key given."""
        index = self.index
        for key, wanted in (("host", host), ("kind", kind), ("sensor", sensor)):
            if wanted is not None:
                index = index[index[key] == wanted]
        return index

    def series(
        self, kind: str | None = None, sensor: str | None = None, host: str | None = None, columns=("t", "value")
    ) -> Iterator[tuple[dict, dict[str, np.ndarray]]]:
        """Each matching series as ({host, kind, sensor}, {column: array}), in (host, kind,
        sensor) order, its samples in time order (stably: equal times keep the file's order).
        A sample whose time or value is not a finite number (NaN, ±inf in a file ingest did not
        write) is no reading and is left out."""
        for row in self.select(kind, sensor, host).itertuples(index=False):
            arrays = self._read(row.where, sorted(set(columns) | {"t", "value"}))
            finite = np.isfinite(arrays["t"]) & np.isfinite(arrays["value"])
            if not finite.all():
                arrays = {name: values[finite] for name, values in arrays.items()}
            if np.any(arrays["t"][1:] < arrays["t"][:-1]):
                order = np.argsort(arrays["t"], kind="stable")
                arrays = {name: values[order] for name, values in arrays.items()}
            yield {key: getattr(row, key) for key in SERIES_KEYS}, {name: arrays[name] for name in columns}

    def frame(self, kind: str | None = None, sensor: str | None = None, host: str | None = None) -> pd.DataFrame:
        """The matching series as one long frame (t, host, kind, sensor, value), sorted by
        series and t.  For small selections (figures): it holds every row asked for."""
        parts = [
            pd.DataFrame({"t": arrays["t"], **key, "value": arrays["value"]})
            for key, arrays in self.series(kind, sensor, host)
        ]
        if not parts:
            return pd.DataFrame(
                {c: pd.Series(dtype="float64" if c in ("t", "value") else "string") for c in TELEMETRY_COLUMNS}
            )
        return pd.concat(parts, ignore_index=True)[TELEMETRY_COLUMNS]

    @property
    def t_min(self) -> float:
        return float(self.index["t_min"].min()) if len(self.index) else np.nan

    @property
    def t_max(self) -> float:
        return float(self.index["t_max"].max()) if len(self.index) else np.nan


def as_telemetry(telemetry) -> Telemetry:
    """A Telemetry, from one or from a tidy frame (tests and small runs pass frames)."""
    return telemetry if isinstance(telemetry, Telemetry) else Telemetry.from_frame(telemetry)


def _row_group_index(metadata) -> pd.DataFrame | None:
    """Series → row groups from the footer's statistics; None when a row group holds more
    than one series or lacks statistics."""
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    if not set(TELEMETRY_COLUMNS) <= set(names):
        return None
    rows = {}
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        if row_group.num_rows == 0:
            continue
        stats = {name: row_group.column(names.index(name)).statistics for name in SERIES_KEYS + ["t"]}
        if any(
            s is None or not s.has_min_max or s.null_count or s.min != s.max
            for s in (stats[key] for key in SERIES_KEYS)
        ):
            return None
        key = tuple(stats[k].min for k in SERIES_KEYS)
        t = stats["t"]
        t_min, t_max = (t.min, t.max) if t is not None and t.has_min_max else (np.nan, np.nan)
        entry = rows.setdefault(key, [0, np.inf, -np.inf, []])
        entry[0] += row_group.num_rows
        entry[1], entry[2] = np.fmin(entry[1], t_min), np.fmax(entry[2], t_max)
        entry[3].append(group)
    index = pd.DataFrame(
        [(*key, n, low, high, tuple(groups)) for key, (n, low, high, groups) in rows.items()], columns=INDEX_COLUMNS
    )
    return index.sort_values(SERIES_KEYS, ignore_index=True)


def _sorted_categories(values: pd.Series) -> pd.Categorical:
    """Categorical codes that sort like the strings (a dictionary read from parquet keeps the
    order of first appearance)."""
    categorical = pd.Categorical(values)
    return categorical.reorder_categories(categorical.categories.sort_values())


def _read_row_groups(path, metadata, row_groups: tuple[int, ...], columns: list[str]) -> dict[str, np.ndarray]:
    table = pq.ParquetFile(path, metadata=metadata).read_row_groups(list(row_groups), columns=columns)
    return {name: table.column(name).to_numpy() for name in columns}


@dataclass(frozen=True)
class RunData:
    path: Path
    plan: dict  # run.json (or the plan inferred for an imported run), its analysis settings replaced
    events: pd.DataFrame
    telemetry: Telemetry
    requests: pd.DataFrame | None  # None when the run has no request data (imported runs)
    validity: dict  # (order, rep, arm, users) → the phase's validity.json (levels.at_level: one level's,
    # by (order, rep, arm)); empty for imported runs
    # host → kind → sensor → the agent source it came from (tidy/ingest.json); empty for a run
    # ingested before it was kept, or imported: each kind is then one source
    sources: dict = field(default_factory=dict)


def read_events(path: Path) -> pd.DataFrame:
    """events.jsonl as a frame in time order (malformed lines dropped and counted at ingest)."""
    records, _problems = events_file.read_checked(path)
    events = pd.DataFrame(records, columns=sorted({"t", "event", "order", "rep", "arm"}.union(*records)))
    events["rep"] = pd.to_numeric(events["rep"], errors="coerce")  # float: run-level events have no rep
    return events.sort_values("t", kind="stable", ignore_index=True)


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(read_bounded(path, MAX_JSON_BYTES).decode("utf-8"))
    except RecursionError:
        raise UserError(f"{path}: not JSON: nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError: a truncated file
        raise UserError(f"{path}: not JSON: {' '.join(str(error).split())[:200]}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: not a JSON object")
    return value


PARQUET_ERRORS = (OSError, ValueError, KeyError, pa.ArrowException)


def _unreadable(path: Path, error: Exception) -> UserError:
    return UserError(f"{path}: cannot read as parquet: {' '.join(str(error).split())[:200]}")


def _read_parquet(path: Path, **options) -> pd.DataFrame:
    check_file(path, MAX_PARQUET_BYTES)
    try:
        return pd.read_parquet(path, **options)
    except PARQUET_ERRORS as error:
        raise _unreadable(path, error) from None


def inferred_plan(path: Path, events: pd.DataFrame, telemetry: Telemetry) -> dict:
    """The plan of a run directory that has no run.json, as docs/design.md allows: the
    arms are the letters of its phases in events.jsonl (each its own label, the first the
    reference), the hosts those of its telemetry (the head the first by name), the
    analysis settings the defaults."""
    phases = events.dropna(subset=["arm"])
    letters = list(dict.fromkeys(str(arm) for arm in phases["arm"]))
    if not letters:
        raise UserError(f"{path}: no run.json, and events.jsonl names no phase: nothing to analyse")
    hosts = sorted(str(host) for host in telemetry.index["host"].unique())
    orders = [str(order) for order in phases["order"].dropna().unique()]
    return plan.run_plan(
        cluster=path.resolve().parent.name,
        order=orders[0] if orders else "".join(letters),
        repeats=int(phases["rep"].max()) if phases["rep"].notna().any() else 1,
        arms={letter: {"label": letter, "value": ""} for letter in letters},
        setting="setting",
        head=hosts[0] if hosts else "",
        hosts=hosts,
        inferred=True,
    )


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# run.json's numbers the analysis computes with, each: (what it must be, the test)
PLAN_NUMBER_KINDS = {
    "count": ("a whole number of at least 1", lambda v: _finite(v) and isinstance(v, int) and v >= 1),
    "whole": ("a whole number of at least 0", lambda v: _finite(v) and isinstance(v, int) and v >= 0),
    "positive": ("a finite number above 0", lambda v: _finite(v) and v > 0),
    "number or null": ("a finite number or null", lambda v: v is None or _finite(v)),
}
PLAN_NUMBERS = {
    "users": "count",
    "max_tokens": "count",
    "prompt_tokens": "count",
    "repeats": "count",
    "probe_n": "whole",
    "stall_gap_s": "positive",
    "load_s": "positive",
    "trip_point_c": "number or null",
}


def _check_plan(path: Path, config: dict) -> dict:
    """What the analysis needs of a run.json, with the defaults for what an older one lacks."""
    arms = config.get("arms")
    if not isinstance(arms, dict) or not arms or not all(isinstance(a, dict) and "label" in a for a in arms.values()):
        raise UserError(f"{path}: key 'arms' must map each arm letter to its label and value")
    if config.get("reference_arm", next(iter(arms))) not in arms:
        raise UserError(f"{path}: key 'reference_arm' is not one of the arms")
    for key, kind in (("head", str), ("hosts", list), ("thresholds_c", list), ("timeline_zone", str)):
        if key in config and not isinstance(config[key], kind):
            raise UserError(f"{path}: key '{key}' must be a {kind.__name__}")
    for key, kind in PLAN_NUMBERS.items():
        what, test = PLAN_NUMBER_KINDS[kind]
        if key == "users" and isinstance(config.get(key), list) and config[key]:  # levels (load.users a list)
            what = f"{what}, or a list of distinct ones"
            if len(set(map(repr, config[key]))) == len(config[key]) and all(test(v) for v in config[key]):
                continue
        if key in config and not test(config[key]):
            shown = repr(config[key])
            raise UserError(
                f"{path}: key '{key}' must be {what}, not {shown if len(shown) <= 40 else shown[:39] + '…'}"
            )
    for key in ("thresholds_c", "reference_lines_c"):
        values = config.get(key, [])
        if not (isinstance(values, list) and all(_finite(value) for value in values)):
            raise UserError(f"{path}: key '{key}' must be a list of finite numbers")
    questions = config.get("questions", [])
    if not (
        isinstance(questions, list)
        and all(
            isinstance(q, dict)
            and isinstance(q.get("metric"), str)
            and q.get("kind") in question_kinds()
            and all(_finite(q[k]) for k in ("by", "margin", "margin_pct") if k in q)
            for q in questions
        )
    ):
        raise UserError(
            f"{path}: key 'questions' must be a list of questions, each a metric, a kind "
            f"({', '.join(question_kinds())}) and finite margins"
        )
    return plan.run_plan(
        **{
            "cluster": "",
            "order": "".join(arms),
            "repeats": 1,
            "setting": "setting",
            "head": "",
            "hosts": [],
            **{key: value for key, value in config.items() if key not in plan.DEFAULT_ANALYSIS},
        },
        analysis={key: config[key] for key in plan.DEFAULT_ANALYSIS if key in config},
    )


def load_run(run_dir, analysis: dict | None = None) -> RunData:
    """A run directory as the analysis reads it; what is wrong with it is a UserError
    naming the file.  Without run.json the plan is inferred (``inferred_plan``).
    ``analysis``: settings that replace the plan's (the workflow's current config, through
    the rule's params); run.json keeps the values the run was made with."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"{path}: not a run directory")
    files = RunDir(path)
    telemetry_path = files.tidy_telemetry
    if not telemetry_path.exists():
        raise UserError(f"{telemetry_path}: missing (not a run directory, or ingest has not run)")
    try:
        telemetry = Telemetry.open(telemetry_path)
    except PARQUET_ERRORS as error:
        raise _unreadable(telemetry_path, error) from None
    requests_path = files.tidy_requests
    requests = _read_parquet(requests_path) if requests_path.exists() else None
    if requests is not None:
        check_columns(requests_path, requests, REQUEST_COLUMNS, REQUIRED_REQUEST_COLUMNS)
    if requests is not None and requests.empty:
        requests = None
    events = read_events(files.events)
    run_json = files.run_json
    config = (
        _check_plan(run_json, _read_json(run_json)) if run_json.exists() else inferred_plan(path, events, telemetry)
    )
    config.update(plan.reanalysis(analysis or {}))
    return RunData(path, config, events, telemetry, requests, read_validity(path), read_sources(files.ingest_report))


def read_sources(path: Path) -> dict:
    """The agent source of each series (``sources`` of tidy/ingest.json: host → kind →
    sensor → source), {} where the file or the key is absent; any other shape is a
    UserError naming the file."""
    if not path.exists():
        return {}
    sources = _read_json(path).get("sources", {})
    if not (
        isinstance(sources, dict)
        and all(
            isinstance(kinds, dict)
            and all(
                isinstance(series, dict)
                and all(isinstance(sensor, str) and isinstance(source, str) for sensor, source in series.items())
                for series in kinds.values()
            )
            for kinds in sources.values()
        )
    ):
        raise UserError(f"{path}: 'sources' must map host → kind → sensor → the name of a source")
    return sources


def read_validity(path: Path) -> dict[tuple, PhaseValidity]:
    """Each phase's validity.json by (order, rep, arm, users), users None where the report
    has none (analysis.levels.at_level gives one level's by (order, rep, arm)).  The load stage
    writes it even for a load that was aborted; tidy/requests.parquet waits for every phase,
    so when the analysis runs they are all there."""
    reports = {}
    for report_path in sorted(path.glob(str(RunDir(path).phase("*").validity.relative_to(path)))):
        report = _read_json(report_path)
        reports[validity_key(report, report_path)] = report
    return reports


def distinct_runs(run_dirs) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """Each run once: the run directories given, without any that is the same run as one
    before it (the same directory by another name, link or glob, or a copy of it: two runs
    never share every event's time); returns them and the (dropped, same as) pairs."""
    kept, dropped, seen = [], [], {}
    for run_dir in map(Path, run_dirs):
        events = RunDir(run_dir).events
        data = read_bounded(events, MAX_JSONL_BYTES) if events.is_file() else b""
        key = hashlib.sha256(data).hexdigest() if data.strip() else str(run_dir.resolve())
        if key in seen:
            dropped.append((run_dir, seen[key]))
        else:
            seen[key] = run_dir
            kept.append(run_dir)
    return kept, dropped


def sibling_runs(run_dir) -> list[Path]:
    """Other run directories next to ``run_dir`` with the same cluster in their run.json."""
    path = Path(run_dir).resolve()
    run_json = RunDir(path).run_json
    cluster = _read_json(run_json).get("cluster") if run_json.exists() else path.parent.name
    return [
        other
        for other in sorted(path.parent.iterdir())
        if other != path
        and RunDir(other).run_json.exists()
        and _read_json(RunDir(other).run_json).get("cluster") == cluster
    ]


def ordered_hosts(config: dict) -> list[str]:
    """Hosts with the head first, so that its metrics lead every table."""
    return [config["head"]] + [h for h in config.get("hosts", []) if h != config["head"]]


@dataclass(frozen=True)
class Analysis:
    run: RunData  # the run the tables describe
    sources: list[str]  # every run directory pooled for the comparison
    tables: dict[str, pd.DataFrame]  # windows, the four phase tables, variance
    pooled: pd.DataFrame  # per-phase metrics of all pooled runs (metrics.phase_metrics)
    best: dict | None  # stats.best_setting for sweeps of more than two arms
