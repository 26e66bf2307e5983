"""Agent CSVs and per-phase request files -> the tidy contract files (docs/design.md).

Host timestamps are moved onto the controller's clock with the offsets measured at
preflight and at the end, interpolated linearly in between (a clock that drifts during a
long run is followed, not averaged; before the first and after the last measurement the
nearest one holds).  Rows without a value (the agent records missing
readings with a reason) are dropped and counted by reason in ``tidy/ingest.json``.  Power
files become watts per domain (energy counters turned into Δenergy/Δt: ``power``).  Each
phase's scrape of the server's ``/metrics`` (``phases/*/server.csv``, on the controller's
clock) becomes the head's ``server`` rows, counters turned into rates
(telemetry/server_metrics.py).

``tidy/telemetry.parquet`` is sorted by (host, kind, sensor, t), and every series (host,
kind, sensor) has row groups of its own, so that their statistics name the series and a
reader skips every row group but those it needs (analysis/model.py ``Telemetry``).  A
week of 1 Hz CSVs is tens of millions of rows: they are parsed by pyarrow's multithreaded
CSV reader, one (host, kind) at a time, and written as they are read."""

from __future__ import annotations

import csv
import heapq
import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from thermab import atomic, jsonl
from thermab.contracts import Preflight
from thermab.layout import PhaseDir, RunDir
from thermab.telemetry import power, server_metrics, wall_poll
from thermab.telemetry.agent import SOURCES

# each agent file (its stem is the source's name) and the kind its rows take: from the
# agent's own registry, so a source the agent collects is never dropped here; and the wall
# meters' file, which the controller writes on its own clock (telemetry/wall_poll.py)
KIND_OF_FILE = {source.name: source.kind for source in SOURCES} | {wall_poll.FILE: "power"}
CONTROLLER_CLOCK_FILES = {wall_poll.FILE}
TELEMETRY_COLUMNS = ["t", "host", "kind", "sensor", "value"]
SERIES_KEYS = ["host", "kind", "sensor"]
TELEMETRY_SCHEMA = pa.schema(
    [
        ("t", pa.float64()),
        ("host", pa.string()),
        ("kind", pa.string()),
        ("sensor", pa.string()),
        ("value", pa.float64()),
    ]
)
# a series longer than this (12 days at 1 Hz) is split into several row groups
ROW_GROUP_ROWS = 1 << 20
AGENT_COLUMNS = ["t", "sensor", "value", "reason"]  # the agent's CSV header
# blocks of CSV parsed at once (and so chunks of the columns): large blocks, few chunks to join
CSV_BLOCK_BYTES = 16 << 20


class ClockMap(NamedTuple):
    """A host's clock against the controller's: the offsets (host − controller) measured at
    the host times ``at``, in time order."""

    at: tuple[float, ...]
    offset: tuple[float, ...]

    @classmethod
    def constant(cls, offset: float) -> ClockMap:
        return cls((0.0,), (float(offset),))

    def to_controller(self, t: np.ndarray) -> np.ndarray:
        if len(set(self.offset)) == 1:  # no drift: a week of samples needs no interpolation
            return t - self.offset[0]
        return t - np.interp(t, self.at, self.offset)

    def record(self) -> dict:
        """For tidy/ingest.json: each measurement's controller time and offset."""
        return {"at_s": [a - o for a, o in zip(self.at, self.offset, strict=False)], "offset_s": list(self.offset)}


def host_offsets(preflight: Preflight, stopped: dict) -> dict[str, ClockMap]:
    """Each host's clock map from the offsets measured at preflight and at the end (each file's
    ``t`` is when, on the controller's clock)."""
    start, end = preflight.clock_offset_s, stopped.get("clock_offset_end_s", {})
    maps = {}
    for host in sorted(set(start) | set(end)):
        measured = sorted(
            (t + offsets[host], offsets[host])
            for t, offsets in ((preflight.t, start), (stopped.get("t"), end))
            if host in offsets and t is not None
        )
        if not measured:  # an older file without its time: the mean holds throughout
            values = [offsets[host] for offsets in (start, end) if host in offsets]
            measured = [(0.0, sum(values) / len(values))]
        maps[host] = ClockMap(tuple(a for a, _ in measured), tuple(o for _, o in measured))
    return maps


def as_clock(offset: float | ClockMap) -> ClockMap:
    return offset if isinstance(offset, ClockMap) else ClockMap.constant(offset)


class Readings(NamedTuple):
    """Rows of one host and kind: t on the host's clock, value, each row's sensor as a code
    into ``sensors`` (names), and the host's clock map (``sorted_series`` applies it, series
    by series: a week of one kind is hundreds of MB, not to be copied whole)."""

    t: np.ndarray
    value: np.ndarray
    sensor: np.ndarray
    sensors: list[str]
    clock: ClockMap = ClockMap.constant(0.0)


def read_agent_csv(path: Path, host: str, kind: str, clock: ClockMap) -> tuple[Readings, dict]:
    """One source file of one host -> its rows with a value, and the dropped rows counted by
    reason.  A row with too many fields is dropped as "wrong number of fields"; one cut
    short, as a crash mid-write leaves, has its missing fields empty, so it is kept only
    when its t and value are whole."""
    raw, short_rows, long_rows = _read_csv(path)
    t, value = _numbers(raw["t"]), _numbers(raw["value"])
    sensor, sensors = _codes(raw["sensor"].dictionary_encode())
    reasons = raw["reason"]
    if short_rows:
        t_extra, sensor_extra, value_extra, reason_extra = (
            pd.Series([(row + [""] * 4)[i] for row in short_rows], dtype=object) for i in range(4)
        )
        t = np.concatenate([t, pd.to_numeric(t_extra, errors="coerce").to_numpy("float64")])
        value = np.concatenate([value, pd.to_numeric(value_extra, errors="coerce").to_numpy("float64")])
        sensors = list(dict.fromkeys(sensors + sensor_extra.tolist()))
        code = {name: i for i, name in enumerate(sensors)}
        sensor = np.concatenate([sensor, np.array([code[name] for name in sensor_extra], dtype=np.int32)])
        reasons = pa.chunked_array(reasons.chunks + [pa.array(reason_extra, pa.string())])
    keep = np.isfinite(t) & np.isfinite(value)
    counts = {}
    if not keep.all():
        lost = pd.Series(reasons.filter(pa.array(~keep)).to_pylist(), dtype=object)
        infinite = (np.isinf(t) | np.isinf(value))[~keep]
        lost[(lost == "") & infinite] = "not a finite number"
        counts = lost.replace("", "malformed row").value_counts().to_dict()
        t, value, sensor = t[keep], value[keep], sensor[keep]
    if long_rows:
        counts["wrong number of fields"] = counts.get("wrong number of fields", 0) + long_rows
    return Readings(t, value, sensor, sensors, clock), {f"{host}/{kind}: {r}": int(n) for r, n in counts.items()}


def _read_csv(path: Path) -> tuple[pa.Table, list[list[str]], int]:
    """The agent CSV (t, sensor, value, reason) with t and value parsed as numbers where
    every one of them is one (else as text, for _numbers); the rows with too few fields, as
    lists; and how many rows had too many."""
    for numeric in (pa.float64(), pa.string()):
        short_rows, long_rows = [], []

        def invalid(row, short_rows=short_rows, long_rows=long_rows):
            if row.actual_columns < row.expected_columns:
                short_rows.extend(csv.reader([row.text]))
            else:
                long_rows.append(row.text)
            return "skip"

        types = {"t": numeric, "value": numeric, "sensor": pa.string(), "reason": pa.string()}
        try:
            raw = pa_csv.read_csv(
                path,
                read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                parse_options=pa_csv.ParseOptions(invalid_row_handler=invalid),
                convert_options=pa_csv.ConvertOptions(column_types=types, include_columns=AGENT_COLUMNS),
            )
        except pa.ArrowInvalid:
            if numeric == pa.string():
                raise
            continue  # some t or value is not a number: read both as text, for _numbers
        return raw, short_rows, len(long_rows)


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    """float64, NaN where a cell is empty or not a number (as pandas.to_numeric(errors="coerce"))."""
    if pa.types.is_floating(column.type):
        return column.to_numpy()
    return pd.to_numeric(pd.Series(column.to_numpy(zero_copy_only=False), dtype=object), errors="coerce").to_numpy(
        "float64"
    )


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A dictionary-encoded column as codes into one list of names (chunks may each have a
    dictionary of their own)."""
    names, codes = {}, []
    for chunk in column.chunks:
        mapping = np.array([names.setdefault(name, len(names)) for name in chunk.dictionary.to_pylist()], np.int32)
        codes.append(mapping[chunk.indices.to_numpy(zero_copy_only=False)])
    return (np.concatenate(codes) if codes else np.array([], np.int32)), list(names)


def _ranked(parts: list[Readings]) -> Readings:
    """Readings of several files of one host as one, the sensor codes ranks of the names'
    sorted order."""
    sensors = sorted(set().union(*(part.sensors for part in parts)))
    rank = {name: i for i, name in enumerate(sensors)}
    codes = [np.array([rank[name] for name in part.sensors], dtype=np.int32)[part.sensor] for part in parts]
    if len(parts) == 1:  # no copy of t and value
        return parts[0]._replace(sensor=codes[0], sensors=sensors)
    return Readings(
        np.concatenate([part.t for part in parts]),
        np.concatenate([part.value for part in parts]),
        np.concatenate(codes),
        sensors,
        parts[0].clock,
    )


def kind_readings(
    monitor_dir: Path, offsets: dict[str, float | ClockMap], sources: dict | None = None
) -> Iterator[tuple[str, str, Readings, dict]]:
    """Per host and kind, both in sorted order: (host, kind, the rows of every file of that
    kind with their sensors ranked, the dropped rows counted by reason).  ``sources``, when
    given, gets each series' agent source (the file it came from, sampled at that source's
    interval): ``sources[host][kind][sensor]``, as tidy/ingest.json keeps it."""
    for host_dir in sorted(p for p in Path(monitor_dir).iterdir() if p.is_dir()):
        for kind in sorted(set(KIND_OF_FILE.values())):
            parts, dropped, sensors_of = [], {}, {}
            for stem in (stem for stem, of in KIND_OF_FILE.items() if of == kind):
                path = host_dir / f"{stem}.csv"
                if path.exists():
                    clock = as_clock(0.0 if stem in CONTROLLER_CLOCK_FILES else offsets.get(host_dir.name, 0.0))
                    readings, counts = read_agent_csv(path, host_dir.name, kind, clock)
                    if kind == "power":  # the files of one kind share a clock: the controller's, here (small files)
                        readings = readings._replace(t=clock.to_controller(readings.t), clock=ClockMap.constant(0.0))
                    pa.default_memory_pool().release_unused()  # the parsed CSV: Arrow's allocator keeps freed pages
                    parts.append(readings)
                    sensors_of[stem] = readings.sensors
                    for key, n in counts.items():  # two files of one kind may drop rows for one reason
                        dropped[key] = dropped.get(key, 0) + n
            if parts:
                readings = _ranked(parts)
                if kind == "power":
                    readings = _watts(readings, host_dir.name, dropped)
                if sources is not None:
                    sources.setdefault(host_dir.name, {})[kind] = (
                        power.domain_sources(sensors_of)
                        if kind == "power"
                        else {sensor: stem for stem, names in sorted(sensors_of.items()) for sensor in names}
                    )
                yield host_dir.name, kind, readings, dropped


def _watts(readings: Readings, host: str, dropped: dict) -> Readings:
    """A host's power readings and raw energy counters as watts per domain (telemetry/power.py);
    what was left out is counted in ``dropped``.  Power files are small: a frame will do."""
    frame = pd.DataFrame(
        {
            "t": readings.t,
            "host": host,
            "kind": "power",
            "sensor": np.asarray(readings.sensors, dtype=object)[readings.sensor],
            "value": readings.value,
        }
    )
    watts, notes = power.power_rows(frame)
    for key, n in notes.items():
        dropped[key] = dropped.get(key, 0) + n
    codes, sensors = pd.factorize(watts["sensor"], sort=True)
    return Readings(
        watts["t"].to_numpy("float64"),
        watts["value"].to_numpy("float64"),
        codes.astype(np.int32),
        [str(name) for name in sensors],
        readings.clock,
    )


def sorted_series(readings: Readings) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(sensor, t on the controller's clock, value) of each sensor in name order, its rows
    sorted by t; equal t keep the order of the files and of their rows.  The agent appends,
    so each sensor's rows are in time order already: a stable sort by sensor (a radix sort
    of small codes) is all the sorting it takes."""
    order = np.argsort(readings.sensor.astype(np.min_scalar_type(len(readings.sensors))), kind="stable")
    bounds = np.cumsum(np.r_[0, np.bincount(readings.sensor, minlength=len(readings.sensors))])
    for code, name in enumerate(readings.sensors):
        rows = order[bounds[code] : bounds[code + 1]]
        t = readings.t[rows]
        if np.any(t[1:] < t[:-1]):  # a clock stepped back: sort by t, stably
            rows = rows[np.argsort(t, kind="stable")]
            t = readings.t[rows]
        if len(rows):
            yield name, readings.clock.to_controller(t), readings.value[rows]


def write_telemetry(parts, path: Path) -> int:
    """Write (host, kind, readings) in (host, kind) order, every series into row groups of
    its own, with the sort order declared in the footer; returns the rows written.

    Keys are written as dictionary arrays (one entry each), without the Arrow schema, so
    readers still see plain strings.  Values repeat (sensors have coarse steps): dictionary
    encoded.  Times never repeat but climb steadily: their bytes split by significance
    (BYTE_STREAM_SPLIT) compress with LZ4 to a fraction, and decode fastest (see
    docs/benchmarks.md)."""
    schema = pa.schema(
        [
            pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in SERIES_KEYS else f
            for f in TELEMETRY_SCHEMA
        ]
    )
    sorting = [pq.SortingColumn(TELEMETRY_COLUMNS.index(c)) for c in SERIES_KEYS + ["t"]]
    rows = 0
    with (
        atomic.replacing(path) as temporary,
        pq.ParquetWriter(
            temporary,
            schema,
            store_schema=False,
            sorting_columns=sorting,
            compression="lz4",
            use_dictionary=SERIES_KEYS + ["value"],
            use_byte_stream_split=["t"],
        ) as writer,
    ):
        for host, kind, readings in parts:
            for sensor, t, value in sorted_series(readings):
                zeros = pa.array(np.zeros(len(t), np.int32))
                keys = {
                    key: pa.DictionaryArray.from_arrays(zeros, pa.array([name]))
                    for key, name in (("host", host), ("kind", kind), ("sensor", sensor))
                }
                writer.write_table(
                    pa.table({"t": t, **keys, "value": value}, schema=schema), row_group_size=ROW_GROUP_ROWS
                )
                rows += len(t)
    return rows


def frame_parts(frame: pd.DataFrame) -> Iterator[tuple[str, str, Readings]]:
    """(host, kind, readings) of a long frame, in (host, kind) order; rows without host,
    kind or sensor are left out, as a groupby over them would."""
    for (host, kind), rows in frame.dropna(subset=SERIES_KEYS).groupby(["host", "kind"], sort=True):
        codes, sensors = pd.factorize(rows["sensor"])
        yield (
            str(host),
            str(kind),
            _ranked(
                [
                    Readings(
                        rows["t"].to_numpy("float64"),
                        rows["value"].to_numpy("float64"),
                        codes.astype(np.int32),
                        [str(s) for s in sensors],
                    )
                ]
            ),
        )


def write_frame(frame: pd.DataFrame, path: Path) -> int:
    """Any long telemetry frame (TELEMETRY_COLUMNS) written as ingest writes the agent's."""
    return write_telemetry(frame_parts(frame), path)


def server_telemetry(phase_dirs: list[Path], host: str) -> tuple[pd.DataFrame, dict]:
    """Every phase's scrape of the server's /metrics (on the controller's clock already) as
    ``server`` rows of ``host``, counters turned into rates (telemetry/server_metrics.py),
    and the rows left out, counted by reason."""
    frames, dropped = [], {}
    for phase_dir in phase_dirs:
        path = PhaseDir(Path(phase_dir)).server_metrics
        if not path.exists():
            continue
        readings, counts = read_agent_csv(path, host, "server", ClockMap.constant(0.0))
        for key, n in counts.items():
            dropped[key] = dropped.get(key, 0) + n
        # each phase apart: the server restarts between phases, its counters with it
        rows, notes = server_metrics.server_rows(
            pd.DataFrame(
                {
                    "t": readings.t,
                    "host": host,
                    "kind": "server",
                    "sensor": np.asarray(readings.sensors, dtype=object)[readings.sensor],
                    "value": readings.value,
                }
            )
        )
        frames.append(rows)
        for key, n in notes.items():
            dropped[key] = dropped.get(key, 0) + n
    frame = pd.concat(frames, ignore_index=True) if frames else TELEMETRY_SCHEMA.empty_table().to_pandas()
    return frame, dropped


def telemetry(
    monitor_dir: Path, offsets: dict[str, float | ClockMap], sources: dict | None = None
) -> tuple[pd.DataFrame, dict]:
    """The tidy telemetry of a run as one frame, sorted by (host, kind, sensor, t), and the
    dropped rows counted by reason: for small runs and tests (``ingest`` streams to the file).
    ``sources``: as kind_readings fills it."""
    frames, dropped = [], {}
    for host, kind, readings, counts in kind_readings(monitor_dir, offsets, sources):
        frames += [
            pd.DataFrame({"t": t, "host": host, "kind": kind, "sensor": sensor, "value": value})
            for sensor, t, value in sorted_series(readings)
        ]
        dropped.update(counts)
    frame = pd.concat(frames, ignore_index=True) if frames else TELEMETRY_SCHEMA.empty_table().to_pandas()
    return frame.astype({key: "string" for key in SERIES_KEYS}), dropped


def requests(phase_files: list[Path]) -> pd.DataFrame:
    """The requests of every phase, by rep and start.  The files are joined as Arrow tables
    (a soak has hundreds of phases: a DataFrame each costs more than the reading)."""
    tables = [pq.read_table(p) for p in phase_files if Path(p).exists()]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pd.DataFrame()
    joined = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    return joined.sort_values(["rep", "t_start"], kind="stable").reset_index(drop=True)


def ingest(run_dir: Path, phase_request_files: list[Path], out_telemetry: Path, out_requests: Path) -> dict:
    files = RunDir(run_dir)
    preflight = Preflight.read(files.preflight)
    stopped_path = files.stopped
    stopped = json.loads(stopped_path.read_text()) if stopped_path.exists() else {}
    offsets = host_offsets(preflight, stopped)
    plan_path = files.run_json
    head = (json.loads(plan_path.read_text()).get("head") if plan_path.exists() else None) or "endpoint"
    server, dropped = server_telemetry([Path(p).parent for p in phase_request_files], head)

    sources: dict = {}

    def parts():
        for host, kind, readings, counts in kind_readings(files.monitor, offsets, sources):
            dropped.update(counts)
            yield host, kind, readings

    out_telemetry.parent.mkdir(parents=True, exist_ok=True)
    merged = heapq.merge(parts(), frame_parts(server), key=lambda part: (part[0], part[1]))
    rows = write_telemetry(merged, out_telemetry)
    with atomic.replacing(out_requests) as temporary:
        requests(phase_request_files).to_parquet(temporary, index=False)
    _records, event_problems = jsonl.read_checked(files.events, "t", ("event",))
    report = {
        "telemetry_rows": rows,
        "dropped": dropped,
        "events": event_problems,
        "clock_offsets_s": {host: clock.record() for host, clock in offsets.items()},
        "sources": sources,
    }
    atomic.write_text(files.ingest_report, json.dumps(report, indent=1))
    return report
