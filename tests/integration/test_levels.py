"""Levels of load: ``load.users`` as a list of levels (numbers, or mappings of a shape of
their own: tests/test_load_levels.py), refused on one line naming the key when it is no list of
distinct levels; the phases of a run of levels (each level's window its own phase, ascending
in odd repeats and the other way round in even ones); a level's slice of a run; the levels at
which an answer changes; the trade-off's points, table and figure; a synthetic run of mixed
shapes analysed whole."""

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from support.paths import REPO as ROOT
from support.synthetic_run import plan_view, write_synthetic_run
from thermab.analysis import levels, run_analysis
from thermab.analysis.model import Plan, RunData
from thermab.config import ConfigError, validate
from thermab.experiment import plan
from thermab.load_levels import Level
from thermab.report import analyze, tradeoff, traffic

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
    assert plan.levels({"users": 4}) is None
    assert [p.id for p in plan.phases("AB", 1)] == ["rep1-A", "rep1-B"]
    assert plan.levels({"users": [16, 1, 4]}) == [Level(16), Level(1), Level(4)]
    every = plan.levels({"users": [1, 4]})
    assert [p.id for p in plan.phases("AB", 2, every=every)] == [
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
    assert plan.previous("AB", 1, "A", every=every) == "baseline"
    assert plan.previous("AB", 2, "A", every=every) == "rep1-B-u4"
    assert plan.previous("AB", 2, "B", every=every) == "rep2-A-u1"


def test_levels_of_mixed_shapes_are_phases_of_their_own_in_the_run_order():
    every = plan.levels({"users": [4, {"rate": 0.5, "users": 4}, {"think_s": 2, "users": 1}]})
    assert [p.id for p in plan.job_phases(1, "A", every)] == ["rep1-A-u1-think2", "rep1-A-u4", "rep1-A-r0.5-u4"]
    assert [p.id for p in plan.job_phases(2, "A", every)] == ["rep2-A-r0.5-u4", "rep2-A-u4", "rep2-A-u1-think2"]
    assert plan.previous("AB", 2, "A", every=every) == "rep1-B-r0.5-u4"


@given(st.lists(st.integers(1, BOUND), min_size=1, max_size=8, unique=True), st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_each_level_runs_first_as_often_as_last_over_a_pair_of_repeats(users, rep):
    every = plan.levels({"users": users})
    odd, even = plan.level_order(every, 2 * rep - 1), plan.level_order(every, 2 * rep)
    assert [one.users for one in odd] == sorted(users) and [one.users for one in even] == sorted(users, reverse=True)
    for level in every:  # position balanced like an arm's: mean position the same for every level
        assert odd.index(level) + even.index(level) == len(users) - 1


def test_a_list_of_levels_is_accepted():
    assert checked([1, 4, 16])["load"]["users"] == [1, 4, 16]
    assert checked([4])["load"]["users"] == [4]
    mixed = [4, {"rate": 0.5, "users": 4}, {"think_s": 2, "users": 4}]
    assert checked(mixed)["load"]["users"] == mixed


@pytest.mark.parametrize(
    "users, named",
    [
        ([4, {"rate": 0.5, "think_s": 2, "users": 4}], "'load.users.1.think_s'"),
        ([4, {"rate": -1, "users": 4}], "'load.users.1.rate'"),
        ([4, {"rate": math.nan, "users": 4}], "'load.users.1.rate'"),
        ([4, {"think_s": math.inf, "users": 4}], "'load.users.1.think_s'"),
        ([{"rate": 1, "burstiness": 0, "users": 4}], "'load.users.0.burstiness'"),
        ([{"rate": 1, "cap": 4}], "'load.users.0.cap'"),
        ([4, {"users": 4}], "'load.users.1'"),
        ([{"rate": 1e9, "users": 4}], "'load.users.0.rate'"),
    ],
)
def test_a_level_of_a_shape_that_is_none_is_one_line_naming_its_key(users, named):
    refused(users, named)


@pytest.mark.parametrize(
    "users", [[], [1, 1], [1, 2.5], [2.0], [True], [1, "4"], [0], [1, BOUND + 1], [None], [[1]], {"a": 1}, True, 4.0]
)
def test_a_bad_level_list_is_one_line_naming_load_users(users):
    refused(users)


SCALARS = st.one_of(
    st.integers(-5, 2 * BOUND),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


@PROFILE
@given(
    st.lists(
        st.one_of(SCALARS, st.dictionaries(st.sampled_from(["users", "rate", "burstiness", "think_s", "x"]), SCALARS)),
        max_size=6,
    )
)
def test_any_level_list_is_accepted_as_distinct_levels_or_refused_on_one_line(users):
    try:
        config = checked(users)
    except ConfigError as error:
        assert "\n" not in str(error) and "'load.users" in str(error)
        return
    every = plan.levels(config["load"])
    assert every and len(set(every)) == len(every) == len({level.label for level in every})
    for level in every:
        assert type(level.users) is int and 1 <= level.users <= BOUND
        assert all(v is None or (type(v) in (int, float) and 0 < v < math.inf) for v in level.shape.values())


def test_a_question_names_levels_of_the_run_only():
    asked = [{"metric": "output throughput", "kind": "higher", "users": [1]}]
    assert checked([1, 4], questions=asked)["questions"] == asked
    refused([1, 4], "'questions.0.users'", questions=[{**asked[0], "users": [2]}])
    refused(4, "'questions.0.users'", questions=[{**asked[0], "users": [1]}])
    refused([1, 4], "'questions.0.users", questions=[{**asked[0], "users": []}])
    every = plan.levels({"users": [1, 4]})
    assert levels.asked_at(asked + [{"metric": "stall gaps", "kind": "lower"}], Level(4), every) == [
        {"metric": "stall gaps", "kind": "lower"}
    ]
    mixed = [4, {"rate": 0.5, "users": 4}]
    by_label = [{"metric": "output throughput", "kind": "higher", "levels": ["0.5 req/s ≤4", 0]}]
    assert checked(mixed, questions=by_label)["questions"] == by_label
    refused(mixed, "'questions.0.levels'", questions=[{**by_label[0], "levels": ["0.5 req/s <=4"]}])
    refused(mixed, "'questions.0.levels'", questions=[{**by_label[0], "levels": [2]}])
    refused(mixed, "'questions.0.levels'", questions=[{**by_label[0], "users": [4]}])


def test_until_decided_takes_levels_and_counts_a_repeat_by_all_of_them(tmp_path):
    assert checked([1, 4], until="decided", max_repeats=4)["until"] == "decided"
    from thermab.analysis import sequential

    def done(*ids):
        for phase_id in ids:
            (tmp_path / "phases" / phase_id).mkdir(parents=True, exist_ok=True)
            (tmp_path / "phases" / phase_id / "phase.json").write_text("{}")

    every = plan.levels({"users": [1, 4]})
    done("rep1-A-u1", "rep1-A-u4", "rep1-B-u1", "rep1-B-u4", "rep2-B-u4")
    assert sequential.completed_repeats(tmp_path, "AB", every) == 1  # rep2-B's 1-user window is missing
    done("rep2-B-u1", "rep2-A-u4", "rep2-A-u1")
    assert sequential.completed_repeats(tmp_path, "AB", every) == 2
    assert sequential.completed_repeats(tmp_path, "AB") == 0  # the phases of a run without levels
    assert sequential.resume_repeats(tmp_path, "AB", 4, every) == 3  # the first look that tests


def _run(config, events, requests, validity):
    return RunData(Path("."), plan_view(**config), pd.DataFrame(events), None, requests, validity)


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
    validity = {("AB", 1, "A", 1, None): {"users": 1}, ("AB", 1, "A", 4, None): {"users": 4}}
    run = _run({"users": [1, 4]}, events, requests, validity)
    four = levels.at_level(run, Level(4))
    assert list(four.events["t"]) == [1, 4, 5, 6]  # the cooldown before it kept, level 1's marks not
    assert list(four.requests["t_start"]) == [5.1, 5.2]
    assert four.validity == {("AB", 1, "A"): {"users": 4}} and four.plan["users"] == 4


def test_levels_of_equal_users_are_told_apart_by_their_label():
    rate = Level(4, rate=0.5)
    marks = {"order": "AB", "rep": 1, "arm": "A", "users": 4}
    events = [
        {"t": 2, "event": "load_start", **marks, "load_level": "4 users"},
        {"t": 3, "event": "load_end", **marks, "load_level": "4 users"},
        {"t": 4, "event": "cooldown_end", **marks, "load_level": "4 users"},
        {"t": 5, "event": "load_start", **marks, "load_level": rate.label},
        {"t": 6, "event": "load_end", **marks, "load_level": rate.label},
    ]
    requests = pd.DataFrame(
        {
            "users": pd.array([4, 4], dtype="Int64"),
            "load_level": pd.array(["4 users", rate.label], dtype="string"),
            "t_start": [2.1, 5.1],
        }
    )
    validity = {("AB", 1, "A", 4, "4 users"): {"n": 1}, ("AB", 1, "A", 4, rate.label): {"n": 2}}
    plan_ = {
        "users": [4, {"rate": 0.5, "users": 4}],
        "questions": [{"metric": "stall gaps", "kind": "lower", "levels": [1]}],
    }
    at_rate = levels.at_level(_run(plan_, events, requests, validity), rate)
    assert list(at_rate.events["t"]) == [4, 5, 6] and list(at_rate.requests["t_start"]) == [5.1]
    assert at_rate.validity == {("AB", 1, "A"): {"n": 2}}
    assert at_rate.plan["rate"] == 0.5 and at_rate.plan["load_level"] == rate.label and at_rate.plan["questions"]
    assert levels.at_level(_run(plan_, events, requests, validity), Level(4)).plan.questions == ()


def test_a_run_made_before_levels_is_its_one_level():
    events = [
        {"t": 2, "event": "load_start", "order": "AB", "rep": 1, "arm": "A"},
        {"t": 3, "event": "load_end", "order": "AB", "rep": 1, "arm": "A"},
    ]
    run = _run({"users": 4}, events, pd.DataFrame({"t_start": [2.5]}), {("AB", 1, "A", 4, None): {}})
    assert levels.of_run(run.plan) == [Level(4)] and levels.of_run(Plan({})) == [None]
    same = levels.at_level(run, Level(4))
    assert len(same.events) == 2 and len(same.requests) == 1 and list(same.validity) == [("AB", 1, "A")]
    table = levels.with_level(pd.DataFrame({"order": ["AB"], "rep": [1], "arm": ["A"], "n": [3]}), Level(4))
    assert list(table.columns) == ["order", "rep", "arm", "n", "users", "load_level"]  # earlier columns kept
    assert table.loc[0, "load_level"] == "4 users"
    validity = levels.with_level(pd.DataFrame({"rep": [1], "users": [4], "shape": ["closed"]}), Level(4))
    assert list(validity.columns) == ["rep", "users", "load_level", "shape"]  # beside the users it has


def test_the_levels_at_which_an_answer_changes():
    question = {"metric": "output throughput", "kind": "non_inferior", "better": "higher", "margin_pct": 5}
    words = "output throughput no worse than 5 % (higher is better)"
    order = ["1 user", "4 users", "0.5 req/s ≤4", "16 users"]
    answers = pd.DataFrame(
        {
            "question": [words, words + " (not yes: short load in rep1-B)", words, words],
            "kind": "non_inferior",
            "arm": "B",
            "load_level": ["16 users", "1 user", "0.5 req/s ≤4", "4 users"],
            "verdict": ["no", "yes", "undecided", "yes"],
        }
    )
    changes = levels.answer_changes(answers, [question], order)
    assert changes.loc[0, "changes_at"] == "0.5 req/s ≤4, 16 users"
    assert changes.loc[0, "verdicts"] == "1 user: yes, 4 users: yes, 0.5 req/s ≤4: undecided, 16 users: no"
    same = levels.answer_changes(answers.assign(verdict="yes"), [question], order)
    assert pd.isna(same.loc[0, "changes_at"])


def test_tradeoff_points_are_each_levels_mean_with_its_t_interval():
    pooled = pd.DataFrame(
        {
            "metric": "output throughput",
            "arm": "A",
            "users": [4, 1, 1],
            "load_level": ["0.5 req/s ≤4", "1 user", "1 user"],
            "value": [40.0, 10.0, 12.0],
            "load_valid": [False, True, True],
        }
    )
    points = traffic.points(pooled, ["output throughput"], ["1 user", "0.5 req/s ≤4"])
    assert list(points["load_level"]) == ["1 user", "0.5 req/s ≤4"] and list(points["position"]) == [0, 1]
    points = points.set_index("load_level")
    one, rate = points.loc["1 user"], points.loc["0.5 req/s ≤4"]
    assert one["mean"] == 11.0 and one["n"] == 2 and rate["users"] == 4
    half = 12.706204736174705 * math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) × sd / √n
    assert one["ci_low"] == pytest.approx(11 - half) and one["ci_high"] == pytest.approx(11 + half)
    assert math.isnan(rate["ci_low"]) and bool(rate["short"]) and not bool(one["short"])


def test_the_tradeoff_figure_is_drawn_for_levels_and_for_one_level(tmp_path):
    config = plan_view(
        cluster="c",
        analysis={"timeline_zone": "TSOC"},
        users=[1, 4, {"rate": 0.5, "users": 4}, 16],
        arms={"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0"}},
        slo={"ttft_ms": 500},
    )
    metrics = [name for name, title, _unit in traffic.panels(config) if "energy" not in title]  # its panel says so
    assert metrics.index("goodput") == metrics.index("output throughput") + 1  # beside throughput, with an SLO
    every = levels.of_run(config)
    pooled = pd.DataFrame(
        [
            {
                "metric": metric,
                "arm": arm,
                "users": level.users,
                "load_level": level.label,
                "rep": rep,
                "load_valid": True,
                "value": 10.0 * level.users + (arm == "B") + rep,
            }
            for metric in metrics
            for arm in "AB"
            for level in every
            for rep in (1, 2)
        ]
    )
    colors = {"A": "#e66101", "B": "#5e3c99"}
    assert tradeoff.tradeoff_png(pooled, config, colors, tmp_path / "levels.png").stat().st_size > 0
    one = pooled[pooled["users"] == 1]
    assert tradeoff.tradeoff_png(one, config, colors, tmp_path / "one.png").stat().st_size > 0


MIXED = [4, {"rate": 0.2, "users": 4}, {"think_s": 2, "users": 4}]
RATE = "0.2 req/s ≤4"


def test_a_run_of_mixed_shapes_is_analysed_level_by_level(tmp_path):
    """A synthetic run at a closed loop of 4, an open loop of 0.2 requests/s capped at 4 and a
    think-time loop of 4: every table carries each window's users and level, each window is
    judged by its own shape's rule, the patched arm is cooler except under the sparse rate, and
    the summary and the trade-off name the level at which that answer changes."""
    run_dir = write_synthetic_run(
        tmp_path / "AB", reps=2, levels=MIXED, level_temperature={RATE: {"A": 80.0, "B": 80.0}}
    )
    result = run_analysis.compute(run_dir)
    analyze.write_outputs(result)
    order = ["4 users", RATE, "4 users think 2 s"]
    for name in ("zones", "cpu", "performance", "validity", "variance", "questions"):
        table = pd.read_csv(run_dir / "tables" / f"{name}.csv")
        assert set(table["load_level"]) == set(order) and set(table["users"]) == {4}, name
        assert list(table.columns).index("load_level") == list(table.columns).index("users") + 1, name
    validity = pd.read_csv(run_dir / "tables" / "validity.csv").set_index("load_level")
    assert set(validity.loc[RATE, "shape"]) == {"rate"} and set(validity.loc["4 users", "shape"]) == {"closed"}
    assert set(validity.loc["4 users think 2 s", "shape"]) == {"think"}
    assert validity["load_valid"].all(), validity["shortfalls"]  # each by its own rule: none fell short
    answers = result.tables["questions"]
    cooler = answers[answers["metric"] == "head TSOC mean"].set_index("load_level")["verdict"]
    assert cooler["4 users"] == "yes" and cooler["4 users think 2 s"] == "yes" and cooler[RATE] != "yes"
    assert traffic.changed_levels(answers, result.run.plan) == [RATE, "4 users think 2 s"]
    summary = (run_dir / "summary.md").read_text()
    assert "## Questions across levels" in summary and "## The trade-off across traffic" in summary
    row = next(line for line in summary.splitlines() if line.startswith("| head TSOC mean lower"))
    assert f"| {RATE}, 4 users think 2 s |" in row, row
    for label in order:
        assert f"## At {label}" in summary
    shown = traffic.table(result.pooled, result.run.plan)
    assert list(shown["level"]) == [label for label in order for _arm in "AB"]
    assert shown["head TSOC mean"].str.fullmatch(r"\d+\.\d ± \d\.\d °C").all(), shown["head TSOC mean"]
    assert shown["latency: TTFT median (load)"].str.fullmatch(r"\d\.\d{3} ± \d\.\d{3} s").all()
    from thermab.report import plots  # matplotlib only where figures are drawn

    figures = {path.name for path in plots.render_figures(result)}
    assert "tradeoff.png" in figures and (run_dir / "figures" / "tradeoff.png").stat().st_size > 0


def test_the_wakeup_figure_draws_a_line_per_arm_and_level(tmp_path, monkeypatch):
    from thermab.report import plots  # matplotlib only where figures are drawn

    config = plan_view(cluster="c", users=MIXED, arms={"A": {"label": "stock"}, "B": {"label": "patched"}})
    order = ["4 users", RATE, "4 users think 2 s"]
    columns = [f"{name}{end}" for name in ("ttft", "first_step") for end in ("_s", "_ci_low", "_ci_high")]
    table = pd.DataFrame(
        [
            {
                "arm": arm,
                "gap_s": gap,
                "n": 6,
                "users": 4,
                "load_level": label,
                **dict.fromkeys(columns, 0.01 * gap + k),
            }
            for arm in "AB"
            for k, label in enumerate(order)
            for gap in (0.001, 0.1, 3.0)
        ]
    )
    drawn = []
    original = plots.plt.Axes.errorbar

    def recording(ax, x, *args, **kwargs):
        drawn.append((kwargs["label"], list(x)))
        return original(ax, x, *args, **kwargs)

    monkeypatch.setattr(plots.plt.Axes, "errorbar", recording)
    plots.wakeup_png(table, config, {"A": "#e66101", "B": "#5e3c99"}, tmp_path / "wakeup.png")
    assert {label for label, _x in drawn} == {f"{arm} after {level}" for arm in ("stock", "patched") for level in order}
    assert all(x == [0.001, 0.1, 3.0] for _label, x in drawn)  # each line one level's gaps, no zigzag through three
