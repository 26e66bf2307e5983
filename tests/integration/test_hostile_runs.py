"""Bad input above the hosts room: run directories thermab did not
write (wrong dtypes, missing columns, truncated JSON, NaN/inf times, one run given twice),
their special and huge files, and import-chart's input.  Each refusal is one UserError
naming the file (and the column), or the run is read correctly; a run is never pooled with
itself."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from support.command_line import run_thermab
from support.paths import REPO
from support.synthetic_run import write_synthetic_run
from thermab import atomic, config, load_levels
from thermab.analysis import chart_import, model, run_analysis
from thermab.config.schema import level_bounds
from thermab.errors import UserError
from thermab.experiment import plan as plan_module
from thermab.jsonl import read_checked

PROFILE = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run") / "sim" / "AB")


def copy_of(run_dir: Path, where: Path) -> Path:
    if where.exists():
        shutil.rmtree(where)
    shutil.copytree(run_dir, where)
    return where


def one_line_naming(call, *named) -> str:
    with pytest.raises(UserError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    for name in named:
        assert str(name) in message, message
    return message


# -- 3. run directories thermab did not write ---------------------------------------------


def test_one_run_given_twice_is_pooled_once(run_dir, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(run_dir)
    copy = copy_of(run_dir, tmp_path / "copy")
    once = run_analysis.compute(run_dir)
    for also in ([run_dir], [alias], [copy], [run_dir, alias, copy]):
        twice = run_analysis.compute(run_dir, also=also)
        assert twice.sources == [str(run_dir)]
        pd.testing.assert_frame_equal(twice.tables["variance"], once.tables["variance"])


def test_two_runs_are_still_pooled(run_dir, tmp_path):
    other = write_synthetic_run(tmp_path / "sim" / "AB", seed=1, t0=1.8e9)
    assert run_analysis.compute(run_dir, also=[other]).sources == [str(run_dir), str(other)]


TELEMETRY_BREAKS = {
    "t as timestamps": lambda f: f.assign(t=pd.to_datetime(f["t"], unit="s")),
    "t as text": lambda f: f.assign(t=f["t"].astype(str)),
    "value as text": lambda f: f.assign(value=f["value"].astype(str)),
    "sensor as numbers": lambda f: f.assign(sensor=np.arange(len(f))),
}


@pytest.mark.parametrize("breakage", sorted(TELEMETRY_BREAKS))
def test_telemetry_of_the_wrong_dtype_names_its_column(run_dir, tmp_path, breakage):
    broken = copy_of(run_dir, tmp_path / "broken")
    path = broken / "tidy" / "telemetry.parquet"
    TELEMETRY_BREAKS[breakage](pd.read_parquet(path)).to_parquet(path)
    column = breakage.split(" ")[0]
    one_line_naming(lambda: model.load_run(broken), path, f"'{column}'")


@PROFILE
@given(
    drop=st.sets(st.sampled_from(model.REQUIRED_REQUEST_COLUMNS), min_size=1),
    text=st.sampled_from(["t_start", "t_end", "completion_tokens", "t_first_token"]),
)
def test_requests_with_missing_or_text_columns_name_them(run_dir, tmp_path, drop, text):
    broken = copy_of(run_dir, tmp_path / "broken")
    path = broken / "tidy" / "requests.parquet"
    frame = pd.read_parquet(path)
    frame.drop(columns=sorted(drop)).to_parquet(path)
    one_line_naming(lambda: model.load_run(broken), path, "missing column", *sorted(drop))
    frame.assign(**{text: frame[text].astype(str)}).to_parquet(path)
    one_line_naming(lambda: model.load_run(broken), path, f"'{text}'")


INGEST_JSON = {"telemetry_rows": 1, "sources": {"head": {"thermal": {"TSOC": "thermal", "x/temp1": "hwmon"}}}}


@PROFILE
@given(cut=st.integers(0, 400), which=st.sampled_from(["run.json", "validity.json", "tidy/ingest.json"]))
def test_truncated_or_keyless_json_is_one_line(run_dir, tmp_path, cut, which):
    broken = copy_of(run_dir, tmp_path / "broken")
    path = sorted(broken.glob("phases/*/validity.json"))[0] if which == "validity.json" else broken / which
    if which == "tidy/ingest.json":
        path.write_text(json.dumps(INGEST_JSON))
        assert model.load_run(broken).sources == INGEST_JSON["sources"]
    text = path.read_text()
    for damaged in (
        text[: cut % max(len(text) - 1, 1)],
        "{}",
        "[]",
        '{"order": 1, "rep": "x"}',
        '{"sources": [1]}',
        '{"sources": {"head": {"thermal": {"TSOC": 3}}}}',
        '{"sources": {"h": 1}}',
    ):
        path.write_text(damaged)
        try:
            model.load_run(broken)  # an empty run.json is an older plan, read with defaults
        except UserError as error:
            assert "\n" not in str(error) and str(path) in str(error)


@PROFILE
@given(bad=st.sampled_from(["NaN", "Infinity", "-Infinity", '"12"', "true", "null", "1e400"]))
def test_events_with_non_finite_or_non_number_times_are_dropped(tmp_path, bad):
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"t": 1.0, "event": "run_start"}\n'
        + f'{{"t": {bad}, "event": "load_start"}}\n'
        + '{"t": 2, "event": "run_end"}\n'
    )
    records, problems = read_checked(path, "t", ("event",))
    assert [r["event"] for r in records] == ["run_start", "run_end"] and problems["malformed_lines"] == 1
    assert all(math.isfinite(r["t"]) for r in records)


@pytest.fixture
def specials(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    with open(huge, "wb") as handle:
        handle.truncate(80 * 2**30)  # sparse, larger than any bound
    return {"fifo": fifo, "directory": tmp_path / "dir", "device": Path("/dev/zero"), "huge": huge}


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "huge"])
@pytest.mark.parametrize(
    "name",
    [
        "events.jsonl",
        "run.json",
        "tidy/telemetry.parquet",
        "tidy/requests.parquet",
        "validity.json",
        "tidy/ingest.json",
    ],
)
def test_a_special_or_huge_file_in_a_run_directory_is_refused_at_once(run_dir, tmp_path, specials, kind, name):
    broken = copy_of(run_dir, tmp_path / "broken")
    path = sorted(broken.glob("phases/*/validity.json"))[0] if name == "validity.json" else broken / name
    path.unlink(missing_ok=True)
    if kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(specials[kind])
    one_line_naming(lambda: model.load_run(broken), path)


def test_names_that_read_as_mathtext_are_drawn_as_written(run_dir, tmp_path):
    """A timeline zone (or a host's zone) named like TeX: every figure is still drawn."""
    from thermab.report import plots

    copy = copy_of(run_dir, tmp_path / "copy")
    result = run_analysis.compute(copy, analysis={"timeline_zone": "$x^$ $\\frac$"})
    assert all(path.stat().st_size > 0 for path in plots.render_figures(result))


# -- 8. import-chart input -------------------------------------------------------------------


def write_marks(path: Path, rows) -> Path:
    pd.DataFrame(rows, columns=["t", "m"]).to_csv(path, index=False)
    return path


TABLE = pd.DataFrame({"t": np.arange(0, 120, 1.0), "TSOC": 50 + np.arange(120) % 7})
GOOD_MARKS = [(1, "stock-load-start"), (40, "patched-load-start")]


@PROFILE
@given(
    name=st.one_of(
        st.text(alphabet=" \t\n\r\x00\x07\x1b\u200b", max_size=6).filter(
            lambda n: not n.strip() or not n.isprintable()
        ),
        st.none(),
        st.integers(),
        st.floats(),
        st.lists(st.text()),
    ),
    t=st.one_of(st.floats(-1e6, 1e6), st.sampled_from([math.nan, math.inf, -math.inf, None, "5", True])),
)
def test_a_mark_that_is_not_a_name_at_a_finite_time_is_one_line(name, t):
    valid_name = isinstance(name, str) and name.strip() and name.isprintable()
    valid_t = isinstance(t, float) and math.isfinite(t)
    if valid_name and valid_t:
        return
    one_line_naming(lambda: chart_import.check_marks([(1.0, "stock-load-start"), (t, name)]), "mark")


@pytest.mark.parametrize("mark, t", [("", 60), ("   ", 60), ("a\u0007b", 60), ("note", math.nan), ("note", math.inf)])
def test_a_marks_file_with_a_bad_mark_is_one_line_naming_it(tmp_path, mark, t):
    table = tmp_path / "wide.csv"
    TABLE.to_csv(table, index=False)
    marks = write_marks(tmp_path / "marks.csv", GOOD_MARKS + [(t, mark)])
    one_line_naming(lambda: chart_import.import_wide_csv(table, tmp_path / "out", marks, load_minutes=10), marks)


def test_a_header_with_no_rows_is_one_line(tmp_path):
    table = tmp_path / "wide.csv"
    table.write_text("t,TSOC,worker:TSOC\n")
    marks = write_marks(tmp_path / "marks.csv", GOOD_MARKS)
    one_line_naming(lambda: chart_import.import_wide_csv(table, tmp_path / "out", marks), table, "no rows")
    header_only = tmp_path / "marks-header.csv"
    header_only.write_text("t,m\n")
    TABLE.to_csv(table, index=False)
    one_line_naming(lambda: chart_import.import_wide_csv(table, tmp_path / "out", header_only), header_only, "no rows")


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--load-minutes", "-5"),
        ("--load-minutes", "nan"),
        ("--load-minutes", "inf"),
        ("--epoch-s", "-1"),
        ("--epoch-s", "inf"),
        ("--epoch-s", "nan"),
    ],
)
def test_negative_or_non_finite_numbers_are_one_line(tmp_path, flag, value):
    table = tmp_path / "wide.csv"
    TABLE.to_csv(table, index=False)
    marks = write_marks(tmp_path / "marks.csv", GOOD_MARKS)
    result = run_thermab("import-chart", table, tmp_path / "out", "--marks", marks, f"{flag}={value}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert flag in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge"])
def test_a_special_chart_source_or_marks_file_is_refused(tmp_path, specials, kind):
    table = tmp_path / "wide.csv"
    TABLE.to_csv(table, index=False)
    marks = write_marks(tmp_path / "marks.csv", GOOD_MARKS)
    special = specials[kind] if kind != "directory" else tmp_path
    one_line_naming(lambda: chart_import.import_wide_csv(special, tmp_path / "out", marks), special)
    one_line_naming(lambda: chart_import.import_wide_csv(table, tmp_path / "out", special), special)
    one_line_naming(lambda: chart_import.import_chart(special, tmp_path / "out"), special)


def test_a_wide_csv_of_thousands_of_columns_is_read_whole(tmp_path):
    zones = {
        f"Z{i}": np.full(30, 40.0 + i % 50) for i in range(2_000)
    }  # 10,000 measured: 25 s, 20 of them writing 10,000 row groups
    table = tmp_path / "wide.csv"
    pd.DataFrame({"t": np.arange(30.0), **zones}).to_csv(table, index=False)
    marks = write_marks(tmp_path / "marks.csv", [(1, "stock-load-start"), (10, "patched-load-start")])
    out = chart_import.import_wide_csv(table, tmp_path / "out", marks, load_minutes=5)
    telemetry = model.load_run(out).telemetry
    assert len(telemetry.index) == 2_000 and set(telemetry.index["sensor"]) == set(zones)


# -- a run plan from elsewhere is held to the config's checks --------------------------------

QUESTION = {"metric": "head TSOC mean", "kind": "lower"}
NON_INFERIOR = {"metric": "output throughput", "kind": "non_inferior", "better": "higher", "margin_pct": 5}


@pytest.mark.parametrize(
    "change, key",
    [
        ({"questions": [{**QUESTION, "users": 4}]}, "questions.0.users"),
        ({"users": "4"}, "users"),
        ({"start_balance_c": "2"}, "start_balance_c"),
        ({"start_balance_c": math.nan}, "start_balance_c"),
        ({"max_repeats": "8"}, "max_repeats"),
        ({"max_repeats": 8.5}, "max_repeats"),
        ({"max_repeats": 1000000}, "max_repeats"),
        ({"order": ""}, "order"),
        ({"order": 5}, "order"),
        ({"order": "AC"}, "order"),
        ({"reference_arm": "Z"}, "reference_arm"),
        ({"questions": [{**NON_INFERIOR, "better": "sideways"}]}, "questions.0.better"),
        ({"questions": [{**NON_INFERIOR, "margin_pct": 100}]}, "questions.0.margin_pct"),
        ({"questions": [{**NON_INFERIOR, "margin_pct": -5}]}, "questions.0.margin_pct"),
        ({"users": [2, 4], "questions": [{**QUESTION, "users": [8]}]}, "questions.0.users"),
        ({"thresholds_c": [85, 90, 90]}, "thresholds_c.2"),
        ({"trip_point_c": "hot"}, "trip_point_c"),
    ],
)
def test_a_run_plan_the_config_would_refuse_is_one_line_naming_its_key(run_dir, tmp_path, change, key):
    """run.json's values are checked as the config's own: a value `check-config` refuses is
    refused here too, naming run.json and the key (a question at a level the run lacks too)."""
    copy = copy_of(run_dir, tmp_path / "copy")
    plan = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**plan, **change}))
    one_line_naming(lambda: run_analysis.compute(copy), copy / "run.json", f"key '{key}")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
# run.json keys whose check is the config key's alone (the others add the config's checks
# across keys: arms in order, a reference arm, levels, thresholds ascending)
PLAIN_KEYS = sorted(set(plan_module.CONFIG_KEYS) - {"order", "arms", "questions", "thresholds_c", "probe_n", "users"})


@PROFILE
@given(key=st.sampled_from(sorted(plan_module.CONFIG_KEYS)), value=JSON_VALUES, data=st.data())
def test_run_json_takes_what_the_config_takes(run_dir, key, value, data):
    """Any value of a run.json key that stands for a config key: refused, in lines naming
    the key, exactly where the config's check of that key refuses it."""
    plan = json.loads((run_dir / "run.json").read_text())
    config_problems = config.key_problems(plan_module.CONFIG_KEYS[key], value)
    problems = plan_module.plan_problems({**plan, key: value})
    assert all(f"key '{key}" in problem and "\n" not in problem for problem in problems), problems
    if key in PLAIN_KEYS:
        assert bool(problems) == bool(config_problems)
    elif key == "users":  # the schema's check, then the levels' (a mapping without users, a level twice)
        level_problems = (
            load_levels.problems({**plan, "users": value}, bounds=level_bounds()) if not config_problems else []
        )
        assert bool(problems) == bool(config_problems or level_problems), (problems, config_problems)
    elif config_problems and not (key == "probe_n" and value == 0):
        assert problems


def test_a_detect_pct_that_is_not_a_finite_number_is_refused(run_dir):
    for value in ("nan", "inf", "-5"):
        result = subprocess.run(
            [sys.executable, "-m", "thermab", "analyze", str(run_dir), f"--detect-pct={value}"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "--detect-pct" in result.stderr.strip().splitlines()[-1]


# -- parquet that lies ---------------------------------------------------------------------


@PROFILE
@given(data=st.data())
def test_a_damaged_data_page_is_one_line_naming_the_file(run_dir, tmp_path, data):
    """Bytes of the data pages overwritten, the footer intact: every series is read or the
    run is refused in one line naming the file, whatever the damage."""
    broken = copy_of(run_dir, tmp_path / "broken")
    path = broken / "tidy" / "telemetry.parquet"
    content = bytearray(path.read_bytes())
    footer = int.from_bytes(content[-8:-4], "little") + 8
    start = data.draw(st.integers(4, len(content) - footer - 1), label="start")
    damage = data.draw(st.binary(min_size=1, max_size=64), label="damage")
    content[start : start + len(damage)] = damage[: len(content) - footer - start]
    path.write_bytes(bytes(content))
    try:
        run = model.load_run(broken)
        for _key, arrays in run.telemetry.series():
            assert len(arrays["t"]) == len(arrays["value"])
    except UserError as error:
        assert str(error).startswith(f"{path}: ") and "\n" not in str(error)


def test_telemetry_replaced_while_read_is_read_as_the_file_opened(run_dir, tmp_path):
    """The file is opened once: another ingest replacing it (os.replace, as every output is
    written) after the footer was read leaves this reader on the bytes it opened."""
    copy = copy_of(run_dir, tmp_path / "copy")
    path = copy / "tidy" / "telemetry.parquet"
    telemetry = model.Telemetry.open(path)
    before = {tuple(key.values()): arrays["value"].copy() for key, arrays in telemetry.series()}
    other = pd.read_parquet(path).assign(value=lambda frame: frame["value"] + 1000.0)
    with atomic.replacing(path) as temporary:
        other.to_parquet(temporary)
    after = {tuple(key.values()): arrays["value"] for key, arrays in telemetry.series()}
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[key], after[key]) for key in before)
