"""The per-series path of the analysis (ingest's sorted file, model.Telemetry, windows cut by
binary search) against a straightforward computation over the whole frame, on a synthetic
run with the awkward cases: equal times, a missing value, samples on the window bounds, an
aborted attempt, a sensor on one host only; the telemetry as ingest writes it now, as it
wrote it before (in time order), and as a frame in no order."""

import math
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from support.synthetic_run import write_synthetic_run
from thermab.analysis import TABLES, metrics, model
from thermab.analysis.completeness import measured_intervals
from thermab.report import analyze
from thermab.telemetry import ingest


def awkward_telemetry(run_dir) -> pd.DataFrame:
    """The synthetic run's telemetry with the awkward cases added, in time order (the layout
    ingest wrote before it sorted by series)."""
    telemetry = pd.read_parquet(run_dir / "tidy" / "telemetry.parquet")
    windows = metrics.load_windows(model.read_events(run_dir / "events.jsonl"))
    first, second = windows.iloc[0], windows.iloc[1]
    extra = pd.DataFrame(
        [
            (first.load_start, "head", "thermal", "TSOC", 91.0),  # on the opening bound: inside
            (first.load_end, "head", "thermal", "TSOC", 99.0),  # on the closing bound: outside
            (first.load_start + 30, "head", "thermal", "TSOC", 88.0),  # equal times, one series
            (first.load_start + 30, "head", "thermal", "TSOC", 87.0),
            (second.load_start + 45, "head", "thermal", "TS0P", np.nan),  # a missing value
            (second.load_start + 60, "worker", "thermal", "TGPU", 70.5),  # on one host only
            (second.load_start + 15, "worker", "thermal", "TGPU", 92.5),
        ],
        columns=ingest.TELEMETRY_COLUMNS,
    )
    rows = pd.concat([telemetry, extra], ignore_index=True).sort_values("t", kind="stable", ignore_index=True)
    return rows.astype({key: "string" for key in ingest.SERIES_KEYS})


def reference_samples(telemetry: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    telemetry = telemetry[np.isfinite(telemetry["value"])]  # a missing value is no sample
    parts = []
    for phase, window in enumerate(windows.itertuples(index=False)):
        inside = telemetry[(telemetry["t"] >= window.load_start) & (telemetry["t"] < window.load_end)]
        parts.append(
            inside.assign(
                phase=phase, order=window.order, rep=window.rep, arm=window.arm, t_rel=inside["t"] - window.load_start
            )
        )
    return pd.concat(parts, ignore_index=True)


def reference_tables(telemetry: pd.DataFrame, windows: pd.DataFrame, thresholds) -> dict[str, pd.DataFrame]:
    """Masks over every row for every window, then a groupby: what the analysis computed
    before it read series by series (zone means defined as the exact mean, math.fsum)."""
    keys = ["phase"] + metrics.PHASE_KEYS
    thermal = reference_samples(telemetry[telemetry["kind"] == "thermal"], windows)
    zones = thermal.groupby(keys + ["host", "sensor"])["value"]
    zone_table = zones.agg(max_c="max", n="count")
    zone_table.insert(0, "mean_c", zones.apply(lambda v: math.fsum(v.dropna()) / v.count() if v.count() else np.nan))
    rows = []
    for (_, order, rep, arm, host, sensor), zone in thermal.groupby(keys + ["host", "sensor"]):
        for threshold in thresholds:
            above = zone["t_rel"][zone["value"] >= threshold]
            rows.append(
                (order, rep, arm, host, sensor, float(threshold), above.min() if len(above) else np.nan, len(above))
            )
    cpu = reference_samples(
        telemetry[(telemetry["kind"] == "cpu") & (telemetry["sensor"] == metrics.CPU_SENSOR)], windows
    ).groupby(keys + ["host"])["value"]
    cpu_table = cpu.agg(median_pct="median", n="count")
    cpu_table["p5_pct"], cpu_table["p95_pct"] = cpu.quantile(0.05), cpu.quantile(0.95)
    return {
        "zones": zone_table.reset_index().reindex(columns=metrics.ZONE_COLUMNS),
        "thresholds": pd.DataFrame(rows, columns=metrics.THRESHOLD_COLUMNS),
        "cpu": cpu_table.reset_index().reindex(columns=metrics.CPU_COLUMNS),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run twice: telemetry in time order (read whole, the fallback) and as ingest
    writes it (a series per row group)."""
    by_time = write_synthetic_run(tmp_path_factory.mktemp("by_time") / "run", reps=2, aborted_first=True)
    telemetry = awkward_telemetry(by_time)
    telemetry.to_parquet(by_time / "tidy" / "telemetry.parquet", index=False)
    by_series = tmp_path_factory.mktemp("by_series") / "run"
    shutil.copytree(by_time, by_series)
    ingest.write_frame(telemetry, by_series / "tidy" / "telemetry.parquet")
    return telemetry, by_time, by_series


def test_ingest_layout_is_a_series_per_row_group_of_plain_strings(runs):
    telemetry, _, by_series = runs
    path = by_series / "tidy" / "telemetry.parquet"
    metadata = pq.ParquetFile(path).metadata
    series = telemetry.drop_duplicates(ingest.SERIES_KEYS)
    assert metadata.num_row_groups == len(series)
    opened = model.Telemetry.open(path)
    assert all(isinstance(where, tuple) for where in opened.index["where"]), "read by row group, not whole"
    assert opened.index["rows"].sum() == len(telemetry)
    read = pd.read_parquet(path)
    assert list(read.columns) == ingest.TELEMETRY_COLUMNS
    assert all(pd.api.types.is_string_dtype(read[key]) for key in ingest.SERIES_KEYS)
    expected = telemetry.sort_values(ingest.SERIES_KEYS + ["t"], kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(read, expected, check_dtype=False)


@pytest.mark.parametrize("layout", ["frame", "by_time", "by_series"])
def test_window_tables_agree_with_the_straightforward_computation(runs, layout):
    telemetry, by_time, by_series = runs
    windows = metrics.load_windows(model.read_events(by_time / "events.jsonl"))
    thresholds = [85, 90, 92, 95]
    shuffled = telemetry.sample(frac=1, random_state=1)  # rows in no order: read whole and sorted
    source = {
        "frame": shuffled,
        "by_time": model.Telemetry.open(by_time / "tidy" / "telemetry.parquet"),
        "by_series": model.Telemetry.open(by_series / "tidy" / "telemetry.parquet"),
    }[layout]
    expected = reference_tables(telemetry, windows, thresholds)
    got = {
        "zones": metrics.zone_stats(source, windows),
        "thresholds": metrics.time_to_threshold(source, windows, thresholds),
        "cpu": metrics.cpu_stats(source, windows),
    }
    for name, table in expected.items():
        assert got[name].to_csv(index=False) == table.to_csv(index=False), name


def test_sample_interval_is_the_median_step_of_each_kind(runs):
    telemetry, _, by_series = runs
    own = telemetry[
        (telemetry["host"] == "head") & ((telemetry["kind"] != "cpu") | (telemetry["sensor"] == metrics.CPU_SENSOR))
    ].sort_values("t")
    steps = own.groupby(["kind", "sensor"])["t"].diff()
    expected = steps.groupby(own["kind"]).median().dropna().to_dict()
    assert (
        measured_intervals(model.Telemetry.open(by_series / "tidy" / "telemetry.parquet"), "head")
        == expected
        == {"cpu": 6.0, "thermal": 15.0}
    )


def test_both_layouts_give_the_same_files(runs):
    _, by_time, by_series = runs
    analyze.analyze(by_time)
    analyze.analyze(by_series)
    for name in TABLES:
        for suffix in ("csv", "md"):
            assert (by_time / "tables" / f"{name}.{suffix}").read_bytes() == (
                by_series / "tables" / f"{name}.{suffix}"
            ).read_bytes(), f"{name}.{suffix}"
    assert (by_time / "summary.md").read_text().replace(str(by_time), "RUN") == (
        by_series / "summary.md"
    ).read_text().replace(str(by_series), "RUN")


def window_samples(telemetry, windows: pd.DataFrame, **selection) -> pd.DataFrame:
    """(What metrics.series_in_windows yields, gathered.) The samples inside each load window as
    one long frame: the telemetry columns, tagged
        with the phase keys, the window's position (``phase``) and ``t_rel`` = t − load_start; in
        window order, then series (host, kind, sensor), then time.  For tables of few rows: the
        phase tables aggregate per series instead (``per_window``)."""
    parts = [samples.assign(**key) for key, samples in metrics.series_in_windows(telemetry, windows, **selection)]
    columns = ["t", "host", "kind", "sensor", "value", "phase", "order", "rep", "arm", "t_rel"]
    if not parts:
        return pd.DataFrame(columns=columns)
    samples = pd.concat(parts, ignore_index=True)
    samples = samples.iloc[np.argsort(samples["phase"].to_numpy(), kind="stable")].reset_index(drop=True)
    keys = windows[metrics.PHASE_KEYS].iloc[samples["phase"]].reset_index(drop=True)
    return samples.assign(order=keys["order"], rep=keys["rep"], arm=keys["arm"])[columns]


def test_window_samples_are_the_rows_inside_each_window(runs):
    telemetry, by_time, by_series = runs
    windows = metrics.load_windows(model.read_events(by_time / "events.jsonl"))
    got = window_samples(model.Telemetry.open(by_series / "tidy" / "telemetry.parquet"), windows, kind="thermal")
    expected = reference_samples(telemetry[telemetry["kind"] == "thermal"], windows).sort_values(
        ["phase", "host", "kind", "sensor", "t"], kind="stable", ignore_index=True
    )
    pd.testing.assert_frame_equal(got, expected[got.columns], check_dtype=False)


@pytest.mark.parametrize("layout", ["frame", "file"])
def test_no_telemetry_gives_empty_well_formed_tables(tmp_path, layout):
    (tmp_path / "monitor").mkdir()
    frame, dropped = ingest.telemetry(tmp_path / "monitor", {})
    assert frame.empty and dropped == {}
    ingest.write_frame(frame, tmp_path / "telemetry.parquet")
    source = frame if layout == "frame" else model.Telemetry.open(tmp_path / "telemetry.parquet")
    windows = pd.DataFrame([("AB", 1, "A", 0.0, 10.0, 10.0)], columns=metrics.WINDOW_COLUMNS)
    assert metrics.zone_stats(source, windows).columns.tolist() == metrics.ZONE_COLUMNS
    assert metrics.time_to_threshold(source, windows, [90]).empty
    assert metrics.cpu_stats(source, windows).empty
    assert window_samples(source, windows).empty
