"""Declared questions: their config validation (hypothesis), the verdict of each
kind, and questions.csv of synthetic runs: yes, no, undecided, no data, a short load and
unbalanced starts that withhold a yes, first in summary.md."""

import copy
import json
import math
import tempfile
from pathlib import Path

import matplotlib
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from support.paths import REPO as ROOT
from support.synthetic_run import write_synthetic_run
from thermab import config as thermab_config
from thermab.analysis import metrics, questions, washout
from thermab.analysis.model import Plan
from thermab.analysis.questions import NO, UNDECIDED, YES
from thermab.config import ConfigError, validate
from thermab.experiment import plan
from thermab.report import summary, verdict
from thermab.report.analyze import analyze

RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
# a bare working directory for the simulated roots (a checkout may link .thermab/ elsewhere)
WORKDIR = Path(tempfile.mkdtemp(prefix="thermab-questions-"))
KINDS = ["lower", "higher", "non_inferior", "equivalent"]
METRICS = ["head TSOC mean", "worker vLLM CPU median", "output throughput", "stall gaps", "nonsense", ""]
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-1000, 1000),
    st.just(100),
    st.just(0),
    st.booleans(),
    st.text(max_size=3),
)
question = st.fixed_dictionaries(
    {"metric": st.sampled_from(METRICS), "kind": st.one_of(st.sampled_from(KINDS), st.text(max_size=4))},
    optional={
        "better": st.sampled_from(["lower", "higher", "best"]),
        "by": numbers,
        "margin": numbers,
        "margin_pct": numbers,
    },
)


def with_questions(qs, **top) -> dict:
    raw = copy.deepcopy(RAW)
    raw.update(questions=qs, **top)
    return raw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(question, max_size=3), st.sampled_from(["repeats", "decided"]))
def test_a_question_is_valid_or_one_line_naming_it(qs, until):
    try:
        config = validate(with_questions(qs, until=until), WORKDIR)
    except ConfigError as error:
        assert "\n" not in str(error) and ("questions" in str(error) or "until" in str(error))
        return
    for q in config["questions"]:
        assert thermab_config.known_metric(config, q["metric"]) and q["metric"] not in ("nonsense", "")
        margins = [k for k in ("margin", "margin_pct") if k in q]
        if q["kind"] in ("non_inferior", "equivalent"):
            assert len(margins) == 1 and math.isfinite(q[margins[0]]) and q[margins[0]] >= 0
            assert q.get("margin_pct", 0) < 100
        else:
            assert not margins and q.get("by", 0) >= 0
        assert ("better" in q) == (q["kind"] == "non_inferior")
    assert until == "repeats" or config["questions"]


@pytest.mark.parametrize(
    "qs, top, says",
    [
        (
            [{"metric": "head TSOC mean", "kind": "lower"}, {"metric": "head foo", "kind": "lower"}],
            {},
            "questions.1.metric' (head foo lower): unknown metric",
        ),
        ([{"metric": "stall gaps", "kind": "equivalent", "margin": 1, "margin_pct": 2}], {}, "not both"),
        ([{"metric": "stall gaps", "kind": "non_inferior", "better": "lower", "margin": -1}], {}, "negative"),
        (
            [{"metric": "output throughput", "kind": "non_inferior", "better": "higher", "margin_pct": 100}],
            {},
            "100 % or more",
        ),
        ([], {"until": "decided"}, "'until': 'decided' needs at least one question"),
        (None, {"max_repeats": 101}, "'max_repeats': 101 is greater than the maximum of 100"),
    ],
)
def test_bad_questions_are_one_line_config_errors(qs, top, says):
    raw = with_questions(qs, **top) if qs is not None else {**copy.deepcopy(RAW), **top}
    with pytest.raises(ConfigError, match=None) as error:
        validate(raw, WORKDIR)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_the_default_questions_name_the_default_runs_metrics():
    config = validate(copy.deepcopy(RAW), WORKDIR)
    assert config["questions"] == thermab_config.default_questions("TSOC")
    assert [q["kind"] for q in config["questions"]] == [
        "lower",
        "lower",
        "non_inferior",
        "non_inferior",
        "lower",
        "non_inferior",
    ]
    # each default metric is one variance.csv has: the names metrics and energy write
    zones = metrics.pd.DataFrame(
        {"order": ["AB"], "rep": [1], "arm": ["A"], "host": ["head"], "sensor": ["TSOC"], "mean_c": [1.0]}
    )
    cpu = zones.assign(median_pct=1.0)
    perf = zones.assign(
        output_tok_s=1.0,
        output_tok_s_in_window=1.0,
        probe_tok_s_median=1.0,
        probe_tokens_per_step=2.4,
        stall_gaps=0.0,
        ttft_median_s=0.1,
    )
    written = set(metrics.phase_metrics(zones, cpu, perf, ["head"], "TSOC")["metric"]) | {"cluster energy per token"}
    assert {q["metric"] for q in config["questions"]} <= written


def test_run_json_carries_the_questions_and_an_older_one_gets_the_defaults(tmp_path):
    asked = [{"metric": "stall gaps", "kind": "equivalent", "margin": 1}]
    written = plan.run_plan(
        cluster="c", order="AB", repeats=1, arms={"A": {}, "B": {}}, setting="s", head="h", hosts=["h"], questions=asked
    )
    assert written["questions"] == asked
    run_dir = write_synthetic_run(tmp_path / "AB")
    run = json.loads((run_dir / "run.json").read_text())
    run.pop("questions", None)
    (run_dir / "run.json").write_text(json.dumps(run))
    answers = analyze(run_dir)["questions"]
    assert list(answers["metric"]) == [q["metric"] for q in thermab_config.default_questions()]
    assert list(answers.columns) == questions.QUESTION_COLUMNS + ["users", "load_level"]


@pytest.mark.parametrize(
    "kind, sign, margin, low, high, expected",
    [
        ("lower", -1, 0.0, -3.0, -1.0, YES),
        ("lower", -1, 0.0, 1.0, 2.0, NO),
        ("lower", -1, 0.0, -1.0, 1.0, UNDECIDED),
        ("lower", -1, 2.0, -3.0, -1.0, UNDECIDED),
        ("higher", 1, 0.0, 0.5, 1.0, YES),
        ("non_inferior", 1, 5.0, -4.0, 3.0, YES),
        ("non_inferior", 1, 5.0, -8.0, -6.0, NO),
        ("non_inferior", 1, 5.0, -6.0, 1.0, UNDECIDED),
        ("non_inferior", -1, 0.5, -0.2, 0.4, YES),
        ("non_inferior", -1, 0.5, 0.6, 2.0, NO),
        ("equivalent", 1, 1.0, -0.5, 0.9, YES),
        ("equivalent", 1, 1.0, 1.2, 3.0, NO),
        ("equivalent", 1, 1.0, -0.5, 1.5, UNDECIDED),
        ("lower", -1, 0.0, math.nan, math.nan, UNDECIDED),
    ],
)
def test_each_kind_reads_its_interval(kind, sign, margin, low, high, expected):
    assert questions.verdict(kind, sign, margin, low, high) == expected


def test_the_interval_is_statsmodels_ttost_at_the_margin():
    """TOST of statsmodels on two samples says yes exactly when the 90 % interval of the
    Welch estimate lies inside ± the margin."""
    import numpy as np
    import pandas as pd
    from statsmodels.stats.weightstats import ttost_ind

    from thermab.analysis import stats

    rng = np.random.default_rng(3)
    for _ in range(40):
        a, b = rng.normal(10, 1, 4), rng.normal(10 + rng.normal(0, 0.5), 1, 4)
        long = pd.DataFrame(
            {
                "order": "AB",
                "rep": range(8),
                "arm": ["A"] * 4 + ["B"] * 4,
                "metric": "m",
                "unit": "u",
                "value": np.r_[a, b],
            }
        )
        effect = stats.arm_effects(long, "A")[("m", "B")]
        low, high = questions.interval(effect["diff"], effect["se"], effect["df"], 0.05)
        p_value = ttost_ind(b, a, -1.0, 1.0, usevar="unequal")[0]
        assert (questions.verdict("equivalent", 1, 1.0, low, high) == YES) == (p_value < 0.05)


def test_a_decided_run_answers_and_comes_first_in_the_summary(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB", reps=3, tok_s={"A": 85.0, "B": 60.0})
    answers = analyze(run_dir)["questions"].set_index("metric")
    assert answers.at["head TSOC mean", "verdict"] == YES  # 80 vs 90 °C, balanced idle starts
    assert answers.at["head vLLM CPU median", "verdict"] == YES
    assert answers.at["output throughput", "verdict"] == NO  # −29 %, beyond the 5 % margin
    assert answers.at["output throughput", "margin"] == pytest.approx(85 * 0.05, rel=0.05)
    assert answers.at["cluster energy per token", "verdict"] == UNDECIDED
    assert answers.at["cluster energy per token", "note"] == "no data for cluster energy per token in this run"
    assert answers.at["cluster energy per token", "question"] == "cluster energy per token lower"  # words alone
    assert answers.at["output throughput", "unit"] == "tok/s" and answers.at["output throughput", "better"] == "higher"
    assert answers.at["head vLLM CPU median", "unit"] == "% of one core"
    summary = (run_dir / "summary.md").read_text()
    assert summary.index("## Questions") < summary.index("## Load validity")


def test_one_phase_per_arm_is_undecided_and_an_undecided_one_says_how_many_phases(tmp_path):
    one = analyze(write_synthetic_run(tmp_path / "one" / "AB"))["questions"]
    assert set(one["verdict"]) == {UNDECIDED} and set(one["phases_per_arm"]) <= {0, 1}
    same = analyze(write_synthetic_run(tmp_path / "same" / "AB", reps=3, temperature={"A": 90.0, "B": 90.0}))[
        "questions"
    ].set_index("metric")
    assert same.at["head TSOC mean", "verdict"] == UNDECIDED
    assert not same.at["head TSOC mean", "phases_needed"] <= 3  # many, or none at a zero distance
    # a 1-sd distance, one-sided 5 %, power 0.8: 13.1 phases per arm (t), so 14
    assert questions.phases_needed(1.0, 1.0) == 14
    assert questions.phases_needed(10.0, 1.0) == 2  # fewer would do: the fewest with a variance
    assert math.isnan(questions.phases_needed(0.0, 1.0)) and math.isnan(questions.phases_needed(1.0, math.nan))


def test_a_short_load_or_unbalanced_starts_never_give_yes(tmp_path):
    short = analyze(write_synthetic_run(tmp_path / "short" / "AB", reps=3, loop_share={"B": 0.8}))[
        "questions"
    ].set_index("metric")
    assert YES not in set(short["verdict"])
    assert short.at["head vLLM CPU median", "note"] == "not yes: short load in rep1-B, rep2-B, rep3-B"
    assert short.at["head vLLM CPU median", "question"] == "head vLLM CPU median lower"
    validity = metrics.pd.DataFrame({"arm": ["A", "B", "A", "B"], "start_c": [50.0, 53.5, 50.5, 53.0]})
    reasons = washout.unbalanced(validity, "A", 2.0)
    assert set(reasons) == {"B"} and "unbalanced starts" in reasons["B"]
    assert washout.unbalanced(validity, "A", 5.0) == {}
    starts = washout.arm_starts(validity, "A", 2.0).set_index("arm")
    assert (
        starts.at["B", "diff_c"] == pytest.approx(3.0) and not starts.at["B", "balanced"] and starts.at["A", "balanced"]
    )
    section = "\n".join(
        summary.start_balance_section(
            validity,
            Plan(
                {
                    "reference_arm": "A",
                    "start_balance_c": 2.0,
                    "arms": {"A": {"label": "stock"}, "B": {"label": "patched"}},
                }
            ),
        )
    )
    assert "| B (patched) | 2 | 53.2 (53.0–53.5) | +3.0 °C |" in section and "**unbalanced**" in section


def test_the_forest_plot_is_drawn_and_in_the_report(tmp_path):
    from thermab.analysis.run_analysis import compute
    from thermab.report import plots
    from thermab.report.analyze import write_outputs
    from thermab.report.html_page import write_report

    run_dir = write_synthetic_run(tmp_path / "AB", reps=2)
    result = compute(run_dir)
    write_outputs(result)
    (run_dir / "figures").mkdir()
    path = plots.questions_png(
        result.tables["questions"], result.run.plan, {"A": "red", "B": "blue"}, run_dir / "figures" / "questions.png"
    )
    assert path.stat().st_size > 10_000
    # the same figure as text: each panel's title the verdict line's label, its x axis in its unit
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        svg = plots.questions_png(result.tables["questions"], result.run.plan, {}, tmp_path / "q.svg").read_text()
    for unit in ("°C", "cores", "tok/s", "gaps per phase"):
        assert f"arm − reference ({unit})" in svg
    assert "% of one core)" not in svg and "no interval" not in svg
    assert all(f">{verdict.label(row)}<" in svg for row in result.tables["questions"].itertuples())
    write_report(run_dir, run_dir / "report.html")
    page = (run_dir / "report.html").read_text()
    assert 'alt="questions"' in page and page.index("<h2>Questions</h2>") < page.index("<h2>Load validity</h2>")
    assert questions.decisive_bounds({"kind": "non_inferior", "better": "higher"}, 2.0) == [-2.0]
    assert questions.decisive_bounds({"kind": "lower"}, 0.0) == [0.0]
    assert questions.decisive_bounds({"kind": "equivalent"}, 1.0) == [-1.0, 1.0]


def test_a_crossover_run_tests_at_its_looks_alpha_and_says_what_is_open(tmp_path):
    from thermab.analysis import sequential

    run_dir = write_synthetic_run(tmp_path / "AB", reps=4, tok_s={"A": 85.0, "B": 84.0})
    run = json.loads((run_dir / "run.json").read_text())
    run.update(until="decided", max_repeats=8)
    (run_dir / "run.json").write_text(json.dumps(run))
    answers = analyze(run_dir)["questions"]
    assert set(answers["level"].round(6)) == {round(1 - 2 * sequential.look_alphas("AB", 8)[4], 6)}
    assert set(answers["method"]) - {"no data"} == {"OLS arm + position, orders pooled"}  # orders: AB, BA per repeat
    summary = (run_dir / "summary.md").read_text()
    assert "Repeats until decided: 4 of at most 8 repeats" in summary and "still open: cluster energy" in summary


def test_validity_shows_each_phases_start_and_idle_power(tmp_path):
    power = {("head", "package-0"): {"A": 60.0, "B": 40.0, "idle": 12.0}}
    run_dir = write_synthetic_run(tmp_path / "AB", reps=2, power=power)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["event"] == "load_start"]
    marks = [
        {"t": e["t"] - 5, "event": "restart_start", "order": e["order"], "rep": e["rep"], "arm": e["arm"]}
        for e in starts
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events + marks))
    validity = analyze(run_dir)["validity"]
    assert validity["start_c"].between(49, 51).all()  # idle before every load, not the load's own heat
    assert validity["cooldown_before"].iloc[0] == washout.FIRST
    assert validity["idle_w_before"].notna().all()
    text = (run_dir / "summary.md").read_text()
    assert (
        "## Balanced starts" in text and "**unbalanced**" not in text.split("## Balanced starts")[1].split("\n## ")[0]
    )
