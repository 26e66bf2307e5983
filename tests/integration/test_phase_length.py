"""The load window of each phase (analysis/phase_length.py): the rule that shortens it once
only questions of speed and energy per token are open, what it reads from a run directory,
and the heat metrics' pooling of the run's full windows only."""

import copy
import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from support.crossover import design, least_squares
from support.paths import default_config
from support.synthetic_run import plan_view, write_synthetic_run
from thermab import metric_names as names
from thermab.analysis import levels, phase_length, run_analysis, sequential, washout
from thermab.analysis.model import load_run
from thermab.config import ConfigError, default_questions, validate
from thermab.contracts import Decision
from thermab.errors import UserError
from thermab.experiment import plan
from thermab.layout import RunDir
from thermab.load_levels import Level
from thermab.report import evidence

DEFAULT = default_config()

HEAT = names.zone_mean("head", "TSOC")
SPEED = [names.OUTPUT_THROUGHPUT, names.CLUSTER_ENERGY_PER_TOKEN]


def test_the_restart_metrics_are_the_speed_and_per_token_ones_of_the_default_questions():
    asked = {question["metric"] for question in default_questions()}
    assert asked & names.BETWEEN_RESTARTS == {
        names.OUTPUT_THROUGHPUT,
        names.PROBE_DECODE_SPEED,
        names.CLUSTER_ENERGY_PER_TOKEN,
    }
    assert names.BETWEEN_RESTARTS <= set(names.RUN_METRICS) and names.STALL_GAPS not in names.BETWEEN_RESTARTS


def test_the_window_is_the_full_one_while_a_heat_question_is_open():
    assert phase_length.next_window_s([HEAT, *SPEED], 10.0, 9.0, 1800, 600) == 1800
    assert phase_length.next_window_s([], 10.0, 9.0, 1800, 600) == 1800


def test_only_speed_open_gets_the_shortest_window_whose_error_is_a_third_of_the_restart_spread():
    # 30 tok/s·√s within, 9 tok/s between restarts: 30 / √w ≤ 3 at w = 100 s
    assert phase_length.next_window_s(SPEED, 30.0, 9.0, 1800, 60) == 100
    assert phase_length.next_window_s(SPEED, 30.0, 9.0, 1800, 600) == 600, "not below the floor"
    assert phase_length.next_window_s(SPEED, 300.0, 9.0, 1800, 60) == 1800, "never above load_s"
    assert phase_length.next_window_s(SPEED, 30.0, 9.0, 300, 600) == 300, "a floor above load_s keeps load_s"
    for restart in (0.0, math.nan):  # no restart spread seen: the window's own noise is all there is
        assert phase_length.next_window_s(SPEED, 30.0, restart, 1800, 60) == 1800
    assert phase_length.next_window_s(SPEED, math.nan, 9.0, 1800, 60) == 1800, "no within-phase error measured"


@given(
    within=st.floats(0, 1e4, allow_nan=False),
    restart=st.floats(1e-3, 1e4, allow_nan=False),
    load_s=st.integers(1, 86400),
    floor=st.integers(1, 86400),
)
def test_the_window_is_the_shortest_that_meets_the_rule_within_its_bounds(within, restart, load_s, floor):
    window = phase_length.next_window_s(SPEED, within, restart, load_s, floor)
    assert min(floor, load_s) <= window <= load_s
    meets = within / math.sqrt(window) <= phase_length.WITHIN_SHARE * restart * (1 + 1e-9)
    assert meets or window == load_s
    if window > min(floor, load_s):  # one second less would not meet it
        assert within / math.sqrt(window - 1) > phase_length.WITHIN_SHARE * restart * (1 - 1e-9)


def performance(values, se, window_s=60.0, order="AB"):
    """performance.csv's columns the rule reads, one row per phase in crossover order."""
    is_b, _position = design(len(values) // 2)
    reps = np.repeat(np.arange(1, len(values) // 2 + 1), 2)
    return pd.DataFrame(
        {
            "order": order,
            "rep": reps,
            "arm": np.where(is_b == 1, "B", "A"),
            "window_s": window_s,
            "output_tok_s_in_window": values,
            "output_tok_s_se": se,
        }
    )


def test_the_restart_spread_is_the_fits_residual_sd_less_the_phases_own_noise():
    is_b, position = design(4)
    values = 200 + np.random.default_rng(1).normal(0, 10, len(is_b))
    _estimate, se, _df = least_squares(values[None, :], is_b, position)
    between = float(se[0]) / math.sqrt(2 / 4)
    assert phase_length.restart_sd(performance(values, 0.0), "AB", "A") == pytest.approx(between)
    within = between / 2
    assert phase_length.restart_sd(performance(values, within), "AB", "A") == pytest.approx(between * math.sqrt(0.75))
    assert phase_length.restart_sd(performance(values, 2 * between), "AB", "A") == 0.0
    assert math.isnan(phase_length.restart_sd(performance(values[:2], 1.0), "AB", "A")), "one phase per arm"


def test_the_within_phase_error_scales_to_one_second_over_every_window():
    table = performance(np.ones(4), [2.0, 2.0, 1.0, 1.0]).assign(window_s=[25.0, 25.0, 100.0, 100.0])
    assert phase_length.within_se_1s(table) == pytest.approx(10.0)


def test_a_run_of_levels_runs_the_longest_window_any_level_needs():
    answers = pd.DataFrame({"metric": SPEED, "verdict": "undecided"})
    spread = performance(200 + 20 * np.random.default_rng(3).standard_normal(8), 1.0).assign(
        users=1, load_level="1 user"
    )
    assert phase_length.look_window_s(spread, answers, "AB", "A", 60, 10) == 10
    # at 16 users the phases spread no more than their windows: the full window there
    steady = performance(np.full(8, 900.0), 1.0).assign(users=16, load_level="16 users")
    assert phase_length.look_window_s(pd.concat([spread, steady]), answers, "AB", "A", 60, 10) == 60


def write_look(path, verdicts: dict, windows: dict, values=None, se=1.0):
    """A run directory after a look: phase.json of every phase of ``windows`` (rep → its
    window), questions.csv with ``verdicts`` (metric → verdict), performance.csv."""
    repeats = max(windows)
    for phase in sequential.phases("AB", repeats, crossover=True):
        if phase.rep in windows:
            (path / "phases" / phase.id).mkdir(parents=True, exist_ok=True)
            (path / "phases" / phase.id / "phase.json").write_text(json.dumps({"load_s": windows[phase.rep]}))
    (path / "tables").mkdir(exist_ok=True)
    pd.DataFrame(
        {"metric": list(verdicts), "arm": "B", "phases_per_arm": repeats, "verdict": list(verdicts.values())}
    ).to_csv(path / "tables" / "questions.csv", index=False)
    values = 200 + 10 * np.random.default_rng(2).standard_normal(2 * repeats) if values is None else values
    performance(values, se).to_csv(path / "tables" / "performance.csv", index=False)


def next_window(look_dir, load_s=60, floor=10):
    return phase_length.next_block_window(look_dir, "AB", "A", load_s, floor)


def windows(path, repeats, load_s=60):
    """rep → the window the workflow gives each repeat (``plan.block_window``)."""
    return {rep: plan.block_window(path, "AB", 8, rep, load_s) for rep in range(1, repeats + 1)}


def decide(path, window):
    """The look at 4 going on to 6 with ``window`` (what the checkpoint writes)."""
    decision = RunDir(path).look(4).decision
    decision.parent.mkdir(parents=True, exist_ok=True)
    Decision(4, 6, window, "questions still open").write(decision)


def test_a_run_before_its_first_look_runs_the_full_window(tmp_path):
    assert windows(tmp_path, 2) == {1: 60, 2: 60}


def test_the_next_block_runs_the_window_the_look_chose_and_a_block_keeps_its_window(tmp_path):
    write_look(tmp_path, {HEAT: "yes", **dict.fromkeys(SPEED, "undecided")}, dict.fromkeys(range(1, 5), 60))
    chosen = next_window(tmp_path)
    assert chosen < 60
    decide(tmp_path, chosen)
    # the look at 4 opens the next look's block, repeat 5 alone (a look after every repeat)
    assert windows(tmp_path, 5) == {**dict.fromkeys(range(1, 5), 60), 5: chosen}, "phases that ran keep theirs"
    # rep 5 ran at 30 s: it keeps it, whatever the look decided
    (tmp_path / "phases" / "rep5-A").mkdir()
    (tmp_path / "phases" / "rep5-A" / "phase.json").write_text(json.dumps({"load_s": 30}))
    assert windows(tmp_path, 5)[5] == 30


def test_an_open_heat_question_or_tables_without_the_columns_keep_the_full_window(tmp_path):
    write_look(tmp_path, {HEAT: "undecided", **dict.fromkeys(SPEED, "undecided")}, dict.fromkeys(range(1, 5), 60))
    assert next_window(tmp_path) == 60
    write_look(tmp_path, dict.fromkeys(SPEED, "undecided"), dict.fromkeys(range(1, 5), 60))
    table = pd.read_csv(tmp_path / "tables" / "performance.csv")
    table.drop(columns="output_tok_s_se").to_csv(tmp_path / "tables" / "performance.csv", index=False)
    assert next_window(tmp_path) == 60


def test_a_damaged_table_phase_record_or_decision_is_one_line_naming_it(tmp_path):
    write_look(tmp_path, dict.fromkeys(SPEED, "undecided"), dict.fromkeys(range(1, 5), 60))
    table = pd.read_csv(tmp_path / "tables" / "performance.csv").assign(window_s="long")
    table.to_csv(tmp_path / "tables" / "performance.csv", index=False)
    with pytest.raises(UserError, match=r"performance\.csv: a column of .* not a number"):
        next_window(tmp_path)
    decide(tmp_path, 30)
    RunDir(tmp_path).look(4).decision.write_text('{"repeats": 4, "next_repeats": 3, "load_s": 30, "why": ""}')
    with pytest.raises(UserError, match=r"looks/4/look\.json: not a look's decision") as caught:
        windows(tmp_path, 6)
    assert "\n" not in str(caught.value)
    (tmp_path / "phases" / "rep1-A" / "phase.json").write_text("[1, 2")
    with pytest.raises(UserError, match=r"rep1-A/phase\.json: not a phase record"):
        windows(tmp_path, 6)


def test_heat_pools_only_the_full_windows_and_speed_every_window(tmp_path):
    path = write_synthetic_run(tmp_path / "AB", reps=2)
    for rep, length in ((1, 300), (2, 100)):
        for arm in "AB":
            report = tmp_path / "AB" / "phases" / f"rep{rep}-{arm}" / "validity.json"
            report.write_text(json.dumps({**json.loads(report.read_text()), "duration_s": length}))
    run = levels.at_level(load_run(path), Level(4))  # the reports by phase, as the analysis reads them
    # the probes' chunks counted (2.5 tokens a step): their covariate goes wherever their speed goes
    chunks = pd.array([103 if kind == "probe" else pd.NA for kind in run.requests["kind"]], dtype="Int64")
    run = dataclasses.replace(run, requests=run.requests.assign(token_chunks=chunks))
    tables = run_analysis.phase_tables(run)
    assert tables["validity"].set_index(["rep", "arm"])["load_s"].to_dict() == {
        (1, "A"): 300,
        (1, "B"): 300,
        (2, "A"): 100,
        (2, "B"): 100,
    }
    pooled = run_analysis.run_metrics(run, tables)
    reps = pooled.groupby("metric")["rep"].unique().map(sorted)
    assert reps[HEAT] == [1] and reps[names.cpu_median("head")] == [1] and reps[names.STALL_GAPS] == [1]
    assert reps[names.OUTPUT_THROUGHPUT] == [1, 2] and reps[names.PROBE_DECODE_SPEED] == [1, 2]
    assert reps[names.PROBE_ACCEPTANCE_LENGTH] == [1, 2]


def test_the_starts_a_heat_answer_needs_balanced_are_its_full_windows_only():
    """A speed-only phase waits for no heat cooldown, so it may start hot: its start does not
    withhold the heat answers, which pool the full windows only."""
    validity = pd.DataFrame(
        {
            "order": ["AB", "AB", "BA", "BA"],
            "rep": [1, 1, 2, 2],
            "arm": ["A", "B", "B", "A"],
            "load_s": [60.0, 60.0, 20.0, 20.0],
            "start_c": [49.0, 49.2, 49.3, 70.0],
        }
    )
    full = phase_length.full_window_phases(validity)
    assert full["rep"].tolist() == [1, 1]
    assert washout.unbalanced(validity, "A") != {} and washout.unbalanced(full, "A") == {}
    unrecorded = validity.assign(load_s=np.nan)
    assert phase_length.full_window_phases(unrecorded).equals(unrecorded)


def test_phases_without_a_recorded_window_all_count_as_full(tmp_path):
    run = levels.at_level(load_run(write_synthetic_run(tmp_path / "AB", reps=2)), Level(4))
    tables = run_analysis.phase_tables(run)
    assert tables["validity"]["load_s"].isna().all()
    assert run_analysis.run_metrics(run, tables).groupby("metric")["rep"].nunique().eq(2).all()


def test_sampling_slower_than_the_shortest_window_is_a_config_error_naming_the_floor():
    raw = copy.deepcopy(DEFAULT)
    raw["timings"].update(load_s=60, min_load_s=2)
    raw["monitor"]["intervals"]["cpu"] = 2
    validate(copy.deepcopy(raw))  # a run that never shortens its window
    with pytest.raises(ConfigError, match=r"monitor\.intervals\.cpu.*'timings\.min_load_s' = 2 s"):
        validate({**raw, "until": "decided"})


def test_the_evidence_states_both_windows_of_a_run_that_shortened_them():
    plan = plan_view(
        arms={"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0"}}, until="decided"
    )
    # the windows as measured: Locust's start and end jitter by a second on a busy machine
    windows = pd.DataFrame({"order": "AB", "rep": [1, 1, 3, 3], "arm": list("ABAB"), "window_s": [61.2, 60, 40.4, 40]})
    asked = pd.Series([60, 60, 40, 40], dtype="Int64")
    design = "\n".join(evidence._design(plan, windows, asked))
    assert "loads it for 60 s, 40 s once only questions of speed and energy per token were open" in design
    steady = "\n".join(evidence._design(plan, windows.assign(window_s=[61.2, 60.2, 60.4, 60]), asked * 0 + 60))
    assert "loads it for 60 s, then" in steady
