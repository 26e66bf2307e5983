"""Energy over whole synthetic runs analysed as a run is (docs/design.md): the table, the
summary and its verdicts, the timeline's power panel and the fleet's energy; a run without
power, or whose hosts' totals leave out the CPU, says so."""

import pandas as pd
import pytest

from support.synthetic_run import PHASE_S, write_synthetic_run
from thermab.analysis import energy, run_analysis
from thermab.report import analyze, fleet, plots

POWER = {
    ("head", "package-0"): {"A": 60.0, "B": 50.0, "idle": 20.0},
    ("head", "package-0/core"): {"A": 30.0, "B": 20.0, "idle": 5.0},
    ("head", "dram-0"): {"A": 8.0, "B": 8.0, "idle": 3.0},
    ("head", "gpu0"): {"A": 300.0, "B": 290.0, "idle": 70.0},
    ("worker", "node"): {"A": 200.0, "B": 200.0, "idle": 100.0},
    ("worker", "package-0"): {"A": 50.0, "B": 50.0, "idle": 20.0},
}


def test_synthetic_run_energy_table_summary_and_verdicts(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB", reps=2, power=POWER)
    tables = analyze.analyze(run_dir)
    written = pd.read_csv(run_dir / "tables" / "energy.csv")
    # a table of phases ends with its level
    assert written.columns.tolist() == energy.ENERGY_COLUMNS + ["users", "load_level"]
    assert set(written["load_level"]) == {"4 users"}
    total = written[(written["host"] == "all") & (written["domain"] == "total")].set_index(["rep", "arm"])
    run = run_analysis.compute(run_dir).run
    windows = tables["windows"].set_index(["rep", "arm"])
    tokens = {
        (rep, arm): energy.tokens_in_window(
            run.requests[(run.requests["rep"] == rep) & (run.requests["arm"] == arm)], windows.loc[(rep, arm)]
        )
        for rep in (1, 2)
        for arm in "AB"
    }
    for rep in (1, 2):
        for arm, watts in (("A", 60 + 8 + 300 + 200), ("B", 50 + 8 + 290 + 200)):
            row = total.loc[(rep, arm)]
            assert row["mean_w"] == pytest.approx(watts)
            assert row["energy_j"] == pytest.approx(watts * PHASE_S)
            assert row["idle_w"] == pytest.approx(20 + 3 + 70 + 100)
            assert row["energy_above_idle_j"] == pytest.approx((watts - 193) * PHASE_S)
            assert row["output_tokens"] == pytest.approx(tokens[(rep, arm)])
            assert row["j_per_token"] == pytest.approx(watts * PHASE_S / tokens[(rep, arm)])
            assert row["j_per_token_above_idle"] == pytest.approx((watts - 193) * PHASE_S / tokens[(rep, arm)])
    variance = tables["variance"]
    row = variance[(variance["metric"] == energy.METRIC) & (variance["arm"] == "B")].iloc[0]
    assert row["unit"] == "J/token" and row["diff"] < 0 and row["finding"] == "real"
    summary = (run_dir / "summary.md").read_text()
    assert "## Energy under load" in summary
    assert "| cluster energy per output token |" in summary and "tok/J" in summary
    assert "head: dram-0 + gpu0 + package-0; worker: node" in summary
    assert "head: cpu + dram + gpu (holds cpu, gpu, memory); worker: node" in summary
    assert "leaves out the CPU" not in summary
    assert f"- {energy.METRIC}: patched vs stock" in summary


def test_runs_without_power_say_so(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB")
    analyze.analyze(run_dir)
    assert "there are no energy figures in this run (empty, not zero)" in (run_dir / "summary.md").read_text()
    assert "no energy in this run" in (run_dir / "tables" / "energy.md").read_text()


def test_timeline_power_panel_and_fleet_energy(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "AB", reps=2, power=POWER)
    analyze.analyze(run_dir)
    result = run_analysis.compute(run_dir)
    lines = plots._power_lines(result.run, 0.0)
    assert [(host, domain) for host, domain, _ in lines] == [
        ("head", "dram-0"),
        ("head", "gpu0"),
        ("head", "package-0"),
        ("worker", "node"),
    ]
    paths = plots.render_figures(result)
    html = (run_dir / "figures" / "timeline.html").read_text()
    assert "power (W)" in html and "worker node power" in html
    assert "power (W)" in (run_dir / "figures" / "timeline.svg").read_text()
    assert all(p.stat().st_size > 1000 for p in paths)
    table = fleet.fleet_table({"synthetic": run_dir})
    assert energy.METRIC in set(table["metric"])
    assert "| cluster | arm | label | cluster energy per token |" in fleet.fleet_markdown(table, "AB")


def test_the_summary_says_when_a_hosts_total_leaves_out_the_cpu(tmp_path):
    gpu_only = {
        ("head", "gpu0"): {"A": 40.0, "B": 38.0, "idle": 5.0},
        ("worker", "gpu0"): {"A": 35.0, "B": 35.0, "idle": 5.0},
    }
    run_dir = write_synthetic_run(tmp_path / "AB", reps=1, power=gpu_only)
    analyze.analyze(run_dir)
    summary = (run_dir / "summary.md").read_text()
    assert "**The J/token leaves out the CPU of head, worker**" in summary
    assert "Scope of each host's total: head: gpu (holds gpu); worker: gpu (holds gpu)." in summary
    written = pd.read_csv(run_dir / "tables" / "energy.csv")
    assert set(written.loc[written["host"] == "all", "scope"]) == {"head: gpu; worker: gpu"}
