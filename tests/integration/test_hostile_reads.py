"""What plan, status, resume and the report read back from a run directory is checked on
read: a phase.json whose window no config could ask for, a status.json of another shape or
size, a questions.csv that is no table, an event appended after the end with an earlier
time, a run directory that is a link looping on itself, telemetry without one finite
reading.  Each is one line naming the file (and key), or read as the run it is."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from support.command_line import run_snakemake
from support.paths import REPO
from support.synthetic_run import write_synthetic_run
from thermab import config
from thermab.errors import UserError
from thermab.experiment import plan
from thermab.report import status
from thermab.report.plan_command import plan_text


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run") / "sim" / "AB")


@pytest.fixture
def copy(run_dir, tmp_path):
    target = tmp_path / "sim" / "AB"
    shutil.copytree(run_dir, target)
    return target


def write_record(path, **keys):
    path.mkdir(parents=True, exist_ok=True)
    (path / "phase.json").write_text(json.dumps(keys))  # Python's json writes Infinity as JSON cannot


@pytest.mark.parametrize(
    "keys, named",
    [
        ({"load_s": float("inf")}, "load_s inf"),
        ({"load_s": 1e12}, "load_s 1e+12"),
        ({"load_s": -5}, "load_s -5"),
        ({"load_s": 86401}, "load_s 86401"),
        ({"validity": {"duration_s": float("nan")}}, "validity.duration_s nan"),
    ],
)
def test_a_phase_record_whose_window_no_config_asks_for_is_one_line(tmp_path, keys, named):
    write_record(tmp_path / "phases" / "rep1-A", **keys)
    with pytest.raises(UserError, match=r"rep1-A/phase\.json: " + named.replace("+", r"\+")) as caught:
        plan.recorded_windows(tmp_path, "AB", 2, crossover=True)
    assert "\n" not in str(caught.value)
    with pytest.raises(
        UserError, match=r"rep1-A/phase\.json"
    ):  # until: decided's windows, read as the workflow is parsed
        plan.block_window(tmp_path, "AB", 8, 2, 60)


def test_a_phase_record_too_large_or_of_another_shape_is_one_line(tmp_path):
    phase = tmp_path / "phases" / "rep1-A"
    write_record(phase, load_s=60)
    assert plan.recorded_windows(tmp_path, "AB", 1) == {1: 60}
    (phase / "phase.json").write_text("[60]")
    with pytest.raises(UserError, match="not a JSON object"):
        plan.recorded_windows(tmp_path, "AB", 1)
    (phase / "phase.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="not a phase record"):
        plan.recorded_windows(tmp_path, "AB", 1)
    with open(phase / "phase.json", "wb") as handle:  # sparse: nothing of it is read
        handle.truncate(700 * 2**20)
    with pytest.raises(UserError, match="bytes, more than"):
        plan.recorded_windows(tmp_path, "AB", 1)


STATUS = {
    "phase": "rep1-B",
    "k": 2,
    "n": 2,
    "t": 1700000800.0,
    "elapsed_s": 30.0,
    "phase_left_s": 10.0,
    "look_left_s": 10.0,
    "run_left_s": 10.0,
    "run_bounded": False,
    "arm": "B",
    "readings": {"head": {"TSOC": 60.0}},
}


def going(run: object) -> None:
    """Make the run look as if it were still in its second phase (no run_end)."""
    events = (run / "events.jsonl").read_text().splitlines()
    (run / "events.jsonl").write_text("\n".join(line for line in events if "run_end" not in line) + "\n")


@pytest.mark.parametrize(
    "content, named",
    [
        ({key: value for key, value in STATUS.items() if key != "run_bounded"}, "key 'run_bounded': missing"),
        ({**STATUS, "readings": {"head": {"TSOC": "hot"}}}, "key 'readings.head.TSOC'"),
        ({**STATUS, "readings": ["head"]}, "key 'readings'"),
        ({**STATUS, "k": True}, "key 'k'"),
        ({**STATUS, "elapsed_s": float("nan")}, "key 'elapsed_s'"),
        ([STATUS], "not a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_a_status_of_another_shape_is_a_line_naming_the_file_and_key(copy, content, named):
    going(copy)
    (copy / "status.json").write_text(content if isinstance(content, str) else json.dumps(content))
    lines = status.status_lines(copy, now=1700000810.0)
    assert any("status.json" in line and named in line for line in lines), lines
    assert any(line.startswith("  phases done:") for line in lines), "the rest still shown"


def test_a_huge_status_is_refused_unread_and_a_good_one_shown(copy):
    going(copy)
    (copy / "status.json").write_text(json.dumps(STATUS))
    assert "  phase 2 of 2 (rep1-B) now: 30 s into its load and cooldown" in "\n".join(
        status.status_lines(copy, now=1700000810.0)
    )
    with open(copy / "status.json", "wb") as handle:
        handle.truncate(700 * 2**20)
    lines = status.status_lines(copy, now=1700000810.0)
    assert any("status.json" in line and "more than" in line for line in lines), lines


def test_an_event_appended_after_the_end_with_an_earlier_time_leaves_the_run_ended(copy):
    with open(copy / "events.jsonl", "a") as handle:
        handle.write(json.dumps({"t": 1700000100.0, "event": "note", "what": "late"}) + "\n")
    (copy / "status.json").write_text(json.dumps(STATUS))
    lines = status.status_lines(copy, now=1700001000.0)
    assert lines[0].endswith("ended (run_end, 70 s ago)"), lines
    assert not any("now:" in line for line in lines)


@pytest.mark.parametrize(
    "content, named",
    [(b"question,arm\nx,B\n", "missing column(s) reference"), (b"\xff\xfe\x00\x01" * 8, "not a table of answers")],
)
def test_a_questions_table_that_is_no_table_is_a_line_naming_it(copy, content, named):
    (copy / "tables").mkdir(exist_ok=True)
    (copy / "tables" / "questions.csv").write_bytes(content)
    lines = status.status_lines(copy, now=1700001000.0)
    assert any("questions.csv" in line and named in line for line in lines), lines
    assert "  questions: not analysed yet" in lines


def test_a_run_directory_that_is_a_link_looping_on_itself_is_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UserError, match=r"loop: not a run directory"):
        plan_text(loop)


def test_telemetry_without_one_finite_reading_is_planned_and_analysed(copy):
    path = copy / "tidy" / "telemetry.parquet"
    pd.read_parquet(path).assign(value=np.nan).to_parquet(path)
    text = plan_text(copy)
    assert text.startswith(f"Plan for {copy}") and "UNDECIDED" in text


def test_a_resume_of_until_decided_with_an_infinite_window_stops_snakemake_in_one_line(tmp_path):
    """`until: decided` reads each phase.json's window while Snakemake parses the workflow."""
    default = config.load(REPO / "config" / "config.yaml", REPO)
    run = tmp_path / "results" / next(iter(default["clusters"])) / default["order"]
    write_record(run / "phases" / "rep1-A", load_s=float("inf"))
    result = run_snakemake(tmp_path, "-n", "all", "--config", "until=decided")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("thermab: ") and "rep1-A/phase.json: load_s inf" in last, last
