"""The study's published chart data (``thermab.sim.fit`` fits the simulated nodes to it) and
its two arms, as ``thermab.analysis.chart_import`` takes them."""

from support.paths import DATA

CHART = DATA / "seed-repro-chart-data.json"
STUDY_ARMS = {"stock": "1", "patched": "0.002"}  # label: busy_loop_s
