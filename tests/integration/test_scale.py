"""Figures that do not mislead: a per-arm comparison's value axis spans the reference mean ±
the question's margin and at least ± 5 % of that mean, so a 0.2 % gap never fills the plot;
margins are drawn; a run of one load level draws each metric's change in % once, not five
panels of one point; the report shows the timeline first."""

import math

import pandas as pd
import pytest
from hypothesis import given, strategies as st

from support.synthetic_run import plan_view, write_synthetic_run
from thermab.analysis.run_analysis import compute
from thermab.headless import plt
from thermab.report import plots, scale, tradeoff
from thermab.report.html_page import figure_order

CONFIG = plan_view(arms={"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0"}})


def test_a_gap_of_a_fifth_of_a_percent_stays_small():
    low, high = scale.held_limits([216.0, 216.35], 216.0)
    assert 0.35 / (high - low) < 0.2 / 10 * 1.01  # 0.2 % of a span of at least 10 %
    assert low <= 216.0 * 0.95 and high >= 216.0 * 1.05


def test_the_margin_and_every_value_are_on_the_axis():
    low, high = scale.held_limits([216.0, 214.0], 216.0, [-10.8])
    assert low < 216.0 - 10.8 and high > 216.0
    low, high = scale.held_limits([398.0, 212.0, 190.0, 420.0], 398.0)  # a large difference keeps its size
    assert low < 190.0 and high > 420.0 and (398.0 - 212.0) / (high - low) > 0.6
    assert scale.held_limits([1.0], math.nan) is None
    assert scale.held_limits([0.0, 0.0], 0.0) == (-1.16, 1.16)  # nothing to scale by: ± 1, padded


@given(
    reference=st.floats(-1e6, 1e6).filter(lambda v: abs(v) > 1e-3),
    values=st.lists(st.floats(-1e7, 1e7), max_size=6),
    offsets=st.lists(st.floats(-1e5, 1e5), max_size=2),
)
def test_the_limits_hold_the_data_the_margins_and_five_percent(reference, values, offsets):
    low, high = scale.held_limits(values, reference, offsets)
    for v in [*values, *(reference + o for o in offsets)]:
        assert low <= v <= high
    assert high - low >= 2 * abs(reference) * scale.FLOOR_PCT / 100 * (1 - 1e-9)


def test_a_per_arm_plot_is_held_to_the_margin_and_draws_it():
    frame = pd.DataFrame(
        {
            "arm": ["A", "A", "B", "B"],
            "order": "AB",
            "rep": [1, 2, 1, 2],
            "load_valid": True,
            "output_tok_s": [216.0, 216.1, 216.3, 216.4],
        }
    )
    fig, ax = plt.subplots()
    plots._per_phase_points(ax, frame, "output_tok_s", CONFIG, {"A": "red", "B": "blue"}, margins=([-10.8], "tok/s"))
    low, high = ax.get_ylim()
    plt.close(fig)
    assert low < 216.05 - 10.8 and high > 216.05 + 10.8 * 0.99
    assert [line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == "--"] == [216.05 - 10.8]


def test_one_load_level_draws_each_metrics_change_in_percent(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB", reps=2, tok_s={"A": 85.0, "B": 84.8})
    result = compute(run_dir)
    margins = scale.margin_offsets(result.tables["questions"], result.run.plan)
    variance = result.tables["variance"]
    stock = variance[(variance["arm"] == "A") & (variance["metric"] == "output throughput")]["mean"].iloc[0]
    assert margins["output throughput"] == [pytest.approx(-0.05 * stock)]
    assert "head TSOC mean" not in margins  # lower: bound 0
    rows = tradeoff.one_level_rows(variance, result.run.plan, margins).set_index("metric")
    assert math.isclose(rows.at["output throughput", "margins_pct"][0], -5.0)
    assert abs(rows.at["output throughput", "diff_pct"]) < 1  # the small gap, in %, on an axis of at least ± 5 %
    path = tradeoff.tradeoff_png(
        result.pooled,
        result.run.plan,
        {"A": "red", "B": "blue"},
        tmp_path / "t.png",
        result.tables["variance"],
        margins,
    )
    assert path.stat().st_size > 10_000


def test_the_report_shows_the_timeline_first():
    names = ["cpu.png", "questions.png", "throughput.png", "time_to_threshold.png", "timeline.png", "tradeoff.png"]
    ordered = sorted((plots.Path(n) for n in names), key=figure_order)
    assert ordered[0].name == "timeline.png" and ordered[-1].name == "tradeoff.png"
