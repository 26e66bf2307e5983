"""The interactive timeline renders in a real headless Chromium (skips without one)."""

import shutil
import subprocess

import pytest

from support.study_chart import CHART, STUDY_ARMS
from thermab.analysis import chart_import
from thermab.analysis.run_analysis import compute
from thermab.report import plots
from thermab.report.analyze import analyze

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: apt-get install chromium to render the HTML timeline")
def test_timeline_html_renders_with_every_zone(tmp_path):
    run_dir = chart_import.import_chart(
        CHART, tmp_path / "study", load_minutes=30, arms=STUDY_ARMS, cluster="gx10", setting="busy_loop_s"
    )
    analyze(run_dir)
    plots.render_figures(compute(run_dir))
    page = run_dir / "figures" / "timeline.html"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    assert 'class="main-svg"' in dom, "plotly drew the figure (offline: plotly.js is inline)"
    for zone in ("TSOC", "TS1P", "TGPU", "TUNC", "TS0P"):
        assert zone in dom
