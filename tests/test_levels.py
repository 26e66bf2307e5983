"""Levels of load (issue 29): ``load.users`` as a list of levels, refused on one line naming
the key when it is no list of distinct whole numbers within the bound; the phases of a run of
levels (each level's window its own phase, ascending in odd repeats and descending in even
ones); a level's slice of a run; the lowest level at which an answer changes; the trade-off
figure's points."""

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from thermab.analysis import levels, tradeoff
from thermab.analysis.model import RunData
from thermab.config import ConfigError, validate
from thermab.experiment import plan

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
BOUND = 1024  # the schema's bound on load.users
PROFILE = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def checked(users, **more):
    config = copy.deepcopy(RAW)
    config["load"]["users"] = users
    config.update(more)
    return validate(config, ROOT)


def refused(users, named="'load.users", **more) -> str:
    with pytest.raises(ConfigError) as caught:
        checked(users, **more)
    message = str(caught.value)
    assert "\n" not in message and named in message, message
    return message


def test_a_single_number_keeps_the_phase_ids_and_a_list_names_its_levels():
    assert plan.levels(4) is None
    assert [p.id for p in plan.phases("AB", 1)] == ["rep1-A", "rep1-B"]
    assert plan.levels([16, 1, 4]) == [1, 4, 16]
    assert [p.id for p in plan.phases("AB", 2, users=[1, 4])] == [
        "rep1-A-u1",
        "rep1-A-u4",
        "rep1-B-u1",
        "rep1-B-u4",
        "rep2-A-u4",
        "rep2-A-u1",
        "rep2-B-u4",
        "rep2-B-u1",
    ]
    # a job waits for the last window of the job before it
    assert plan.previous("AB", 1, "A", users=[1, 4]) == "baseline"
    assert plan.previous("AB", 2, "A", users=[1, 4]) == "rep1-B-u4"
    assert plan.previous("AB", 2, "B", users=[1, 4]) == "rep2-A-u1"


@given(st.lists(st.integers(1, BOUND), min_size=1, max_size=8, unique=True), st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_each_level_runs_first_as_often_as_last_over_a_pair_of_repeats(users, rep):
    odd, even = plan.level_order(users, 2 * rep - 1), plan.level_order(users, 2 * rep)
    assert odd == sorted(users) and even == sorted(users, reverse=True)
    for level in users:  # position balanced like an arm's: mean position the same for every level
        assert odd.index(level) + even.index(level) == len(users) - 1


def test_a_list_of_levels_is_accepted():
    assert checked([1, 4, 16])["load"]["users"] == [1, 4, 16]
    assert checked([4])["load"]["users"] == [4]


@pytest.mark.parametrize(
    "users", [[], [1, 1], [1, 2.5], [2.0], [True], [1, "4"], [0], [1, BOUND + 1], [None], [[1]], {"a": 1}, True, 4.0]
)
def test_a_bad_level_list_is_one_line_naming_load_users(users):
    refused(users)


@PROFILE
@given(
    st.lists(
        st.one_of(
            st.integers(-5, 2 * BOUND),
            st.floats(allow_nan=True, allow_infinity=True),
            st.booleans(),
            st.text(max_size=3),
            st.none(),
        ),
        max_size=6,
    )
)
def test_any_level_list_is_accepted_as_distinct_levels_or_refused_on_one_line(users):
    try:
        config = checked(users)
    except ConfigError as error:
        assert "\n" not in str(error) and "'load.users" in str(error)
        return
    levels_ = config["load"]["users"]
    assert levels_ and len(set(levels_)) == len(levels_)
    assert all(type(v) is int and 1 <= v <= BOUND for v in levels_)


def test_a_question_names_levels_of_the_run_only():
    asked = [{"metric": "output throughput", "kind": "higher", "users": [1]}]
    assert checked([1, 4], questions=asked)["questions"] == asked
    refused([1, 4], "'questions.0.users'", questions=[{**asked[0], "users": [2]}])
    refused(4, "'questions.0.users'", questions=[{**asked[0], "users": [1]}])
    refused([1, 4], "'questions.0.users", questions=[{**asked[0], "users": []}])
    assert levels.asked_at(asked + [{"metric": "stall gaps", "kind": "lower"}], 4) == [
        {"metric": "stall gaps", "kind": "lower"}
    ]


def test_until_decided_takes_levels_and_counts_a_repeat_by_all_of_them(tmp_path):
    assert checked([1, 4], until="decided", max_repeats=4)["until"] == "decided"
    from thermab.analysis import sequential

    def done(*ids):
        for phase_id in ids:
            (tmp_path / "phases" / phase_id).mkdir(parents=True, exist_ok=True)
            (tmp_path / "phases" / phase_id / "phase.json").write_text("{}")

    done("rep1-A-u1", "rep1-A-u4", "rep1-B-u1", "rep1-B-u4", "rep2-B-u4")
    assert sequential.completed_repeats(tmp_path, "AB", [1, 4]) == 1  # rep2-B's 1-user window is missing
    done("rep2-B-u1", "rep2-A-u4", "rep2-A-u1")
    assert sequential.completed_repeats(tmp_path, "AB", [1, 4]) == 2
    assert sequential.completed_repeats(tmp_path, "AB") == 0  # the phases of a run without levels
    assert sequential.resume_repeats(tmp_path, "AB", 4, [1, 4]) == 2


def _run(config, events, requests, validity):
    return RunData(Path("."), config, pd.DataFrame(events), None, requests, validity)


def test_a_level_keeps_its_own_marks_requests_and_reports_and_every_other_event():
    events = [
        {"t": 1, "event": "restart_start", "order": "AB", "rep": 1, "arm": "A"},
        {"t": 2, "event": "load_start", "order": "AB", "rep": 1, "arm": "A", "users": 1},
        {"t": 3, "event": "load_end", "order": "AB", "rep": 1, "arm": "A", "users": 1},
        {"t": 4, "event": "cooldown_end", "order": "AB", "rep": 1, "arm": "A", "users": 1},
        {"t": 5, "event": "load_start", "order": "AB", "rep": 1, "arm": "A", "users": 4},
        {"t": 6, "event": "load_end", "order": "AB", "rep": 1, "arm": "A", "users": 4},
    ]
    requests = pd.DataFrame({"users": pd.array([1, 4, 4], dtype="Int64"), "t_start": [2.1, 5.1, 5.2]})
    validity = {("AB", 1, "A", 1): {"users": 1}, ("AB", 1, "A", 4): {"users": 4}}
    run = _run({"users": [1, 4]}, events, requests, validity)
    four = levels.at_level(run, 4)
    assert list(four.events["t"]) == [1, 4, 5, 6]  # the cooldown before it kept, level 1's marks not
    assert list(four.requests["t_start"]) == [5.1, 5.2]
    assert four.validity == {("AB", 1, "A"): {"users": 4}} and four.plan["users"] == 4


def test_a_run_made_before_levels_is_its_one_level():
    events = [
        {"t": 2, "event": "load_start", "order": "AB", "rep": 1, "arm": "A"},
        {"t": 3, "event": "load_end", "order": "AB", "rep": 1, "arm": "A"},
    ]
    run = _run({"users": 4}, events, pd.DataFrame({"t_start": [2.5]}), {("AB", 1, "A", 4): {}})
    assert levels.of_run(run.plan) == [4] and levels.of_run({}) == [None]
    same = levels.at_level(run, 4)
    assert len(same.events) == 2 and len(same.requests) == 1 and list(same.validity) == [("AB", 1, "A")]
    table = levels.with_users(pd.DataFrame({"order": ["AB"], "rep": [1], "arm": ["A"], "n": [3]}), 4)
    assert list(table.columns) == ["order", "rep", "arm", "n", "users"]  # earlier columns where they were


def test_the_lowest_level_at_which_an_answer_changes():
    question = {"metric": "output throughput", "kind": "non_inferior", "better": "higher", "margin_pct": 5}
    words = "output throughput no worse than 5 % (higher is better)"
    answers = pd.DataFrame(
        {
            "question": [words, words + " (not yes: short load in rep1-B)", words],
            "kind": "non_inferior",
            "arm": "B",
            "users": [16, 1, 4],
            "verdict": ["no", "yes", "yes"],
        }
    )
    changes = levels.answer_changes(answers, [question])
    assert changes.loc[0, "changes_at"] == 16 and changes.loc[0, "verdicts"] == "1: yes, 4: yes, 16: no"
    same = levels.answer_changes(answers.assign(verdict="yes"), [question])
    assert pd.isna(same.loc[0, "changes_at"])


def test_tradeoff_points_are_each_levels_mean_with_its_t_interval():
    pooled = pd.DataFrame(
        {
            "metric": "output throughput",
            "arm": "A",
            "users": [1, 1, 4],
            "value": [10.0, 12.0, 40.0],
            "load_valid": [True, True, False],
        }
    )
    points = tradeoff.points(pooled, ["output throughput"]).set_index("users")
    assert points.loc[1, "mean"] == 11.0 and points.loc[1, "n"] == 2
    half = 12.706204736174705 * math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) × sd / √n
    assert points.loc[1, "ci_low"] == pytest.approx(11 - half) and points.loc[1, "ci_high"] == pytest.approx(11 + half)
    assert math.isnan(points.loc[4, "ci_low"]) and bool(points.loc[4, "short"]) and not bool(points.loc[1, "short"])


def test_the_tradeoff_figure_is_drawn_for_levels_and_for_one_level(tmp_path):
    config = {
        "cluster": "c",
        "head": "head",
        "timeline_zone": "TSOC",
        "arms": {"A": {"label": "stock"}, "B": {"label": "patched"}},
    }
    metrics = [name for name, _title, _unit in tradeoff.panels(config)][:-1]  # no energy: its panel says so
    pooled = pd.DataFrame(
        [
            {
                "metric": metric,
                "arm": arm,
                "users": users,
                "rep": rep,
                "load_valid": True,
                "value": 10.0 * users + (arm == "B") + rep,
            }
            for metric in metrics
            for arm in "AB"
            for users in (1, 4, 16)
            for rep in (1, 2)
        ]
    )
    colors = {"A": "#e66101", "B": "#5e3c99"}
    assert tradeoff.tradeoff_png(pooled, config, colors, tmp_path / "levels.png").stat().st_size > 0
    one = pooled[pooled["users"] == 4]
    assert tradeoff.tradeoff_png(one, config, colors, tmp_path / "one.png").stat().st_size > 0
