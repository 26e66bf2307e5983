"""Agent CSVs and per-phase request files -> the tidy contract files (docs/design.md).

Host timestamps are moved onto the controller's clock with the mean of the offsets
measured at preflight and at the end.  Rows without a value (the agent records missing
readings with a reason) are dropped and counted by reason in ``tidy/ingest.json``.

``tidy/telemetry.parquet`` is sorted by (host, kind, sensor, t), and every series (host,
kind, sensor) has row groups of its own, so that their statistics name the series and a
reader skips every row group but those it needs (analysis/model.py ``Telemetry``).  A
week of 1 Hz CSVs is tens of millions of rows: they are parsed by pyarrow's multithreaded
CSV reader, one (host, kind) at a time, and written as they are read."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from thermab import jsonl
from thermab.telemetry.agent import SOURCES

# each agent file (its stem is the source's name) and the kind its rows take: from the
# agent's own registry, so a source the agent collects is never dropped here
KIND_OF_FILE = {source.name: source.kind for source in SOURCES}
TELEMETRY_COLUMNS = ["t", "host", "kind", "sensor", "value"]
SERIES_KEYS = ["host", "kind", "sensor"]
TELEMETRY_SCHEMA = pa.schema([("t", pa.float64()), ("host", pa.string()), ("kind", pa.string()),
                              ("sensor", pa.string()), ("value", pa.float64())])
# a series longer than this (12 days at 1 Hz) is split into several row groups
ROW_GROUP_ROWS = 1 << 20
AGENT_COLUMNS = ["t", "sensor", "value", "reason"]  # the agent's CSV header


def host_offsets(preflight: dict, stopped: dict) -> dict[str, float]:
    start = preflight.get("clock_offset_s", {})
    end = stopped.get("clock_offset_end_s", {})
    return {host: (start.get(host, 0.0) + end.get(host, start.get(host, 0.0))) / 2
            for host in set(start) | set(end)}


def read_agent_csv(path: Path, host: str, kind: str, offset: float) -> tuple[pa.Table, dict]:
    """One source file of one host -> tidy rows (TELEMETRY_COLUMNS; host, kind and sensor
    dictionary-encoded), and the dropped rows counted by reason.  A row with too many fields
    is dropped as "wrong number of fields"; one cut short, as a crash mid-write leaves, has
    its missing fields empty, so it is kept only when its t and value are whole."""
    raw, short_rows, long_rows = _read_csv(path)
    t, value = _numbers(raw["t"]), _numbers(raw["value"])
    sensor, reason = raw["sensor"], raw["reason"]
    if short_rows:
        extra = [pd.Series([(row + [""] * 4)[i] for row in short_rows], dtype=object) for i in range(4)]
        t = np.concatenate([t, pd.to_numeric(extra[0], errors="coerce").to_numpy("float64")])
        value = np.concatenate([value, pd.to_numeric(extra[2], errors="coerce").to_numpy("float64")])
        sensor = pa.chunked_array(sensor.chunks + [pa.array(extra[1], pa.string())])
        reason = pa.chunked_array(reason.chunks + [pa.array(extra[3], pa.string())])
    keep = ~(np.isnan(t) | np.isnan(value))
    dropped_reasons = pd.Series(reason.filter(pa.array(~keep)).to_numpy(zero_copy_only=False), dtype=object)
    reasons = dropped_reasons.replace("", "malformed row").value_counts().to_dict()
    if long_rows:
        reasons["wrong number of fields"] = reasons.get("wrong number of fields", 0) + long_rows
    rows = int(keep.sum())
    tidy = pa.table({"t": t[keep] - offset, "host": _constant(host, rows), "kind": _constant(kind, rows),
                     "sensor": sensor.filter(pa.array(keep)).dictionary_encode(), "value": value[keep]})
    return tidy, {f"{host}/{kind}: {reason}": int(n) for reason, n in reasons.items()}


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
            raw = pa_csv.read_csv(path, parse_options=pa_csv.ParseOptions(invalid_row_handler=invalid),
                                  convert_options=pa_csv.ConvertOptions(column_types=types,
                                                                        include_columns=AGENT_COLUMNS))
        except pa.ArrowInvalid:
            if numeric == pa.string():
                raise
            continue  # some t or value is not a number: read both as text, for _numbers
        return raw, short_rows, len(long_rows)


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    """float64, NaN where a cell is empty or not a number (as pandas.to_numeric(errors="coerce"))."""
    if pa.types.is_floating(column.type):
        return column.to_numpy()
    return pd.to_numeric(pd.Series(column.to_numpy(zero_copy_only=False), dtype=object),
                         errors="coerce").to_numpy("float64")


def _constant(text: str, rows: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype="int32")), pa.array([text]))


def kind_tables(monitor_dir: Path, offsets: dict[str, float]) -> Iterator[tuple[pa.Table, dict]]:
    """Per host and kind (both in sorted order), every file of that kind read and sorted by
    (sensor, t), so that one after the other they are sorted by (host, kind, sensor, t);
    equal keys keep the order of the files and of their rows.  With each, its dropped rows."""
    for host_dir in sorted(p for p in Path(monitor_dir).iterdir() if p.is_dir()):
        for kind in sorted(set(KIND_OF_FILE.values())):
            parts, dropped = [], {}
            for stem in (stem for stem, of in KIND_OF_FILE.items() if of == kind):
                path = host_dir / f"{stem}.csv"
                if path.exists():
                    table, counts = read_agent_csv(path, host_dir.name, kind, offsets.get(host_dir.name, 0.0))
                    parts.append(table)
                    for key, n in counts.items():  # two files of one kind may drop rows for one reason
                        dropped[key] = dropped.get(key, 0) + n
            if parts:
                yield _by_sensor_and_t(pa.concat_tables(parts).unify_dictionaries().combine_chunks()), dropped


def _by_sensor_and_t(table: pa.Table) -> pa.Table:
    if not len(table):
        return table
    sensor = table.column("sensor").chunk(0)
    rank = np.argsort(np.argsort(sensor.dictionary.to_numpy(zero_copy_only=False)))  # the strings' order
    order = np.lexsort((table.column("t").to_numpy(), rank[sensor.indices.to_numpy()]))  # stable
    return table.take(order).combine_chunks()


def _series(table: pa.Table) -> Iterator[pa.Table]:
    """A table of one host and kind, sorted by sensor, cut at the sensors' boundaries, with
    plain string keys (the contract's types)."""
    if not len(table):
        return
    codes = table.column("sensor").chunk(0).indices.to_numpy()
    bounds = [0, *(np.flatnonzero(np.diff(codes)) + 1), len(table)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        yield table.slice(start, stop - start).cast(TELEMETRY_SCHEMA)


def write_telemetry(tables, path: Path) -> int:
    """Write the tables of ``kind_tables`` (in its order), every series into row groups of its
    own, with the sort order declared in the footer; returns the rows written."""
    rows = 0
    sorting = [pq.SortingColumn(TELEMETRY_SCHEMA.get_field_index(c)) for c in SERIES_KEYS + ["t"]]
    with pq.ParquetWriter(path, TELEMETRY_SCHEMA, sorting_columns=sorting) as writer:
        for table in tables:
            for series in _series(table):
                writer.write_table(series, row_group_size=ROW_GROUP_ROWS)
                rows += len(series)
    return rows


def write_frame(frame: pd.DataFrame, path: Path) -> int:
    """Any long telemetry frame (TELEMETRY_COLUMNS) written as ingest writes the agent's:
    sorted by (host, kind, sensor, t), a series per row group."""
    table = pa.Table.from_pandas(frame[TELEMETRY_COLUMNS].astype({k: str for k in SERIES_KEYS}), preserve_index=False)
    table = table.cast(TELEMETRY_SCHEMA)
    hosts, kinds = (table.column(k).to_numpy(zero_copy_only=False) for k in ("host", "kind"))

    def tables():
        for host, kind in sorted(set(zip(hosts, kinds))):
            part = table.filter(pa.array((hosts == host) & (kinds == kind)))
            yield _by_sensor_and_t(part.set_column(3, "sensor", part.column("sensor").dictionary_encode())
                                   .combine_chunks())

    return write_telemetry(tables(), path)


def telemetry(monitor_dir: Path, offsets: dict[str, float]) -> tuple[pd.DataFrame, dict]:
    """The tidy telemetry of a run as one frame, sorted by (host, kind, sensor, t), and the
    dropped rows counted by reason: for small runs and tests (``ingest`` streams to the file)."""
    series, dropped = [], {}
    for table, counts in kind_tables(monitor_dir, offsets):
        series += _series(table)
        dropped.update(counts)
    frame = pa.concat_tables(series).to_pandas() if series else TELEMETRY_SCHEMA.empty_table().to_pandas()
    return frame.astype({key: "string" for key in SERIES_KEYS}), dropped


def requests(phase_files: list[Path]) -> pd.DataFrame:
    frames = [pd.read_parquet(p) for p in phase_files if Path(p).exists()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values(["rep", "t_start"], kind="stable").reset_index(drop=True)


def ingest(run_dir: Path, phase_request_files: list[Path], out_telemetry: Path, out_requests: Path) -> dict:
    run_dir = Path(run_dir)
    preflight = json.loads((run_dir / "preflight.json").read_text())
    stopped_path = run_dir / "monitor" / "stopped.json"
    stopped = json.loads(stopped_path.read_text()) if stopped_path.exists() else {}
    offsets = host_offsets(preflight, stopped)
    dropped = {}

    def tables():
        for table, counts in kind_tables(run_dir / "monitor", offsets):
            dropped.update(counts)
            yield table

    out_telemetry.parent.mkdir(parents=True, exist_ok=True)
    rows = write_telemetry(tables(), out_telemetry)
    requests(phase_request_files).to_parquet(out_requests, index=False)
    _records, event_problems = jsonl.read_checked(run_dir / "events.jsonl", "t", ("event",))
    report = {"telemetry_rows": rows, "dropped": dropped, "events": event_problems,
              "clock_offsets_s": offsets}
    (out_telemetry.parent / "ingest.json").write_text(json.dumps(report, indent=1))
    return report
