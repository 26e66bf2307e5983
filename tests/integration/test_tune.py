"""The tune's parts without a cluster: its config's bad input, the trial a value
becomes, the looks' arithmetic, racing, the choice, the study's resumption and the report."""

from __future__ import annotations

import copy
import json
import math
import os
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from support.paths import REPO as ROOT
from thermab import layout
from thermab.__main__ import main as thermab_main
from thermab.config import ConfigError, Tune, read_file, thaw, validate, view
from thermab.errors import UserError
from thermab.tune import answer, racing, study as tune_study

RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
TUNE = {"min": 0.0005, "max": 1, "scale": "log", "budget_phases": 40}
PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tuned(**changes) -> dict:
    raw = copy.deepcopy(RAW)
    raw["tune"] = {**TUNE, **changes}
    return raw


def tune_view(**changes) -> Tune:
    """The tune section of the default config with ``changes``, as the tune reads it."""
    return view(validate(tuned(**changes), ROOT)).tune


def refused(raw: dict, named: str) -> str:
    with pytest.raises(ConfigError) as caught:
        validate(raw, ROOT)
    message = str(caught.value)
    assert "\n" not in message and named in message, message
    return message


# -- bad input: one line naming the key ---------------------------------------------------


@pytest.mark.parametrize("low, high", [(0.1, 0.1), (1, 0.0005), (-1, -2)])
def test_an_empty_or_inverted_range_is_refused(low, high):
    assert "holds no value" in refused(tuned(min=low, max=high, scale="linear"), "'tune.max'")


@pytest.mark.parametrize("low", [0, -0.5])
def test_a_log_scale_through_zero_is_refused(low):
    assert "log scale" in refused(tuned(min=low), "'tune.min'")
    validate(tuned(min=low, scale="linear"), ROOT)  # a linear one may start at or below zero


def test_an_objective_that_is_no_metric_is_refused():
    assert "no metric" in refused(tuned(objective="head joules per smile"), "'tune.objective'")
    for metric in ("head TSOC mean", "worker vLLM CPU median", "output throughput"):
        validate(tuned(objective=metric), ROOT)


@pytest.mark.parametrize("key", ["min", "max"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(key, value):
    refused(tuned(**{key: value}), f"'tune.{key}'")


def test_a_constraint_is_checked_as_a_question_is_and_named_where_it_is():
    bad = [{"metric": "stall gaps", "kind": "non_inferior", "better": "lower", "margin": -1}]
    refused(tuned(constraints=bad), "'tune.constraints.0.margin'")
    refused(tuned(constraints=[{"metric": "speed of light", "kind": "lower"}]), "'tune.constraints.0.metric'")


def test_unknown_keys_and_two_clusters_are_refused():
    refused(tuned(budget=3), "'tune.budget'")
    raw = tuned()
    raw["clusters"]["other"] = copy.deepcopy(raw["clusters"]["sim"])
    raw["clusters"]["other"]["endpoint"] = "http://127.0.0.1:18399"
    for host in raw["clusters"]["other"]["hosts"].values():
        host["root"] = host["root"].replace("/sim/sim/", "/sim/other/")
    assert "one cluster" in refused(raw, "'tune'")


@pytest.mark.parametrize("max_repeats, needed", [(2, 4), (3, 6), (4, 6), (8, 6)])
def test_a_budget_below_one_decision_is_refused(max_repeats, needed):
    """One decision: both arms up to the first look that spends alpha (sequential.MIN_DF)."""
    assert racing.decision_phases(max_repeats) == needed
    config = view(validate({**tuned(budget_phases=needed - 1), "max_repeats": max_repeats}, ROOT))
    with pytest.raises(ConfigError) as caught:
        racing.check_budget(config)
    assert "'tune.budget_phases'" in str(caught.value) and "\n" not in str(caught.value)
    racing.check_budget(view(validate({**tuned(budget_phases=needed), "max_repeats": max_repeats}, ROOT)))


def test_the_command_answers_bad_input_with_one_line_and_status_2(tmp_path, capsys):
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(tuned(min=0, budget_phases=2)))
    assert thermab_main(["tune", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "'tune.min'" in error, error
    path.write_text(yaml.safe_dump(RAW))
    assert thermab_main(["tune", str(path)]) == 2
    assert "no 'tune' section" in capsys.readouterr().err
    path.write_text(yaml.safe_dump(tuned(budget_phases=2)))
    assert thermab_main(["tune", str(path)]) == 2
    assert "'tune.budget_phases'" in capsys.readouterr().err


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**6))


@PROFILE
@given(
    low=numbers,
    high=numbers,
    scale=st.sampled_from(["log", "linear"]),
    budget=st.one_of(st.integers(-5, 10**5), numbers),
)
def test_any_range_is_a_search_space_or_one_line_naming_the_tune(low, high, scale, budget):
    try:
        config = validate(tuned(min=low, max=high, scale=scale, budget_phases=budget), ROOT)
    except ConfigError as error:
        assert "\n" not in str(error) and "'tune" in str(error), str(error)
        return
    tune = view(config).tune
    assert math.isfinite(tune.min) and math.isfinite(tune.max) and tune.min < tune.max
    assert tune.scale == "linear" or tune.min > 0
    distribution = tune_study.distribution(tune)  # Optuna takes it as a search space
    assert distribution.low == tune.min and distribution.high == tune.max


# -- the trial a value becomes --------------------------------------------------------------


@PROFILE
@given(value=st.floats(min_value=1e-9, max_value=1e6), digits=st.integers(1, 12))
def test_a_tried_value_is_a_literal_the_config_accepts(value, digits):
    tried = racing.rounded(value, digits)
    assert float(racing.literal(tried)) == tried
    assert math.isclose(tried, value, rel_tol=10 ** (1 - digits))


def test_a_trial_is_the_reference_against_the_value_until_decided(tmp_path):
    config = view(validate(tuned(), ROOT))
    trial = racing.trial_config(config, 0.00321)
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump(trial, sort_keys=False))
    again = validate(read_file(path), ROOT)  # what the trial's Snakemake reads
    assert "tune" not in again and again["order"] == "AB" and again["until"] == "decided"
    assert again["arms"]["A"] == RAW["arms"]["A"] and again["arms"]["B"]["value"] == "0.00321"
    assert again["questions"] == [
        *thaw(config.tune.constraints),
        {"metric": "cluster energy per token", "kind": "lower"},
    ]


# -- racing ---------------------------------------------------------------------------------


def look(
    constraints: list[str],
    objective: tuple[float, float, float] = (-1.0, -2.0, 0.0),
    objective_verdict: str = "undecided",
    repeats: int = 4,
) -> racing.Look:
    rows = [
        {"question": f"constraint {i}", "verdict": v, "estimate": 0.0, "ci_low": -1.0, "ci_high": 1.0, "level": 0.9}
        for i, v in enumerate(constraints)
    ]
    estimate, low, high = objective
    rows.append(
        {
            "question": "objective lower",
            "verdict": objective_verdict,
            "estimate": estimate,
            "ci_low": low,
            "ci_high": high,
            "level": 0.9,
        }
    )
    return racing.Look(repeats=repeats, rows=rows)


def test_a_constraint_decided_no_drops_the_trial_at_once():
    action, why = racing.judge(look(["undecided", "no", "undecided"]), "lower", None, 8, 100)
    assert action == racing.DROP and "constraint 1" in why


def test_a_trial_that_cannot_beat_the_best_so_far_stops():
    # its optimistic bound (-2) is worse than the best's estimate (-3): not a contender
    action, why = racing.judge(look(["undecided"]), "lower", -3.0, 8, 100)
    assert action == racing.BEATEN and "contender" in why
    assert racing.judge(look(["undecided"]), "lower", -1.5, 8, 100)[0] == racing.CONTINUE  # it still may
    assert racing.judge(look(["undecided"], (1.0, 0.0, 2.0)), "higher", 1.5, 8, 100)[0] == racing.CONTINUE
    assert racing.judge(look(["undecided"], (1.0, 0.0, 2.0)), "higher", 2.5, 8, 100)[0] == racing.BEATEN


def test_a_contender_keeps_measuring_until_decided_capped_or_out_of_budget():
    assert racing.judge(look(["yes", "yes"], objective_verdict="yes"), "lower", None, 8, 100)[0] == racing.DECIDED
    assert racing.judge(look(["yes", "undecided"]), "lower", None, 8, 100)[0] == racing.CONTINUE
    assert racing.judge(look(["yes", "undecided"], repeats=8), "lower", None, 8, 100)[0] == racing.CAP
    action, why = racing.judge(look(["yes", "undecided"], repeats=4), "lower", None, 8, 1)
    assert action == racing.BUDGET and "budget ran out before a decision" in why
    assert racing.next_look_phases(8, 4) == 2 and racing.next_look_phases(8, 8) is None


def trial(number, value, objective, verdicts, beats="yes", action=racing.DECIDED, why="", phases=8):
    return racing.Trial(
        number=number,
        value=value,
        phases=phases,
        objective=objective,
        ci_low=objective - 1,
        ci_high=objective + 1,
        level=0.9,
        beats_reference=beats,
        constraints=[
            {"question": f"c{i}", "verdict": v, "estimate": 0.0, "ci_low": -1.0, "ci_high": 1.0}
            for i, v in enumerate(verdicts)
        ],
        action=action,
        why=why,
    )


def test_the_best_is_the_best_feasible_estimate():
    trials = [
        trial(0, 1e-3, -9.0, ["no"], action=racing.DROP),
        trial(1, 1e-2, -5.0, ["yes", "yes"]),
        trial(2, 0.1, -6.0, ["yes", "undecided"], action=racing.CAP),
        trial(3, 0.02, -4.0, ["yes", "yes"]),
    ]
    assert racing.best(trials, "lower").number == 1
    assert racing.best(trials, "higher").number == 3
    assert racing.best(trials[:1], "lower") is None
    assert [racing.violation(t) for t in trials] == [1.0, 0.0, 0.5, 0.0]


# -- the study: resumption ------------------------------------------------------------------


def test_an_interrupted_study_gives_back_its_running_trial(tmp_path):
    tune = tune_view()
    storage = layout.TuneDir(tmp_path).study
    study = tune_study.open_study(tune, storage, reference=1.0)
    first = tune_study.ask(study, tune)
    tune_study.tell(study, trial(first[0], first[1], -1.0, ["yes"]))
    second = tune_study.ask(study, tune)
    # the tune stops here; run again, it opens the same study and finds the trial it ran
    again = tune_study.open_study(tune, storage, reference=1.0)
    assert tune_study.interrupted(again) == [second]
    assert [t.number for t in tune_study.results(again, storage)] == [first[0]]
    assert tune.min <= second[1] <= tune.max
    with pytest.raises(ConfigError, match="'tune'"):
        tune_study.open_study(tune_view(max=2), storage, reference=1.0)


def test_the_first_trials_are_a_grid_across_the_range_without_the_reference(tmp_path):
    tune = tune_view(startup_trials=4)
    assert racing.initial_values(tune, reference=1.0) == [0.0005, 0.0063, 0.0794]  # 1 is the reference
    assert racing.initial_values(tune, reference=0.002) == [0.0005, 0.0063, 0.0794, 1.0]
    linear = tune_view(startup_trials=4, scale="linear", min=0, max=3)
    assert racing.initial_values(linear, reference=1.0) == [0.0, 2.0, 3.0]
    one = tune_view(startup_trials=1, scale="linear", min=0, max=3)
    assert racing.initial_values(one, reference=0.0) == [1.5]
    study = tune_study.open_study(tune, layout.TuneDir(tmp_path).study, reference=1.0)
    asked = [tune_study.ask(study, tune) for _ in range(4)]
    assert [value for _, value in asked[:3]] == [0.0005, 0.0063, 0.0794]
    assert tune.min <= asked[3][1] <= tune.max  # then the sampler's own
    # opened again (an interrupted tune), the grid is not enqueued twice
    again = tune_study.open_study(tune, layout.TuneDir(tmp_path).study, reference=1.0)
    assert len(again.get_trials()) == 4


# -- the report -----------------------------------------------------------------------------


def written(tmp_path, trials) -> tuple[dict, pd.DataFrame, str]:
    config = view(validate(tuned(), ROOT))
    tune_dir = layout.TuneDir(tmp_path)
    answer.write(tune_dir, config, trials)
    assert tune_dir.figure.stat().st_size > 0
    return json.loads(tune_dir.best.read_text()), pd.read_csv(tune_dir.trials), tune_dir.summary.read_text()


def test_the_answer_with_its_evidence(tmp_path):
    trials = [
        trial(0, 0.001, -9.0, ["no", "yes"], action=racing.DROP, why="decided no: c0"),
        trial(1, 0.01, -5.0, ["yes", "yes"]),
    ]
    best, table, summary = written(tmp_path, trials)
    assert best["value"] == 0.01 and best["objective"] == -5.0
    assert (best["objective_ci_low"], best["objective_ci_high"]) == (-6.0, -4.0)
    assert best["constraints"] == {
        f"c{i}": {"verdict": "yes", "estimate": 0.0, "ci_low": -1.0, "ci_high": 1.0} for i in range(2)
    }
    assert list(table.columns) == answer.TRIAL_COLUMNS and len(table) == 2
    assert table["feasible"].tolist() == [False, True] and table["why_dropped"].iloc[0] == "decided no: c0"
    assert summary.splitlines()[2].startswith("Best: busy_loop_s = 0.01")


def test_it_says_plainly_when_nothing_beat_the_reference_or_the_budget_ran_out(tmp_path):
    best, _, summary = written(tmp_path, [trial(0, 0.01, -0.1, ["yes"], beats="undecided")])
    assert best["value"] == 0.01 and "No candidate beat the reference" in summary
    best, _, summary = written(
        tmp_path,
        [
            trial(0, 0.001, 3.0, ["no"], action=racing.DROP),
            trial(1, 0.1, -1.0, ["undecided"], action=racing.BUDGET, why="budget"),
        ],
    )
    assert best["value"] is None and best["budget_ran_out"] is True
    assert "No candidate met every constraint" in summary and "The budget ran out before a decision" in summary
    best, table, summary = written(tmp_path, [])
    assert best["value"] is None and table.empty and "No trial ran" in summary


def test_a_look_already_answered_is_judged_without_running_again(tmp_path):
    """Resuming: a trial whose look's questions.csv answers the repeats on disk is judged
    from it; one whose last table is older (fewer phases) runs to its look again."""
    from thermab.tune.run import finished_look

    trial_dir = layout.TuneDir(tmp_path).trial(0)
    run = trial_dir.run("sim", racing.ORDER)
    for phase in ("rep1-A", "rep1-B", "rep2-B", "rep2-A"):
        run.phase(phase).phase_json.parent.mkdir(parents=True)
        run.phase(phase).phase_json.write_text("{}")
    look_tables = run.look(2)
    look_tables.tables.mkdir(parents=True)
    rows = [
        {
            "question": "stall gaps no worse than 0.5",
            "arm": "B",
            "verdict": "yes",
            "estimate": 0.0,
            "ci_low": 0.0,
            "ci_high": 0.0,
            "level": 0.9,
            "phases_per_arm": 2,
        },
        {
            "question": "head vLLM CPU median lower",
            "arm": "B",
            "verdict": "undecided",
            "estimate": -150.0,
            "ci_low": -900.0,
            "ci_high": 600.0,
            "level": 0.9,
            "phases_per_arm": 2,
        },
    ]
    pd.DataFrame(rows).to_csv(look_tables.table("questions"), index=False)
    keys = [(0, None), (1, None)]
    look = finished_look(trial_dir, "sim", max_repeats=2, keys=keys, load={"users": 4})
    assert look.repeats == 2 and look.phases == 4 and look.objective["estimate"] == -150.0
    assert racing.judge(look, "lower", None, 2, 100)[0] == racing.CAP
    pd.DataFrame([{**row, "phases_per_arm": 1} for row in rows]).to_csv(look_tables.table("questions"), index=False)
    assert finished_look(trial_dir, "sim", max_repeats=2, keys=keys, load={"users": 4}) is None


def test_the_next_look_is_the_first_not_yet_decided(tmp_path):
    """Each invocation of a trial targets one look's checkpoint: the first look at or after
    the repeats on disk without its decision (an interrupted look runs again)."""
    from thermab.tune.run import next_look

    trial_dir = layout.TuneDir(tmp_path).trial(0)
    run = trial_dir.run("sim", racing.ORDER)
    assert next_look(trial_dir, "sim", 6, {"users": 4}) == 3
    for phase in ("rep1-A", "rep1-B", "rep2-B", "rep2-A", "rep3-A", "rep3-B"):
        run.phase(phase).phase_json.parent.mkdir(parents=True)
        run.phase(phase).phase_json.write_text("{}")
    assert next_look(trial_dir, "sim", 6, {"users": 4}) == 3
    run.look(3).decision.parent.mkdir(parents=True)
    run.look(3).decision.write_text("{}")
    assert next_look(trial_dir, "sim", 6, {"users": 4}) == 4


def test_in_a_run_of_levels_a_constraint_names_its_levels_and_the_objective_is_the_highest(tmp_path):
    """load.users a list: a constraint with ``users: [1]`` is asked at 1 user only, one
    without at every level, the objective at the last level of the run's order (by its label);
    a look reads the candidate's rows of questions.csv level by level (analysis.levels' order)."""
    from thermab.tune.run import finished_look

    raw = tuned(
        constraints=[
            {"metric": "probe decode speed", "kind": "non_inferior", "better": "higher", "margin_pct": 6, "users": [1]},
            {"metric": "stall gaps", "kind": "non_inferior", "better": "lower", "margin": 0.5},
        ]
    )
    raw["load"]["users"] = [1, 4]
    config = view(validate(raw, ROOT))
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump(racing.trial_config(config, 0.005), sort_keys=False))
    trial_questions = validate(read_file(path), ROOT)["questions"]  # the trial's config is valid
    assert trial_questions[-1] == {"metric": "cluster energy per token", "kind": "lower", "levels": ["4 users"]}
    keys = racing.answer_keys(config.tune, thaw(config.load))
    assert keys == [(0, "1 user"), (1, "1 user"), (1, "4 users"), (2, "4 users")]

    trial_dir = layout.TuneDir(tmp_path).trial(0)
    run = trial_dir.run("sim", racing.ORDER)
    for phase in ("rep1-A", "rep1-B", "rep2-B", "rep2-A"):
        for users in (1, 4):
            run.phase(f"{phase}-u{users}").phase_json.parent.mkdir(parents=True)
            run.phase(f"{phase}-u{users}").phase_json.write_text("{}")
    run.look(2).tables.mkdir(parents=True)
    words = [
        "probe decode speed no worse than 6 % (higher is better)",
        "stall gaps no worse than 0.5 (lower is better)",
        "stall gaps no worse than 0.5 (lower is better)",
        "cluster energy per token lower",
    ]
    verdicts = ["no", "yes", "yes", "yes"]
    rows = [
        {
            "question": q,
            "arm": "B",
            "verdict": v,
            "estimate": -0.1 * i,
            "ci_low": -1.0,
            "ci_high": 1.0,
            "level": 0.9,
            "phases_per_arm": 2,
            "load_level": label,
        }
        for i, (q, v, (_index, label)) in enumerate(zip(words, verdicts, keys, strict=False))
    ]
    pd.DataFrame(rows).to_csv(run.look(2).table("questions"), index=False)
    look = finished_look(trial_dir, "sim", max_repeats=2, keys=keys, load=thaw(config.load))
    assert look is not None and look.repeats == 2 and look.objective["estimate"] == -0.30000000000000004
    assert [row["question"] for row in look.constraints] == [
        "probe decode speed no worse than 6 % (higher is better) at 1 user",
        "stall gaps no worse than 0.5 (lower is better) at 1 user",
        "stall gaps no worse than 0.5 (lower is better) at 4 users",
    ]
    action, why = racing.judge(look, "lower", None, 2, 100)
    assert action == racing.DROP and "probe decode speed" in why and "at 1 user" in why
    assert finished_look(trial_dir, "sim", max_repeats=2, keys=keys[:3], load=config["load"]) is None  # another


# -- tune state from elsewhere --------------------------------------------------------------


def future_schema(storage: Path) -> None:
    tune_study.open_study(tune_view(), storage, reference=1.0)
    with sqlite3.connect(storage) as db:
        db.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")


@pytest.mark.parametrize("kind", ["random", "text", "directory", "fifo", "future-schema"])
def test_a_study_that_is_no_study_of_this_optuna_is_one_line_naming_it(tmp_path, kind):
    storage = layout.TuneDir(tmp_path).study
    storage.parent.mkdir(parents=True, exist_ok=True)
    if kind == "random":
        storage.write_bytes(bytes(range(256)) * 8)
    elif kind == "text":
        storage.write_text("SQLite format 3 but not really\n")
    elif kind == "directory":
        storage.mkdir()
    elif kind == "fifo":
        os.mkfifo(storage)
    else:
        future_schema(storage)
    with pytest.raises(UserError) as caught:
        tune_study.open_study(tune_view(), storage, reference=1.0)
    assert str(caught.value).startswith(f"{storage}: ") and "\n" not in str(caught.value)


def test_a_result_of_another_shape_is_named_not_a_traceback(tmp_path):
    tune = tune_view()
    storage = layout.TuneDir(tmp_path).study
    study = tune_study.open_study(tune, storage, reference=1.0)
    number, value = tune_study.ask(study, tune)
    tune_study.tell(study, trial(number, value, -1.0, ["yes"]))
    older = {k: v for k, v in study.trials[number].user_attrs["result"].items() if k != "why"}
    with sqlite3.connect(storage) as db:  # as an older thermab wrote it
        db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE key = 'result'", (json.dumps(older),))
    study = tune_study.open_study(tune, storage, reference=1.0)
    with pytest.raises(UserError, match=f"^{storage}: trial {number}'s result is not of this thermab's shape"):
        tune_study.results(study, storage)


@pytest.mark.parametrize("text, number", [("0x10", 16.0), ("(1)", 1.0), ("1_000", 1000.0), ("1e400", None)])
def test_a_reference_value_is_read_as_the_config_reads_it(text, number):
    from thermab.config import literal_number

    assert literal_number(text) == number
    raw = tuned()
    raw["setting"]["anchor"] = "busy_loop_s: float = [0-9a-fx().eE_+-]+"
    raw["arms"]["A"]["value"] = text
    if number is None:
        refused(raw, "'tune'")
    else:
        validate(raw, ROOT)


def test_a_trial_directory_left_by_another_search_is_never_taken_as_decided(tmp_path, monkeypatch):
    """With the study deleted and a trial-000/ left, the new study's first trial is refused
    naming that directory, before anything runs; nothing is reported decided."""
    from thermab.tune import run as tune_run

    monkeypatch.chdir(tmp_path)
    config = view(validate(tuned(), ROOT))
    tune_dir = layout.tune_dir(next(iter(config.clusters)))
    tune_dir.trial(0).path.mkdir(parents=True)
    with pytest.raises(UserError, match="left from another search"):
        tune_run.tune(config, snakefile=tmp_path / "never-run")
    assert not tune_dir.summary.exists()


@pytest.mark.parametrize("cores", ["0", "-1", "two"])
def test_cores_below_one_are_refused(tmp_path, capsys, cores):
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(tuned()))
    with pytest.raises(SystemExit) as caught:
        thermab_main(["tune", str(path), "--cores", cores])
    assert caught.value.code == 2 and "--cores" in capsys.readouterr().err
