"""Wake-up after idle: the median's interval (its coverage simulated), tables/wakeup.csv
from the wake-up probes' requests, and the config's refusal of a gap list it cannot run."""

import copy
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from support.paths import REPO as ROOT
from thermab import metric_names as names
from thermab.analysis import stats, wakeup
from thermab.analysis.model import Plan
from thermab.config import ConfigError, validate
from thermab.experiment import plan
from thermab.load.shapes import WAKEUP
from thermab.sim import restart


@pytest.mark.parametrize("n", [6, 9, 20, 50])
def test_the_medians_interval_covers_it_at_least_95_percent_of_the_time(n):
    rng = np.random.default_rng(n)
    true_median = np.log(2)  # of an exponential of mean 1: skewed, as latencies are
    covered = [
        low <= true_median <= high for _, low, high in map(wakeup.median_interval, rng.exponential(size=(3000, n)))
    ]
    assert np.mean(covered) >= 0.94  # 0.95 and the simulation's own spread


def test_too_few_probes_have_a_median_and_no_interval():
    assert wakeup.median_interval([3.0, 1.0, 2.0]) == (
        2.0,
        pytest.approx(np.nan, nan_ok=True),
        pytest.approx(np.nan, nan_ok=True),
    )
    assert np.isnan(wakeup.median_interval([])[0])


def test_the_table_has_a_row_per_arm_and_gap_of_the_successful_probes():
    rows = []
    for arm, wake in (("A", 0.0), ("B", 0.001)):
        for gap in (0.001, 0.1, 3.0):
            for i in range(6):
                paid = wake if gap > 0.002 else 0.0
                rows.append(
                    {
                        "arm": arm,
                        "kind": "wakeup",
                        "ok": True,
                        "gap_s": gap,
                        "t_start": 100.0 + i,
                        "t_first_token": 100.0 + i + 0.05 + paid + 0.0001 * i,
                        "first_step_s": 0.04 + paid,
                    }
                )
    rows.append({**rows[0], "kind": "load", "gap_s": np.nan})
    rows.append({**rows[0], "ok": False, "t_first_token": np.nan})
    table = wakeup.wakeup_table(pd.DataFrame(rows))
    assert list(table.columns) == wakeup.COLUMNS
    assert list(zip(table["arm"], table["gap_s"], table["n"], strict=True)) == [
        (arm, gap, 6) for arm in "AB" for gap in (0.001, 0.1, 3.0)
    ]
    b = table[table["arm"] == "B"].set_index("gap_s")
    assert b.loc[0.1, "ttft_s"] == pytest.approx(0.05125) and b.loc[0.001, "ttft_s"] == pytest.approx(0.05025)
    assert b.loc[0.1, "first_step_s"] == pytest.approx(0.041)
    assert (table["ttft_ci_low"] <= table["ttft_s"]).all() and (table["ttft_s"] <= table["ttft_ci_high"]).all()


def test_a_run_without_wakeup_probes_has_an_empty_table():
    assert wakeup.wakeup_table(None).empty
    assert list(wakeup.wakeup_table(pd.DataFrame({"kind": ["load"], "ok": [True]})).columns) == wakeup.COLUMNS


RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def with_gaps(gaps, n=5, load_s=60):
    raw = copy.deepcopy(RAW)
    raw.setdefault("load", {}).update(wakeup_gaps_s=gaps, wakeup_n=n)
    raw.setdefault("timings", {})["load_s"] = load_s
    return raw


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 100)), max_size=6),
    n=st.integers(1, 10),
)
def test_a_gap_list_is_taken_only_ascending_positive_and_within_the_phase(gaps, n):
    """Empty, unsorted, not finite or ≤ 0, or idling longer than the phase's load: one line
    naming the key; anything else is taken as written."""
    good = (
        bool(gaps)
        and all(math.isfinite(g) and g > 0 for g in gaps)
        and all(b > a for a, b in zip(gaps, gaps[1:], strict=False))
        and n * sum(gaps) <= 60
    )
    try:
        config = validate(with_gaps(gaps, n), ROOT)
    except ConfigError as error:
        assert not good and "load.wakeup_gaps_s" in str(error) and "\n" not in str(error)
    else:
        assert good and config["load"]["wakeup_gaps_s"] == gaps


def test_the_gap_errors_say_what_is_wrong():
    with pytest.raises(ConfigError, match=r"'load.wakeup_gaps_s': \[0.1, 0.01\] is not strictly ascending"):
        validate(with_gaps([0.1, 0.01]), ROOT)
    with pytest.raises(ConfigError, match=r"idle the server 52.5 s, longer than the phase's load"):
        validate(with_gaps([0.5, 10], n=5, load_s=50), ROOT)
    with pytest.raises(ConfigError, match=r"load.wakeup_gaps_s"):
        validate(with_gaps([]), ROOT)


def test_the_figure_draws_each_arm_against_the_gap_or_says_there_were_no_probes(tmp_path):
    from thermab.report import plots

    arms = {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0"}}
    config = Plan(plan.run_plan(cluster="sim", order="AB", repeats=1, arms=arms, setting="s", head="h", hosts=["h"]))
    colors = {"A": "tab:blue", "B": "tab:orange"}
    rows = [["A", gap, 6, 0.05, 0.049, 0.051, 0.04, 0.039, 0.041] for gap in (0.001, 0.1, 3.0)] + [
        ["B", gap, 6, 0.051, 0.05, 0.052, 0.041, np.nan, np.nan] for gap in (0.001, 0.1, 3.0)
    ]
    drawn = plots.wakeup_png(pd.DataFrame(rows, columns=wakeup.COLUMNS), config, colors, tmp_path / "w.png")
    empty = plots.wakeup_png(wakeup.wakeup_table(None), config, colors, tmp_path / "none.png")
    assert drawn.stat().st_size > 1000 and empty.stat().st_size > 1000


def test_each_phase_has_its_median_ttft_after_each_gap_and_questions_may_name_a_gap():
    from thermab import metric_names

    rows = [
        {
            "order": "AB",
            "rep": 1,
            "arm": arm,
            "kind": "wakeup",
            "ok": True,
            "gap_s": gap,
            "t_start": 0.0,
            "t_first_token": ttft,
        }
        for arm in "AB"
        for gap in (0.001, 0.1)
        for ttft in (0.05, 0.06, 0.07 if arm == "A" else 0.08)
    ]
    values = wakeup.phase_metrics(pd.DataFrame(rows)).set_index(["arm", "metric"])["value"]
    assert values[("B", "TTFT after 0.1 s idle")] == pytest.approx(0.06) and len(values) == 4
    assert metric_names.gap_of(metric_names.ttft_after(0.1)) == 0.1 and metric_names.gap_of("stall gaps") is None
    asked = [{"metric": "TTFT after 0.1 s idle", "kind": "non_inferior", "better": "lower", "margin": 0.005}]
    config = validate({**with_gaps([0.001, 0.1]), "questions": asked}, ROOT)
    assert config["questions"][0]["metric"] == "TTFT after 0.1 s idle"
    with pytest.raises(ConfigError, match="TTFT after 3 s idle"):
        validate({**with_gaps([0.001, 0.1]), "questions": [{**asked[0], "metric": "TTFT after 3 s idle"}]}, ROOT)
    assert wakeup.phase_metrics(None).empty


def test_a_run_plan_s_questions_on_gaps_and_rest_are_checked_against_what_it_ran():
    """run.json's questions name gaps and rest as a config's do: against the gaps and idle
    window it records, and where a plan lacks them (another tool's, an earlier thermab's)
    taken as its questions name them, never a traceback."""
    asked = [
        {"metric": "TTFT after 3 s idle", "kind": "non_inferior", "better": "lower", "margin": 0.005},
        {"metric": "head vLLM CPU median at rest", "kind": "lower"},
    ]
    arms = {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}}
    written = plan.run_plan(
        cluster="c", order="AB", repeats=1, arms=arms, setting="s", head="head", hosts=["head"], questions=asked
    )
    assert plan.plan_problems(written) == []
    assert plan.plan_problems({**written, "wakeup_gaps_s": [0.1, 3], "idle_s": 10}) == []
    (problem,) = plan.plan_problems({**written, "wakeup_gaps_s": [0.1], "idle_s": 10})
    assert "key 'questions.0.metric'" in problem and "unknown metric" in problem
    (problem,) = plan.plan_problems({**written, "wakeup_gaps_s": [3], "idle_s": 0})
    assert "key 'questions.1.metric'" in problem


def test_the_wake_up_penalty_recovers_a_wake_up_cost_that_the_raw_ttft_misses_at_the_restart_spread():
    """Simulated studies of 3 restarts an arm, each start drawing its step time as the
    simulated server does (``sim.restart.STEP_FACTOR_SD``, which moves every probe of the
    phase alike), the patched arm paying a known 1 ms to wake a reader after 10 ms idle: the
    raw comparison of TTFT after the gap rarely shows it; the contrast with the same start's
    back-to-back probes does, its interval covering the true cost."""
    rng = np.random.default_rng(7)
    base_s, cost_s, gap, studies, n = 0.040, 0.001, 0.01, 100, 5
    rows = []
    for study in range(studies):
        for rep in (1, 2, 3):
            for arm in "AB":
                factor = np.exp(rng.normal(0, restart.STEP_FACTOR_SD))
                t = 1000.0 * (study * 10 + rep) + (arm == "B") * 100
                for k in range(1 + 2 * n):
                    gap_s = np.nan if k <= n else gap
                    ttft = base_s * factor + (cost_s if arm == "B" and k > n else 0) + rng.normal(0, 1e-4)
                    rows.append(
                        {
                            "order": f"AB{study}",
                            "rep": rep,
                            "arm": arm,
                            "kind": WAKEUP,
                            "ok": True,
                            "gap_s": gap_s,
                            "t_start": t + k,
                            "t_first_token": t + k + ttft,
                            "first_step_s": 0.02 * factor,
                        }
                    )
    values = wakeup.phase_metrics(pd.DataFrame(rows))

    def intervals(metric):
        chosen = values[values["metric"] == metric]
        return [
            stats.welch_interval(study[study["arm"] == "A"]["value"], study[study["arm"] == "B"]["value"])
            for _, study in chosen.groupby("order")
        ]

    raw = intervals(names.ttft_after(gap))
    contrast = intervals(names.wakeup_penalty(gap))
    assert len(raw) == len(contrast) == studies
    assert np.mean([i["ci_low"] > 0 for i in raw]) < 0.5  # the restarts' spread hides it
    assert np.mean([i["ci_low"] > 0 for i in contrast]) > 0.9  # the contrast shows it
    covered = [i["ci_low"] <= cost_s * 1000 <= i["ci_high"] for i in contrast]  # the penalty is in ms
    assert np.mean(covered) >= 0.85  # 95 % intervals, 100 draws
