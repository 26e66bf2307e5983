"""Where a run stands: the phase of how many and the time left (experiment.progress), and
``status`` reading it back from the run's files alone."""

import csv
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from support.paths import REPO as ROOT
from thermab import config as thermab_config, layout
from thermab.experiment import progress
from thermab.report import status


@pytest.fixture(scope="module")
def config():
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw["timings"].update(load_s=600, cooldown_max_s=300)
    return thermab_config.view(thermab_config.validate(raw))


def test_position_counts_the_windows_and_what_is_left(config):
    where = progress.position(config, "AB", 2, "rep1-B", 100, events=[])
    assert (where.k, where.n) == (2, 4)
    assert where.phase_left_s == 500 + 300  # the load's rest and a cooldown of cooldown_max_s
    assert where.look_left_s == where.run_left_s == 800 + 2 * 900  # two windows after it
    assert not where.run_bounded


def test_the_phase_counts_down_through_its_cooldown(config):
    left = [progress.position(config, "AB", 1, "rep1-A", t, []).phase_left_s for t in (0, 600, 700, 900, 1200)]
    assert left == [900, 300, 200, 0, 0]  # a cooldown longer than expected is not counted below 0


def test_position_takes_the_runs_own_pace(config):
    history = [
        {"event": "restart_start", "t": 0, "rep": 1, "arm": "A"},
        {"event": "server_ready", "t": 120, "rep": 1, "arm": "A"},
        {"event": "load_end", "t": 720, "rep": 1, "arm": "A"},
        {"event": "cooldown_end", "t": 780, "rep": 1, "arm": "A"},
    ]
    assert progress.pace(history, 300) == (120, 60)
    where = progress.position(config, "AB", 1, "rep1-A", 0, history)
    assert where.look_left_s == (600 + 60) + (120 + 600 + 60)  # then B's restart and window


def test_until_decided_bounds_the_run_by_max_repeats(config):
    decided = thermab_config.view({**thermab_config.thaw(config), "until": "decided", "max_repeats": 4})
    where = progress.position(decided, "AB", 2, "rep2-B", 600, events=[])  # the second repeat runs BA
    assert where.run_bounded and (where.k, where.n) == (3, 4)
    assert where.look_left_s == 300 + 900
    assert where.run_left_s == 300 + 5 * 900  # up to rep4-B


def test_durations_read_as_estimates():
    assert [progress.duration(s) for s in (40, 89.4, 600, 3900, 9000)] == [
        "40 s",
        "89 s",
        "10 min",
        "1 h 05 min",
        "2 h 30 min",
    ]
    assert progress.duration(float("nan")) == "?"


def test_the_line_names_phase_arm_hottest_zone_and_etas(config):
    where = progress.position(config, "AB", 1, "rep1-B", 300, events=[])
    text = progress.line(where, config, "B", {"head": {"TSOC": 81.24, "TGPU": 60.0}}, "head")
    assert text == "phase 2 of 2 (rep1-B, patched), head hottest TSOC 81.2 °C; ETA phase 10 min, run 10 min"


def test_a_phase_runs_toward_the_look_that_ends_its_block(config):
    assert progress.look_repeats(config, "AB", 1) == config.repeats  # not until: decided
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw.update(until="decided", max_repeats=5)
    decided = thermab_config.view(thermab_config.validate(raw))
    assert [progress.look_repeats(decided, "AB", rep) for rep in range(1, 6)] == [3, 3, 3, 4, 5]


def write_run(run_dir: Path, config: thermab_config.Config, now: float) -> None:
    files = layout.RunDir(run_dir)
    files.phase("rep1-A").phase_json.parent.mkdir(parents=True)
    files.phase("rep1-A").phase_json.write_text("{}")
    with open(files.events, "w") as handle:
        for event in ({"event": "run_start", "t": now - 900}, {"event": "load_start", "t": now - 100}):
            handle.write(json.dumps(event) + "\n")
    where = progress.position(config, "AB", 1, "rep1-B", 100, [])
    progress.write_status(files.status, where, "B", 100, {"head": {"TSOC": 70.0}, "worker": {"TSOC": 65.5}})
    files.tables.mkdir()
    with open(files.table("questions"), "w", newline="") as handle:
        columns = [
            "question",
            "arm",
            "reference",
            "kind",
            "margin",
            "verdict",
            "estimate",
            "ci_low",
            "ci_high",
            "level",
            "phases_per_arm",
            "phases_needed",
            "unit",
            "better",
        ]
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerow(
            {
                "question": "TSOC mean lower",
                "arm": "B",
                "reference": "A",
                "kind": "lower",
                "margin": "",
                "verdict": "undecided",
                "estimate": "-0.91234",
                "ci_low": "-2.1",
                "ci_high": "0.3",
                "level": "0.9",
                "phases_per_arm": "1",
                "phases_needed": "",
                "unit": "°C",
                "better": "lower",
            }
        )


def test_status_reads_where_a_run_stands(config, tmp_path):
    run_dir = tmp_path / "results" / "sim" / "AB"
    now = time.time()
    write_run(run_dir, config, now)
    lines = status.status_lines(run_dir, now)
    text = "\n".join(lines)
    assert lines[0].startswith(f"{run_dir}: last event load_start")
    assert "phase 2 of 2 (rep1-B) now: 2 min into its load and cooldown; ETA then: phase 13 min, look 13 min" in text
    assert "head: hottest TSOC 70.0 °C (1 zones)" in text and "worker: hottest TSOC 65.5 °C" in text
    assert "phases done: 1 (rep1-A)" in text
    assert "\n    UNDECIDED — TSOC mean lower: −0.9 °C [−2.1, +0.3 °C] vs margin 0 °C, 1 phase per arm" in text


def test_status_shows_the_latest_looks_answers_while_until_decided_goes_on(config, tmp_path):
    """Between looks the run's own tables are not made yet: the last analysis is a look's."""
    run_dir = tmp_path / "results" / "sim" / "AB"
    now = time.time()
    write_run(run_dir, config, now)
    files = layout.RunDir(run_dir)
    look = files.look(2)
    look.tables.mkdir(parents=True)
    files.table("questions").replace(look.table("questions"))
    assert status.answers_path(run_dir) == look.table("questions")
    assert "UNDECIDED — TSOC mean lower: " in "\n".join(status.status_lines(run_dir, now))
    newer = files.look(4)
    newer.tables.mkdir(parents=True)
    newer.table("questions").write_bytes(look.table("questions").read_bytes().replace(b"undecided", b"yes"))
    os.utime(look.table("questions"), (now - 60, now - 60))
    assert "YES — TSOC mean lower: " in "\n".join(status.status_lines(run_dir, now))


def test_status_finds_the_newest_run_and_says_when_no_load_runs(config, tmp_path):
    older, newer = tmp_path / "sim" / "AB", tmp_path / "sim" / "BA"
    for run_dir in (older, newer):
        write_run(run_dir, config, time.time())
    assert status.newest_run(tmp_path) == newer
    assert status.newest_run(tmp_path / "nothing") is None
    lines = status.status_lines(newer, time.time() + 600)
    assert "as of 10 min ago (no load running since)" in lines[1]


def test_the_end_of_a_run_names_its_answers_and_files(config, tmp_path):
    run_dir = tmp_path / "sim" / "AB"
    write_run(run_dir, config, time.time())
    files = layout.RunDir(run_dir)
    files.summary.write_text("# summary\n")
    lines = status.closing_lines(run_dir)
    assert lines[0] == f"{run_dir}: the answers"
    assert lines[-1] == f"  summary: {files.summary}"
    (run_dir / "evidence.md").write_text("answer\n")
    assert status.closing_lines(run_dir)[-1] == f"  evidence: {run_dir / 'evidence.md'}"


def test_status_of_a_directory_without_a_run(tmp_path):
    assert status.status_lines(tmp_path) == [
        f"{tmp_path}: no events yet (preflight not done)",
        "  phases done: 0",
        "  questions: not analysed yet",
    ]
