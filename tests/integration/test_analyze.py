"""The analysis end to end: the study's published chart data, and small synthetic runs."""

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from support.study_chart import CHART, STUDY_ARMS
from support.synthetic_run import PHASE_S, write_synthetic_run
from thermab.analysis import PHASE_TABLES, chart_import, model, run_analysis
from thermab.analysis.completeness import completeness
from thermab.analysis.questions import ANSWER_COLUMNS, QUESTION_COLUMNS
from thermab.layout import RunDir
from thermab.report import analyze, html_page, plots

# published: (stock mean, patched mean, stock max, patched max); maxima of the worker not published
PUBLISHED = {
    ("head", "TSOC"): (89.6, 80.5, 95, 85),
    ("head", "TS1P"): (89.6, 80.5, 95, 85),
    ("head", "TUNC"): (73.7, 71.2, 77, 75),
    ("head", "TGPU"): (69.3, 68.8, 71, 72),
    ("head", "TS0P"): (69.0, 67.2, 75, 71),
    ("worker", "TSOC"): (77.2, 77.6, None, None),
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    run_dir = chart_import.import_chart(
        CHART,
        tmp_path_factory.mktemp("study"),
        load_minutes=30,
        arms=STUDY_ARMS,
        setting="busy_loop_s",
        cluster="gx10-study",
    )
    return run_dir, analyze.analyze(run_dir)


@pytest.mark.parametrize("host, sensor", list(PUBLISHED))
def test_study_zone_table_is_reproduced(study, host, sensor):
    zones = study[1]["zones"].set_index(["arm", "host", "sensor"])
    stock_mean, patched_mean, stock_max, patched_max = PUBLISHED[host, sensor]
    assert zones.at[("A", host, sensor), "mean_c"] == pytest.approx(stock_mean, abs=0.3)
    assert zones.at[("B", host, sensor), "mean_c"] == pytest.approx(patched_mean, abs=0.3)
    if stock_max is not None:
        assert zones.at[("A", host, sensor), "max_c"] == pytest.approx(stock_max, abs=0.5)
        assert zones.at[("B", host, sensor), "max_c"] == pytest.approx(patched_max, abs=0.5)


def test_the_numbers_hold_no_words_and_the_tables_users_read_do(study):
    """analysis/ holds the numbers: variance without its verdicts, the answers without the
    acceptance check in words and with the adjustment as a code. tables/*.csv, which the
    report writes from them, have the word columns where questions.csv always had them, and
    the numbers read back and put in words give the same verdicts."""
    run_dir, tables = study
    files = RunDir(run_dir)
    variance, answers = (pd.read_parquet(files.frame(name)) for name in ("variance", "questions"))
    assert "verdict" not in variance.columns and "load_short" in variance.columns
    levels = ["users", "load_level"]
    assert list(answers.columns) == ANSWER_COLUMNS + levels
    assert list(pd.read_csv(files.table("questions")).columns) == QUESTION_COLUMNS + levels
    written = pd.read_csv(files.table("variance"))
    assert list(written.columns) == list(tables["variance"].columns)
    assert written["verdict"].str.contains(" vs ").sum() == (written["reference"].notna()).sum() > 0
    again = analyze.read_report(run_dir)
    assert again.tables["variance"]["verdict"].tolist() == written["verdict"].tolist()
    assert again.sample_intervals_s == run_analysis.compute(run_dir).sample_intervals_s != {}
    assert list(again.tables["completeness"]["host"].unique()) == ["head", "worker"]


def test_study_window_boundaries(study):
    """Windows [37.85, 67.85) and [107.42, 137.42) min hold 60 samples each (38.0–67.5 and
    107.52–137.02): no sample falls on a boundary, and the still-hot sample at 68.0 min
    (93.8 °C, after load_end) stays out."""
    run_dir, tables = study
    windows = tables["windows"]
    assert windows["load_start"].tolist() == pytest.approx([37.85 * 60, 107.42 * 60])
    assert windows["window_s"].tolist() == pytest.approx([1800, 1800])
    assert set(tables["zones"]["n"]) == {60}
    telemetry = pd.read_parquet(run_dir / "tidy" / "telemetry.parquet")
    first_after_end = telemetry[
        (telemetry["host"] == "head")
        & (telemetry["sensor"] == "TSOC")
        & (telemetry["t"] >= windows["load_end"].iloc[0])
    ].iloc[0]
    assert first_after_end["t"] == pytest.approx(68.0 * 60) and first_after_end["value"] == 93.8


def test_study_import_writes_the_contracts(study):
    run_dir = study[0]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["order"] == "AB" and run["reference_arm"] == "A"
    assert run["arms"] == {"A": {"label": "stock", "value": "1"}, "B": {"label": "patched", "value": "0.002"}}
    events = model.read_events(run_dir / "events.jsonl")
    loads = events[events["event"].isin(["load_start", "load_end"])]
    assert loads[["event", "arm"]].values.tolist() == [
        ["load_start", "A"],
        ["load_end", "A"],
        ["load_start", "B"],
        ["load_end", "B"],
    ]
    assert set(events["event"]) >= {"run_start", "baseline_start", "cooldown_end", "restart_start", "run_end"}
    assert not (run_dir / "tidy" / "requests.parquet").exists()


def test_study_thresholds(study):
    th = study[1]["thresholds"]
    head = th[(th["host"] == "head") & (th["sensor"] == "TSOC")].set_index(["arm", "threshold_c"])
    # 30 s chart points: 85 and 90 °C first at the sample 2.65 min after load start
    assert head.at[("A", 90.0), "reached_s"] == pytest.approx(2.65 * 60)
    assert head.at[("A", 92.0), "reached_s"] == pytest.approx(3.15 * 60)
    assert math.isnan(head.at[("A", 95.0), "reached_s"])
    assert head.loc["B", "samples_at_or_above"].sum() == 0


def test_study_without_requests_says_so(study):
    run_dir, tables = study
    assert tables["performance"]["requests_completed"].isna().all()
    assert "No request data" in (run_dir / "tables" / "performance.md").read_text()
    for name in ("thresholds", "zones", "cpu", "performance", "variance"):
        assert (run_dir / "tables" / f"{name}.csv").exists() and (run_dir / "tables" / f"{name}.md").exists()


def test_study_summary_and_verdict(study):
    run_dir, tables = study
    text = (run_dir / "summary.md").read_text()
    assert "| threshold | stock | patched |" in text
    assert "| TSOC | 89.5 °C | 94.7 °C | 80.4 °C | 84.6 °C | −9.1 °C | 60 / 60 |" in text
    assert "no request data in this run" in text
    assert "No load records in this run" in text and tables["validity"]["load_valid"].isna().all()
    variance = tables["variance"]
    diff = variance[(variance["metric"] == "head TSOC mean") & (variance["arm"] == "B")].iloc[0]
    assert diff["finding"] == "undefined" and "no claim" in diff["verdict"]


def test_figures_render_for_the_study(study):
    paths = plots.render_figures(run_analysis.compute(study[0]))
    names = {p.name for p in paths}
    assert names == {
        "timeline.png",
        "timeline.svg",
        "timeline.html",
        "cpu.png",
        "throughput.png",
        "time_to_threshold.png",
        "questions.png",
        "tradeoff.png",
        "latency.png",
    }  # no wake-up probes in the study: no wake-up figure
    assert all(p.stat().st_size > 1000 for p in paths)
    html = (study[0] / "figures" / "timeline.html").read_text()
    assert "<script src=" not in html and '"hovermode":"x unified"' in html


def test_wide_csv_import_matches_the_chart(tmp_path):
    chart = json.loads(CHART.read_text())
    head = pd.DataFrame(chart["head"])
    worker = pd.DataFrame(chart["workerTsoc"]).rename(columns={"t": "t_worker", "TSOC": "worker:TSOC"})
    # the worker's 30 s points are 1 s later than the head's: one table on the head's clock
    pd.concat([head, worker[["worker:TSOC"]]], axis=1).to_csv(tmp_path / "wide.csv", index=False)
    pd.DataFrame(chart["marks"]).to_csv(tmp_path / "marks.csv", index=False)
    run_dir = tmp_path / "run"
    assert (
        chart_import.main(
            [
                str(tmp_path / "wide.csv"),
                str(run_dir),
                "--marks",
                str(tmp_path / "marks.csv"),
                "--arm",
                "stock=1",
                "--arm",
                "patched=0.002",
                "--setting",
                "busy_loop_s",
            ]
        )
        == 0
    )
    zones = analyze.analyze(run_dir)["zones"].set_index(["arm", "host", "sensor"])
    assert zones.at[("A", "head", "TSOC"), "mean_c"] == pytest.approx(89.53, abs=0.01)
    assert zones.at[("B", "worker", "TSOC"), "mean_c"] == pytest.approx(77.6, abs=0.3)


def test_synthetic_run_with_retry_requests_and_cpu(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB", aborted_first=True)
    assert analyze.main([str(run_dir)]) == 0
    tables = {name: pd.read_csv(run_dir / "tables" / f"{name}.csv") for name in PHASE_TABLES}
    perf = tables["performance"].set_index("arm")
    assert perf.at["A", "window_s"] == PHASE_S  # the retry's window, not the aborted attempt's
    assert perf.at["A", "output_tok_s"] == pytest.approx(85.0, abs=1.5)
    assert perf.at["B", "probe_tok_s_median"] == pytest.approx(17.0)
    cpu = tables["cpu"].set_index(["arm", "host"])
    assert cpu.at[("A", "head"), "median_pct"] == pytest.approx(398, abs=2)
    assert cpu.at[("B", "worker"), "median_pct"] == 208
    assert "stock" in (run_dir / "summary.md").read_text()


def test_ab_and_ba_pooled_separate_the_order_effect(tmp_path):
    ab = write_synthetic_run(tmp_path / "AB", order="AB", reps=2, seed=1)
    ba = write_synthetic_run(tmp_path / "BA", order="BA", reps=2, seed=2)
    assert model.sibling_runs(ab) == [ba.resolve()]
    variance = analyze.analyze(ab, also=[ba])["variance"]
    row = variance[(variance["metric"] == "head TSOC mean") & (variance["arm"] == "B")].iloc[0]
    assert row["method"].startswith("OLS") and row["n"] == 4
    assert row["ci_low"] < -10 < row["ci_high"]
    assert row["finding"] == "real" and "Order (period) effect" in row["verdict"]


def write_sweep(tmp_path, labels, **extra):
    """A synthetic sweep of three arms (1, 0.1, 0.002), two repeats, each cooler and lighter on
    CPU than the one before, at about the same speed; ``extra``: write_synthetic_run's other keys."""
    arms = {
        arm: {"label": label, "value": value}
        for arm, label, value in zip("ABC", labels, ("1", "0.1", "0.002"), strict=True)
    }
    return write_synthetic_run(
        tmp_path / "ABC",
        order="ABC",
        arms=arms,
        reps=2,
        temperature={"A": 90.0, "B": 84.0, "C": 80.0},
        cpu={"A": 398, "B": 300, "C": 212},
        tok_s={"A": 85, "B": 86, "C": 86},
        **extra,
    )


def test_sweep_names_the_best_setting(tmp_path):
    run_dir = write_sweep(tmp_path, ("stock", "spin-100ms", "spin-2ms"), stalls={"C": 5})
    analyze.analyze(run_dir)
    text = (run_dir / "summary.md").read_text()
    assert "busy_loop_s = 0.1 (spin-100ms, arm B" in text
    result = run_analysis.compute(run_dir)
    path = plots.dose_response_png(result.pooled, result.run.plan, result.best, tmp_path / "dose.png")
    assert path.stat().st_size > 1000


# What a value axis may be measured in: a number on an axis says its unit, in brackets at the
# end of its label
UNITS = {
    "°C",
    "% of one core",
    "cores",
    "tok/s",
    "ms",
    "min",
    "W",
    "requests",
    "J/token",
    "s",
    "%",
    "gaps per phase",
    "% of the reference mean",
    "its value in each arm",
}


def _drawn_figures(monkeypatch) -> dict:
    """The figures render_figures saves (file name → the Figure), read as they are saved."""
    from matplotlib.figure import Figure

    drawn, save = {}, Figure.savefig

    def keep(figure, path, *args, **kwargs):
        drawn[Path(path).name] = figure
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return drawn


def _numbers_on(axis) -> bool:
    """Whether an axis is labelled with numbers (a value axis), not with names (arms, °C, p50)."""
    shown = [tick.get_text().replace("−", "-") for tick in axis.get_ticklabels() if tick.get_text()]
    try:
        return bool(shown) and all(math.isfinite(float(text)) for text in shown)
    except ValueError:
        return False


def test_every_figure_says_the_unit_of_each_value_axis(tmp_path, monkeypatch):
    """Every numeric axis of every figure of a sweep with power, requests and wake-up probes
    asked for names its unit; an axis of named ticks (arms, thresholds, percentiles) needs none."""
    run_dir = write_sweep(
        tmp_path, ("stock", "b", "c"), power={("head", "node"): {"A": 90, "B": 85, "C": 80, "idle": 50}}
    )
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "wakeup_gaps_s": [0.5, 2.0]}))
    drawn = _drawn_figures(monkeypatch)
    plots.render_figures(run_analysis.compute(run_dir))
    assert {"cpu.png", "throughput.png", "time_to_threshold.png", "tradeoff.png", "latency.png"} <= set(drawn)
    assert {"timeline.png", "wakeup.png", "dose_response.png"} <= set(drawn)
    for name, figure in drawn.items():
        for ax in figure.axes:
            if not ax.axison:
                continue
            for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
                if not axis.get_visible() or not _numbers_on(axis):
                    continue
                if (
                    axis is ax.xaxis
                    and not label
                    and any(other.get_shared_x_axes().joined(ax, other) for other in figure.axes if other is not ax)
                ):
                    continue  # a panel above another shares the bottom panel's time axis
                unit = re.search(r"\(([^()]+)\)$", " ".join(label.split()))
                assert unit and unit.group(1) in UNITS, f"{name}: axis label {label!r} names no unit"


def _covered(figure) -> list:
    """The markers of an axes that its own legend covers, as the figure is drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)  # drawn again as saved: the layout places the legends
    canvas.draw()
    covered = []
    for ax in figure.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(canvas.get_renderer())
        marked = [line for line in ax.get_lines() if line.get_marker() not in (None, "", "None")]
        points = [xy for line in marked for xy in line.get_transform().transform(line.get_xydata())]
        covered += [xy for xy in points if box.contains(*xy)]
    return covered


def test_no_legend_covers_a_data_point(tmp_path, monkeypatch):
    """No legend covers a marker: in every figure of a run, and in the time to threshold of
    phases that reach each threshold halfway through the window (a row of points across the
    middle of the axes, where a legend inside them would lie over one)."""
    run_dir = write_synthetic_run(tmp_path / "AB", reps=2, temperature={"A": 93.0, "B": 86.0})
    result = run_analysis.compute(run_dir)
    drawn = _drawn_figures(monkeypatch)
    plots.render_figures(result)
    assert all(not _covered(figure) for figure in drawn.values()), [n for n, f in drawn.items() if _covered(f)]
    tables = dict(result.tables)
    window_s = tables["windows"]["window_s"].max()
    thresholds = tables["thresholds"]
    tables["thresholds"] = thresholds.assign(reached_s=window_s * 0.54)  # the axes reach 1.08 windows
    colors = {"A": "red", "B": "blue"}
    plots.time_to_threshold_png(tables, result.run.plan, colors, tmp_path / "threshold.png")
    assert not _covered(drawn["threshold.png"])


def test_the_throughput_figure_plots_what_the_verdict_tests(tmp_path, monkeypatch):
    """The throughput panel's points are the in-window throughput of each phase (the numbers
    the verdicts pool), not the ended requests' throughput."""
    run_dir = write_synthetic_run(tmp_path / "AB", reps=2, tok_s={"A": 85.0, "B": 92.0})
    result = run_analysis.compute(run_dir)
    drawn = _drawn_figures(monkeypatch)
    plots.render_figures(result)
    ax = drawn["throughput.png"].axes[0]
    points = [line for line in ax.get_lines() if line.get_marker() == "o"]  # not the bars' caps
    plotted = sorted(round(float(y), 6) for line in points for y in line.get_ydata())
    performance = result.tables["performance"]
    assert plotted == sorted(round(float(v), 6) for v in performance["output_tok_s_in_window"])
    assert not set(plotted) & {round(float(v), 6) for v in performance["output_tok_s"]}
    # the margin's line: the verdict's bound about the verdict's reference (arm A's mean of those numbers)
    answers = result.tables["questions"]
    asked = answers[answers["metric"] == "output throughput"].iloc[0]
    reference = performance.loc[performance["arm"] == "A", "output_tok_s_in_window"].mean()
    dashed = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert dashed == [pytest.approx(reference - asked["margin"])]


def test_bursty_probe_and_half_open_loop_are_stated_not_measured(tmp_path):
    """The patched arm's loop holds 3.2 of 4 requests in flight and its probes' tokens came in
    two bursts each (255 tokens in 3 ms: 85,000 tok/s if divided): the summary and the report
    say both, show no decode speed for it, and no verdict compares one."""
    run_dir = write_synthetic_run(tmp_path / "AB", loop_share={"B": 0.8}, probe_arrivals={"B": 2})
    result = run_analysis.compute(run_dir)
    analyze.write_outputs(result)
    text = (run_dir / "summary.md").read_text()

    validity = text.split("## Load validity", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in validity.splitlines() if line.startswith("| AB")}
    assert "as configured" in rows["AB rep1-A (stock)"] and "4.00 of 4" in rows["AB rep1-A (stock)"]
    assert "**short**: 3.20 of 4 requests in flight" in rows["AB rep1-B (patched)"]
    assert "tokens arrived in 2 bursts" in rows["AB rep1-B (patched)"]

    probe_line = next(line for line in text.splitlines() if line.startswith("| single-stream probe"))
    assert "17.0 tok/s, n = 3 probes measurable" in probe_line
    assert "not measurable: tokens arrived in 2 bursts, n = 3 probes" in probe_line
    assert "85000" not in text and "| patched † |" in text

    verdicts = text.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    assert "probe decode speed" not in verdicts
    throughput = next(v for v in verdicts.splitlines() if v.startswith("- output throughput:"))
    assert throughput.endswith(
        "Built on phases whose load fell short of the configuration: AB rep1-B (see Load validity)."
    )

    perf = pd.read_csv(run_dir / "tables" / "performance.csv").set_index("arm")
    assert math.isnan(perf.at["B", "probe_tok_s_median"]) and perf.at["B", "probe_n"] == 0
    assert perf["load_valid"].tolist() == [True, False]
    for name in ("thresholds", "zones", "cpu"):
        table = pd.read_csv(run_dir / "tables" / f"{name}.csv")
        assert (table["load_valid"] == (table["arm"] == "A")).all(), name
    variance = result.tables["variance"]
    assert "probe decode speed" not in set(variance.loc[variance["arm"] == "B", "metric"])
    assert set(variance.loc[variance["arm"] == "B", "load_short"]) == {"AB rep1-B"}

    plots.render_figures(result)
    html_page.write_report(run_dir, run_dir / "report.html")
    page = (run_dir / "report.html").read_text()
    assert "<h2>Load validity</h2>" in page and "<strong>short</strong>: 3.20 of 4 requests in flight" in page


# -- runs written by other tools: only the contract's files ---------------------------------------

CONTRACT_REQUEST_COLUMNS = [
    "order",
    "rep",
    "arm",
    "kind",
    "user",
    "tag",
    "t_start",
    "t_first_token",
    "t_end",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ok",
    "error",
]


@pytest.mark.parametrize("run_json", [True, False])
def test_a_loop_not_closed_is_found_without_validity_json(tmp_path, run_json):
    """tidy/requests.parquet with only docs/design.md's columns and no phases/*/validity.json:
    the load of each phase is judged from the requests by the same rule, users from run.json or,
    without it, the load's distinct users."""
    run_dir = write_synthetic_run(tmp_path / "AB", loop_share={"B": 0.5})
    for report in run_dir.glob("phases/*/validity.json"):
        report.unlink()
    requests = pd.read_parquet(run_dir / "tidy/requests.parquet")[CONTRACT_REQUEST_COLUMNS]
    requests.to_parquet(run_dir / "tidy/requests.parquet")
    if not run_json:
        (run_dir / "run.json").unlink(missing_ok=True)
    result = run_analysis.compute(run_dir)
    validity = result.tables["validity"].set_index("arm")
    assert validity.at["A", "inflight_mean"] == pytest.approx(4.0, abs=0.01) and validity.at["A", "load_valid"]
    assert validity.at["B", "inflight_mean"] == pytest.approx(2.0, abs=0.05) and not validity.at["B", "load_valid"]
    assert validity.at["B", "shortfalls"].endswith("of 4 requests in flight")
    assert all(w.startswith("no validity.json: judged from tidy/requests.parquet") for w in validity["warnings"])
    variance = result.tables["variance"]
    assert set(variance.loc[variance["arm"] == "B", "load_short"]) == {"AB rep1-B"}


def test_a_written_validity_json_wins_over_the_requests(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB", loop_share={"B": 0.5})
    validity = run_analysis.compute(run_dir).tables["validity"]
    assert not validity["warnings"].str.contains("no validity.json").any()


def test_samples_that_are_not_finite_are_no_readings(tmp_path):
    """A file ingest did not write may hold NaN or ±inf: the tables leave them out."""
    run_dir = write_synthetic_run(tmp_path / "AB")
    path = run_dir / "tidy/telemetry.parquet"
    clean = pd.read_parquet(path)
    expected = run_analysis.compute(run_dir).tables["zones"]
    damaged = clean.copy()
    extra = damaged[damaged["sensor"] == "TSOC"].copy()
    extra["value"] = [math.inf, -math.inf, math.nan] * (len(extra) // 3) + [math.inf] * (len(extra) % 3)
    pd.concat([damaged, extra], ignore_index=True).to_parquet(path)
    zones = run_analysis.compute(run_dir).tables["zones"]
    pd.testing.assert_frame_equal(zones, expected)


def test_a_sample_given_twice_is_no_interval(tmp_path):
    """Every sample written twice (equal times): the completeness table keeps the run's
    spacing and the summary is written."""
    run_dir = write_synthetic_run(tmp_path / "AB")
    (run_dir / "run.json").unlink(missing_ok=True)  # no configured intervals: inferred from the samples
    path = run_dir / "tidy/telemetry.parquet"
    once = pd.read_parquet(path)
    pd.concat([once, once], ignore_index=True).to_parquet(path)
    result = run_analysis.compute(run_dir)
    analyze.write_outputs(result)
    table = completeness(result.run.telemetry, result.tables["windows"], ["head", "worker"])
    assert table.set_index(["host", "source"]).at[("head", "thermal"), "interval_s"] == pytest.approx(15.0)
    assert "## Telemetry completeness" in (run_dir / "summary.md").read_text()


def test_a_head_without_the_timeline_zone_is_told_which_zones_it_has(tmp_path):
    """An x86 head has no TSOC: the summary says so and names its zones, instead of a table
    of dashes."""
    run_dir = write_synthetic_run(tmp_path / "AB")
    path = run_dir / "tidy/telemetry.parquet"
    telemetry = pd.read_parquet(path)
    telemetry["sensor"] = telemetry["sensor"].replace({"TSOC": "x86_pkg_temp"})
    telemetry.to_parquet(path)
    result = run_analysis.compute(run_dir)
    analyze.write_outputs(result)
    section = (run_dir / "summary.md").read_text().split("## Time to reach", 1)[1].split("\n## ", 1)[0]
    assert "The head (head) has no zone TSOC (`analysis.timeline_zone`)" in section
    assert "its zones are TS0P, x86_pkg_temp" in section and "| 85 °C |" not in section
    plots.render_figures(result)


def test_any_value_in_run_json_is_analysed_or_named(tmp_path_factory):
    """Whatever a hand-edited or foreign run.json holds in the keys the analysis computes
    with, `analyze` answers with tables or with one line naming the file and key."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from thermab.errors import UserError
    from thermab.experiment import plan as plan_module

    template = write_synthetic_run(tmp_path_factory.mktemp("template") / "AB")
    for report in template.glob("phases/*/validity.json"):
        report.unlink()  # so that users, max_tokens, prompt_tokens and probe_n are used
    plan = json.loads((template / "run.json").read_text())
    keys = sorted(set(plan_module.CONFIG_KEYS) | {"trip_point_c", "configfiles", "cores", "overrides"})
    values = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 10**6),
        st.text(max_size=5),
        st.floats(allow_nan=True, allow_infinity=True),
        st.lists(st.one_of(st.none(), st.floats(), st.text(max_size=3)), max_size=3),
    )

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(key=st.sampled_from(keys), value=values)
    def check(key, value):
        (template / "run.json").write_text(json.dumps({**plan, key: value}))
        try:
            run_analysis.compute(template)
        except UserError as error:
            assert "\n" not in str(error) and f"key '{key}" in str(error)

    check()


def test_no_thresholds_asked_for(tmp_path):
    """`analysis.thresholds_c: []` is a valid config: the tables, summary and figures are
    written, and the summary says there was nothing to time."""
    run_dir = write_synthetic_run(tmp_path / "AB")
    plan = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**plan, "thresholds_c": []}))
    result = run_analysis.compute(run_dir)
    analyze.write_outputs(result)
    plots.render_figures(result)
    assert result.tables["thresholds"].empty
    assert "No threshold was asked for (`analysis.thresholds_c` is empty)." in (run_dir / "summary.md").read_text()
