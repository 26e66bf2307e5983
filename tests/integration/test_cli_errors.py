"""Every CLI answers a user's mistake with one line naming the file or key and exit
status 2, never a traceback; and ``analyze`` reads a run directory without run.json."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from support.command_line import one_line_error, run_thermab
from support.study_chart import CHART
from support.synthetic_run import write_synthetic_run
from thermab.analysis import model
from thermab.report import analyze


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run") / "sim" / "AB")


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "sim" / "AB"
    shutil.copytree(run_dir, target)
    return target


def test_analyze_mistakes(run_dir, tmp_path):
    one_line_error(run_thermab("analyze", tmp_path / "nothing-here"), tmp_path / "nothing-here")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(run_thermab("analyze", empty), "telemetry.parquet")
    truncated = copy_run(run_dir, tmp_path / "t")
    parquet = truncated / "tidy" / "telemetry.parquet"
    parquet.write_bytes(parquet.read_bytes()[:100])
    one_line_error(run_thermab("analyze", truncated), parquet)
    malformed = copy_run(run_dir, tmp_path / "m")
    (malformed / "run.json").write_text('{"arms": ')
    one_line_error(run_thermab("analyze", malformed), malformed / "run.json")
    wrong = copy_run(run_dir, tmp_path / "w")
    (wrong / "run.json").write_text(json.dumps({"arms": ["A", "B"]}))
    one_line_error(run_thermab("analyze", wrong), wrong / "run.json", "arms")
    not_utf8 = copy_run(run_dir, tmp_path / "u")
    (not_utf8 / "run.json").write_bytes(b"\xff\xfe{}")
    one_line_error(run_thermab("analyze", not_utf8), not_utf8 / "run.json")


def test_import_chart_mistakes(tmp_path):
    out = tmp_path / "out"
    one_line_error(run_thermab("import-chart", tmp_path / "none.json", out), tmp_path / "none.json")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    one_line_error(run_thermab("import-chart", bad_json, out), bad_json)
    other_json = tmp_path / "other.json"
    other_json.write_text('{"series": []}')
    one_line_error(run_thermab("import-chart", other_json, out), other_json, "head")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    one_line_error(run_thermab("import-chart", binary, out), binary)
    no_time = tmp_path / "wide.csv"
    no_time.write_text("minute,TSOC\n0,50\n1,60\n")
    marks = tmp_path / "marks.csv"
    marks.write_text("t,m\n0,stock-load-start\n")
    one_line_error(run_thermab("import-chart", no_time, out, "--marks", marks), no_time, "time column 't'")
    bad_marks = tmp_path / "bad-marks.csv"
    bad_marks.write_text("time,mark\n0,x\n")
    one_line_error(run_thermab("import-chart", no_time, out, "--marks", bad_marks), bad_marks)
    text_values = tmp_path / "text.csv"
    text_values.write_text("t,TSOC\n0,hot\n1,cold\n")
    one_line_error(run_thermab("import-chart", text_values, out, "--marks", marks), text_values)
    no_marks = tmp_path / "no-marks.csv"
    no_marks.write_text("t,m\n0,baseline-start\n")
    good = tmp_path / "good.csv"
    good.write_text("t,TSOC\n0,50\n1,60\n")
    one_line_error(run_thermab("import-chart", good, out, "--marks", no_marks), good, "load-start")


def test_debug_shows_the_traceback(tmp_path):
    result = run_thermab("--debug", "analyze", tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_analyze_infers_the_plan_without_run_json(run_dir, tmp_path):
    bare = copy_run(run_dir, tmp_path)
    (bare / "run.json").unlink()
    plan = model.load_run(bare).plan
    assert plan.arms == {"A": {"label": "A", "value": ""}, "B": {"label": "B", "value": ""}}
    assert plan.reference_arm == "A" and plan.order == "AB" and plan.hosts == ("head", "worker")
    assert plan.head == "head" and plan.thresholds_c == (85, 90, 92, 95) and plan.inferred
    result = run_thermab("analyze", bare)
    assert result.returncode == 0, result.stderr
    zones = pd.read_csv(bare / "tables" / "zones.csv")
    planned = analyze.analyze(copy_run(run_dir, tmp_path / "planned"))["zones"]
    assert zones["mean_c"].tolist() == pytest.approx(planned["mean_c"].tolist()), "the same numbers"
    assert "## Telemetry completeness" in (bare / "summary.md").read_text()


def test_status_of_a_directory_that_is_no_run_is_one_line(run_dir, tmp_path):
    cluster = tmp_path / "results" / "sim"  # the cluster's directory, above its runs
    (cluster / "AB").mkdir(parents=True)
    one_line_error(run_thermab("status", cluster), cluster, "not a run directory")
    one_line_error(run_thermab("status", tmp_path / "nothing-here"), tmp_path / "nothing-here")
    begun = tmp_path / "begun" / "AB"
    (begun / "logs").mkdir(parents=True)  # Snakemake's first job of a run: its log's folder
    result = run_thermab("status", begun)
    assert result.returncode == 0 and "no events yet" in result.stdout, result.stderr
    assert run_thermab("status", run_dir).returncode == 0


def test_restore_mistakes(tmp_path):
    one_line_error(run_thermab("restore", tmp_path / "no-results"), tmp_path / "no-results")


def test_unknown_command_and_bad_arguments_exit_2(tmp_path):
    assert run_thermab("frobnicate").returncode == 2
    result = run_thermab("import-chart", CHART, tmp_path / "out", "--arm", "stock")
    assert result.returncode == 2 and "LABEL=VALUE" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, flag",
    [
        (["plan", "RUN", "--hours", "1e308"], "--hours"),
        (["plan", "RUN", "--hours", "0"], "--hours"),
        (["plan", "RUN", "--time-scale", "1e308"], "--time-scale"),
        (["plan", "RUN", "--time-scale", "nan"], "--time-scale"),
        (["plan", "RUN", "--time-scale", "1e400"], "--time-scale"),
        (["plan", "RUN", "--restart-cv", "1e308"], "--restart-cv"),
        (["plan", "RUN", "--restart-cv", "0"], "--restart-cv"),
        (["plan", "RUN", "--restart-cv", "inf"], "--restart-cv"),
        (["tune", "c.yaml", "--cores", "0"], "--cores"),
        (["tune", "c.yaml", "--cores", "1e9"], "--cores"),
        (["tune", "c.yaml", "--cores", "99999"], "--cores"),
        (["load", "http://127.0.0.1:8000", "--out", "o", "--duration", "0"], "--duration"),
        (["plan", "RUN", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_numeric_flags_are_bounded_like_their_keys_in_one_line(capsys, args, flag):
    from thermab.__main__ import main

    with pytest.raises(SystemExit) as caught:
        main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(lines) == 1 and flag in lines[0], lines
    assert lines[0].startswith(f"thermab {args[0]}: ")


def test_a_budget_plan_at_a_tiny_time_scale_is_capped_not_an_overflow():
    from thermab.analysis.planning import MAX_PLANNED_REPEATS, Timings

    assert Timings(50.0, 435.0, 2, time_scale=1e-320).repeats_within(1e6, 2) == MAX_PLANNED_REPEATS


@pytest.mark.parametrize("cores", ["--cores 0", "--cores=-2", "-c 99999", "--cores two"])
def test_thermab_run_bounds_its_cores_before_snakemake_starts(capsys, cores):
    from thermab.__main__ import main

    assert main(["run", *cores.split(), "-n", "all"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"argument {cores.split()[0].split('=')[0]}: " in lines[0], lines
