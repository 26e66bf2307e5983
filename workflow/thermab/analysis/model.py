"""A run directory as the analysis reads it (docs/design.md's contracts): the plan
(``run.json``, as a typed, read-only ``Plan``), the events, the tidy telemetry and requests, each phase's load validity
(``phases/*/validity.json``); and ``Analysis``, everything the tables, summary and figures
of a run show."""

from __future__ import annotations

import hashlib
import json
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from thermab.config import Arm, Question, check_file, read_bounded, top_level_defaults
from thermab.config.view import Analysis as AnalysisSettings
from thermab.contracts import REQUEST_COLUMNS, REQUIRED_REQUEST_COLUMNS, PhaseValidity, WindowKey, validity_key
from thermab.errors import UserError
from thermab.experiment import events as events_file, plan
from thermab.jsonl import MAX_JSONL_BYTES
from thermab.layout import RunDir
from thermab.telemetry.ingest import SERIES_KEYS, TELEMETRY_COLUMNS

INDEX_COLUMNS = SERIES_KEYS + ["rows", "t_min", "t_max", "where"]
MAX_JSON_BYTES = 64 * 2**20  # run.json, validity.json: a larger one is not thermab's
MAX_PARQUET_BYTES = 64 * 2**30  # read by row group and column, never whole: a bound on what a run can be
# host → kind → sensor → the agent source it came from (tidy/ingest.json's ``sources``)
Sources = Mapping[str, Mapping[str, Mapping[str, str]]]
TELEMETRY_DTYPES = {"t": "float64", "value": "float64", "host": "string", "kind": "string", "sensor": "string"}


def _dtype_kind(dtype: np.dtype[Any] | pd.api.extensions.ExtensionDtype) -> str:
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_numeric_dtype(dtype):
        return "number"
    if pd.api.types.is_string_dtype(dtype) or isinstance(dtype, pd.CategoricalDtype):
        return "string"
    return str(dtype)


def check_columns(path: Path, frame: pd.DataFrame, dtypes: Mapping[str, str], required: Iterable[str]) -> None:
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

    # ``read(where, columns)``: ``where`` as the index holds it (row groups, or rows of a sorted frame)
    def __init__(self, index: pd.DataFrame, read: Callable[[Any, list[str]], dict[str, np.ndarray]]) -> None:
        self.index = index.reindex(columns=INDEX_COLUMNS)
        self._read = read

    @classmethod
    def open(cls, path: Path) -> Telemetry:
        check_file(path, MAX_PARQUET_BYTES)
        # opened once, footer and row groups read through one handle: a file replaced meanwhile
        # (another ingest) is never read as this one's footer over another's bytes
        parquet = pq.ParquetFile(pa.OSFile(str(path)), read_dictionary=SERIES_KEYS)
        check_columns(path, parquet.schema_arrow.empty_table().to_pandas(), TELEMETRY_DTYPES, TELEMETRY_COLUMNS)
        index = _row_group_index(parquet.metadata)
        if index is None:
            return cls.from_frame(parquet.read(columns=TELEMETRY_COLUMNS).to_pandas())
        return cls(index, partial(_read_row_groups, path, parquet))

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
            where=pd.Series([slice(a, b) for a, b in zip(starts, stops, strict=False)], index.index, dtype=object),
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
        self,
        kind: str | None = None,
        sensor: str | None = None,
        host: str | None = None,
        columns: Sequence[str] = ("t", "value"),
    ) -> Iterator[tuple[dict[str, str], dict[str, np.ndarray]]]:
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


def as_telemetry(telemetry: Telemetry | pd.DataFrame) -> Telemetry:
    """A Telemetry, from one or from a tidy frame (tests and small runs pass frames)."""
    return telemetry if isinstance(telemetry, Telemetry) else Telemetry.from_frame(telemetry)


def _row_group_index(metadata: pq.FileMetaData) -> pd.DataFrame | None:
    """Series → row groups from the footer's statistics; None when a row group holds more
    than one series or lacks statistics."""
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    if not set(TELEMETRY_COLUMNS) <= set(names):
        return None
    rows: dict[tuple[str, ...], list[Any]] = {}  # series → [rows, t_min, t_max, row groups]
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


def _read_row_groups(
    path: Path, parquet: pq.ParquetFile, row_groups: tuple[int, ...], columns: list[str]
) -> dict[str, np.ndarray]:
    """A damaged page (its footer intact) is found only here: one line naming the file."""
    try:
        table = parquet.read_row_groups(list(row_groups), columns=columns)
    except PARQUET_ERRORS as error:
        raise _unreadable(path, error) from None
    return {name: table.column(name).to_numpy() for name in columns}


# the study's design; a run.json without it (another tool's, an older thermab's) was run
# as the config's defaults run one: a fixed number of repeats
STUDY_DESIGN = top_level_defaults("until", "max_repeats", "budget_hours")

# What each of run.json's facts that an older, imported or inferred run may lack reads as
# where it is absent: None (not recorded), an empty tuple (none), or what a run that does
# not record it ran at.  Read through the attribute, never put into the plan, so a
# plan thawed or copied holds the keys its run.json held and no more.
UNRECORDED: Mapping[str, object] = MappingProxyType(
    {
        "time_scale": 1.0,
        "trip_point_c": None,
        "users": None,
        "rate": None,
        "burstiness": None,
        "think_s": None,
        "load_level": None,
        "max_tokens": None,
        "prompt_tokens": None,
        "probe_n": None,
        "load_s": None,
        "min_load_s": None,
        "cooldown_max_s": None,
        "idle_s": None,
        "wakeup_gaps_s": None,
        "slo": None,
        "sample_intervals_s": None,
        "hosts_without_zones": (),
        "configfiles": None,
        "cores": None,
        "overrides": None,
        "model": None,
        "inferred": False,
        "imported_from": None,
        "epoch_s": None,
    }
)


class Plan(AnalysisSettings):  # the analysis settings at its top level, as run.json holds them
    """A run's plan as the analysis reads it, typed and read-only as the config's view is
    (``plan.head``, ``plan.arms["A"].label``; ``thaw`` gives the dict back).

    Not the config's view (``config.view``): run.json is no config but what one run recorded
    of it, flat (the head, the hosts, the setting's name, the analysis settings at the top),
    possibly written by an older thermab or another tool, and for a run without run.json
    inferred.  ``_check_plan`` and ``inferred_plan`` fill it through ``plan.run_plan``, so
    the keys down to ``questions`` are always there, and the study's design after them
    (``STUDY_DESIGN``: the config's defaults where run.json has none).

    The rest are optional: facts an older, imported or inferred run lacks.  Each reads as
    ``UNRECORDED`` gives where run.json has none, and that absence means something:
    ``users`` None, the run is its one level, of users the requests show; ``max_tokens``,
    ``prompt_tokens``, ``probe_n``, ``load_s`` None, what the requests show or nothing;
    ``min_load_s``, ``cooldown_max_s`` None, no budget's account in summary.md;
    ``trip_point_c`` None, no line drawn; ``slo`` None, no goodput; ``sample_intervals_s``
    None, the intervals as measured; ``hosts_without_zones`` empty, every host has zones;
    ``configfiles`` None, the command that continues the run says to add them (an empty
    tuple: it was started with the default config); ``cores`` None, a count of cores
    assumed; ``overrides`` None, no --config entry; ``time_scale`` 1, each second of the
    run one of the study; ``inferred`` False, run.json was there; ``load_level`` None, the
    whole run's plan, not one level's (``levels.plan_at``); ``model`` None, preflight's
    endpoint names it; the others None, not recorded.  ``in`` and ``get`` still answer what
    run.json holds."""

    cluster: str
    order: str
    repeats: int
    arms: Mapping[str, Arm]
    reference_arm: str
    setting: str
    head: str
    hosts: tuple[str, ...]
    questions: tuple[Question, ...]
    until: str
    max_repeats: int
    budget_hours: float | None
    time_scale: float
    trip_point_c: float | None
    users: int | tuple[int | Mapping[str, float], ...] | None  # a level's plan (levels.plan_at): its users
    rate: float | None
    burstiness: float | None
    think_s: float | None
    load_level: str | None  # a level's plan: its label
    max_tokens: int | None
    prompt_tokens: int | None
    probe_n: int | None  # 0: the run had no probe
    load_s: int | None
    min_load_s: int | None  # with cooldown_max_s, the config's price of a phase job (planning.NextJobs)
    cooldown_max_s: float | None
    idle_s: float | None
    wakeup_gaps_s: tuple[float, ...] | None
    slo: Mapping[str, float] | None  # load.slo (goodput's bounds in ms)
    sample_intervals_s: Mapping[str, float] | None
    hosts_without_zones: tuple[str, ...]
    configfiles: tuple[str, ...] | None  # how Snakemake was started on the run (plan.invocation)
    cores: int | None
    overrides: Mapping[str, str] | None
    model: str | None  # another tool's run.json may name it; thermab's preflight.json does
    inferred: bool
    imported_from: str | None
    epoch_s: float | None

    def __init__(self, values: Mapping[str, Any]) -> None:
        super().__init__({**STUDY_DESIGN, **values})

    if not typing.TYPE_CHECKING:  # hidden as Section's is, so a name no annotation gives stays a type error

        def __getattr__(self, name: str) -> Any:
            if name in UNRECORDED and name not in self:
                return UNRECORDED[name]
            return super().__getattr__(name)


@dataclass(frozen=True)
class RunData:
    path: Path
    plan: Plan  # run.json (or the plan inferred for an imported run), its analysis settings replaced
    events: pd.DataFrame
    telemetry: Telemetry
    requests: pd.DataFrame | None  # None when the run has no request data (imported runs)
    # (order, rep, arm, users, load_level) → the window's validity.json (levels.at_level: one
    # level's, by (order, rep, arm)); empty for imported runs
    validity: dict[tuple[Any, ...], PhaseValidity]
    # the agent source of each series (tidy/ingest.json); empty for a run ingested before it
    # was kept, or imported: each kind is then one source
    sources: Sources = field(default_factory=dict)


def read_events(path: Path) -> pd.DataFrame:
    """events.jsonl as a frame in time order (malformed lines dropped and counted at ingest)."""
    records, _problems = events_file.read_checked(path)
    events = pd.DataFrame(records, columns=sorted({"t", "event", "order", "rep", "arm"}.union(*records)))
    events["rep"] = pd.to_numeric(events["rep"], errors="coerce")  # float: run-level events have no rep
    return events.sort_values("t", kind="stable", ignore_index=True)


def _read_json(path: Path) -> dict[str, Any]:
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


def _read_parquet(path: Path) -> pd.DataFrame:
    check_file(path, MAX_PARQUET_BYTES)
    try:
        return pd.read_parquet(path)
    except PARQUET_ERRORS as error:
        raise _unreadable(path, error) from None


def inferred_plan(path: Path, events: pd.DataFrame, telemetry: Telemetry) -> dict[str, Any]:
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


def _check_plan(path: Path, written: dict[str, Any]) -> dict[str, Any]:
    """What the analysis needs of a run.json (``written``, as read), with the defaults for
    what an older one lacks; a value the config's checks refuse is a UserError naming the
    file and key."""
    problems = plan.plan_problems(written) if "arms" in written else ["key 'arms': required but missing"]
    if problems:
        raise UserError(f"{path}: {problems[0]}")
    arms = written["arms"]
    return plan.run_plan(
        **{
            "cluster": "",
            "order": "".join(arms),
            "repeats": 1,
            "setting": "setting",
            "head": "",
            "hosts": [],
            **{key: value for key, value in written.items() if key not in plan.DEFAULT_ANALYSIS},
        },
        analysis={key: written[key] for key in plan.DEFAULT_ANALYSIS if key in written},
    )


def run_directory(run_dir: str | Path) -> Path:
    """``run_dir`` as a Path, or a UserError naming it where it is no directory (missing, a
    file, a link that loops or dangles)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"{path}: not a run directory")
    return path


def load_run(run_dir: str | Path, analysis: dict[str, Any] | None = None) -> RunData:
    """A run directory as the analysis reads it; what is wrong with it is a UserError
    naming the file.  Without run.json the plan is inferred (``inferred_plan``).
    ``analysis``: settings that replace the plan's (the workflow's current config, through
    the rule's params); run.json keeps the values the run was made with."""
    path = run_directory(run_dir)
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
    # built once here: every room after this one reads the plan through it
    sources = read_sources(files.ingest_report)
    return RunData(path, Plan(config), events, telemetry, requests, read_validity(path), sources)


def read_plan(path: Path, analysis: dict[str, Any] | None = None) -> Plan:
    """A run.json as the analysis reads it, checked: what is wrong is a UserError naming the
    file and key.  ``analysis``: settings that replace the plan's, as ``load_run``'s."""
    return Plan({**_check_plan(path, _read_json(path)), **plan.reanalysis(analysis or {})})


def read_preflight(path: Path) -> dict[str, Any] | None:
    """preflight.json as read (host facts, endpoint), None where the run has none (imported)."""
    return _read_json(path) if path.exists() else None


def read_sources(path: Path) -> Sources:
    """The agent source of each series (``sources`` of tidy/ingest.json: host → kind →
    sensor → source), {} where the file or the key is absent; any other shape is a
    UserError naming the file."""
    if not path.exists():
        return {}
    sources: Sources = _read_json(path).get("sources", {})
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


def read_validity(path: Path) -> dict[WindowKey, PhaseValidity]:
    """Each window's validity.json by (order, rep, arm, users, load_level), either None where
    the report has none (analysis.levels.at_level gives one level's by (order, rep, arm)).  The load stage
    writes it even for a load that was aborted; tidy/requests.parquet waits for every phase,
    so when the analysis runs they are all there."""
    reports: dict[WindowKey, PhaseValidity] = {}
    for report_path in sorted(path.glob(str(RunDir(path).phase("*").validity.relative_to(path)))):
        report = _read_json(report_path)
        # the contract the load wrote it by (contracts.write_validity); the window's key checked
        reports[validity_key(report, report_path)] = typing.cast(PhaseValidity, report)
    return reports


def read_latency(path: Path) -> dict[WindowKey, dict[str, Any]]:
    """Each window's latency.json (load/latency.py: its ITL sketch) by the key of
    ``read_validity``; none where the load wrote none (an imported run, an older one)."""
    reports: dict[WindowKey, dict[str, Any]] = {}
    for report_path in sorted(path.glob(str(RunDir(path).phase("*").latency.relative_to(path)))):
        report = _read_json(report_path)
        reports[validity_key(report, report_path)] = report
    return reports


def distinct_runs(run_dirs: Iterable[str | Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """Each run once: the run directories given, without any that is the same run as one
    before it (the same directory by another name, link or glob, or a copy of it: two runs
    never share every event's time); returns them and the (dropped, same as) pairs."""
    kept: list[Path] = []
    dropped: list[tuple[Path, Path]] = []
    seen: dict[str, Path] = {}
    for run_dir in map(run_directory, run_dirs):
        events = RunDir(run_dir).events
        data = read_bounded(events, MAX_JSONL_BYTES) if events.is_file() else b""
        key = hashlib.sha256(data).hexdigest() if data.strip() else str(run_dir.resolve())
        if key in seen:
            dropped.append((run_dir, seen[key]))
        else:
            seen[key] = run_dir
            kept.append(run_dir)
    return kept, dropped


def sibling_runs(run_dir: str | Path) -> list[Path]:
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


def ordered_hosts(config: Plan) -> list[str]:
    """Hosts with the head first, so that its metrics lead every table."""
    return [config.head] + [h for h in config.hosts if h != config.head]


@dataclass(frozen=True)
class Analysis:
    run: RunData  # the run the tables describe
    sources: list[str]  # every run directory pooled for the comparison
    tables: dict[str, pd.DataFrame]  # analysis.NUMBERS: the tables, windows, acceptance, completeness
    pooled: pd.DataFrame  # per-phase metrics of all pooled runs (metrics.phase_metrics)
    best: dict[str, Any] | None  # stats.best_setting for sweeps of more than two arms
    # what would decide the open questions (planning.study_plan: its timings and plan_rows),
    # None for a run of levels or without questions (``thermab plan`` plans those)
    open_plan: tuple[Any, pd.DataFrame] | None = None
    # how often each source of the head was sampled (completeness.measured_intervals)
    sample_intervals_s: dict[str, float] = field(default_factory=dict)
