"""The simulated cluster tells the study's story (its zone model is the fit of the study's
chart data: integration/test_sim_fit.py).

- The default config as a whole (``snakemake --cores 1 all``, config/config.yaml as it is
  but for its ports, one run) reproduces the study's published numbers, in 30x compressed time, within the
  bounds below; checked on the tables the run writes.
- The busy_loop_s sweep (config/examples/sim-sweep.yaml, shorter phases, ports of its
  own) stalls only with the shortest spin and names the value that saves the most CPU
  without stalls.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from support.command_line import snakemake_command
from support.paths import REPO
from support.ports import free_ports
from support.sim_runs import own_ports
from thermab.analysis import metrics, model

# The study's published numbers (data/README.md), head node unless said.
STUDY_TSOC_MEAN = {"A": 89.6, "B": 80.5}  # stock, patched
STUDY_GAPS = {"TUNC": -2.5, "TGPU": -0.5, "TS0P": -1.8}  # patched − stock zone means
STUDY_CPU_RATIO = 212 / 398  # head vLLM CPU, patched / stock
# The bounds: stock reaches each threshold within this share of the load window
# (the study: 90 s, 2.3 min and 3.5 min of 30 min, 5 %, 8 % and 12 %).
THRESHOLD_SHARE = {85.0: 0.10, 90.0: 0.15, 92.0: 0.25}


def snakemake(workdir: Path, *args: str, configfiles=(), timeout: float = 1200) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, *args, configfiles=configfiles)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    (workdir / "snakemake.log").write_text(result.stdout + result.stderr)
    return result


# ---- the default config ------------------------------------------------------------


# The simulated GPU keeps its schedule (a step every 40 ms, times the start's step factor,
# sd 2.5 %: 23.3-25.0 steps/s measured, beside whole runs, CPU burners or a real vLLM) through
# host lags of up to 0.5 s. Where this machine itself stops for longer (a hypervisor's steal,
# measured as a freezer cgroup stopping the run 0.7 s in every 3.2 s: 19.5-20.6 steps/s, both
# nodes' TSOC 6.5-7.1 °C cooler), the twin runs slower and cooler than the cluster it stands for,
# and its run is no test of the calibration: the run is made again, once.
STARVED_STEPS_S = 0.85 * 1000 / 40


def default_tables(workdir: Path) -> dict:
    ports = workdir / "ports.yaml"  # the default cluster on ports of its own
    ports.write_text(yaml.safe_dump({"clusters": own_ports(*free_ports(2))}))
    result = snakemake(workdir, "all", configfiles=[REPO / "config/config.yaml", ports])
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = workdir / "results/sim/AB"
    tables = {
        name: pd.read_csv(run_dir / "tables" / f"{name}.csv")
        for name in ("zones", "cpu", "performance", "thresholds", "speed")
    }
    return {**tables, "run_dir": run_dir}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    run = default_tables(tmp_path_factory.mktemp("default"))
    steps = run["speed"].set_index("arm")["engine_steps_s"]
    if (steps < STARVED_STEPS_S).any():
        print(f"the machine held the simulated engine back ({steps.round(1).to_dict()} steps/s): run again")
        run = default_tables(tmp_path_factory.mktemp("default-again"))
    return run


def zone_means(run, host):
    zones = run["zones"]
    return zones[zones["host"] == host].set_index(["sensor", "arm"])["mean_c"]


def test_default_run_head_tsoc_means_are_the_studys(default_run):
    means = zone_means(default_run, "head")
    for arm, published in STUDY_TSOC_MEAN.items():
        assert means["TSOC", arm] == pytest.approx(published, abs=1.5), arm


def test_default_run_zone_gaps_are_the_studys(default_run):
    means = zone_means(default_run, "head")
    for zone, published in STUDY_GAPS.items():
        assert means[zone, "B"] - means[zone, "A"] == pytest.approx(published, abs=1.0), zone


def test_default_run_worker_is_the_same_in_both_arms(default_run):
    means = zone_means(default_run, "worker")
    assert abs(means["TSOC", "B"] - means["TSOC", "A"]) <= 0.5


def test_default_run_patched_head_uses_about_half_the_cpu_at_the_same_throughput(default_run):
    cpu = default_run["cpu"]
    head = cpu[cpu["host"] == "head"].set_index("arm")["median_pct"]
    assert head["B"] / head["A"] == pytest.approx(STUDY_CPU_RATIO, abs=0.1)
    # Each restart draws the drafter's acceptance (docs/simulation.md, restart variance): one
    # pair of phases shows the same speed on the engine's steps, which acceptance does not
    # move (the step-time factor alone: a ratio's sd 3.5 %), and the raw throughput only
    # within restart variance (a ratio's sd about 10 %: 3 sd either way).
    steps = default_run["speed"].set_index("arm")["engine_steps_s"]
    assert 0.9 <= steps["B"] / steps["A"] <= 1.15
    throughput = default_run["performance"].set_index("arm")["output_tok_s"]
    assert 0.7 <= throughput["B"] / throughput["A"] <= 1.4


def test_default_run_stock_heats_fast_and_patched_never_holds_85(default_run):
    thresholds = default_run["thresholds"]
    tsoc = thresholds[(thresholds["host"] == "head") & (thresholds["sensor"] == "TSOC")].set_index(
        ["arm", "threshold_c"]
    )
    window = default_run["performance"].set_index("arm")["window_s"]
    for threshold, share in THRESHOLD_SHARE.items():
        reached = tsoc.loc[("A", threshold), "reached_s"]
        assert reached <= share * window["A"], (threshold, reached)  # NaN (never reached) fails too
    # the study's patched phase touched 85 °C once (12.7 min) and never held it: no two
    # samples in a row at or above it
    run = model.load_run(default_run["run_dir"])
    window = metrics.load_windows(run.events).set_index("arm").loc["B"]
    [(_key, samples)] = run.telemetry.series(kind="thermal", sensor="TSOC", host="head")
    inside = samples["value"][(samples["t"] >= window["load_start"]) & (samples["t"] < window["load_end"])]
    hot = inside >= 85.0
    assert not (hot[1:] & hot[:-1]).any(), f"patched TSOC at or above 85 °C in consecutive samples: {inside[hot]}"


# ---- the sweep ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sweep")
    sweep = yaml.safe_load((REPO / "config/examples/sim-sweep.yaml").read_text())
    cluster = sweep["clusters"]["sim-sweep"]
    head, worker = free_ports(2)
    cluster["endpoint"] = f"http://127.0.0.1:{head}"
    for host in cluster["hosts"].values():
        host["server"]["start"] = host["server"]["start"].replace("18711", str(head)).replace("18712", str(worker))
    # shorter phases and requests than the example: still dozens of batch changes per phase.
    # Cooldowns long enough to reach 60 °C: a phase after the stock spin's, started hot after
    # a 6-s cap, once ran its head into the interlock (96.8 °C) as its load ended
    sweep["timings"].update(baseline_s=4, load_s=30, cooldown_below_c=60, cooldown_max_s=15)
    sweep["load"].update(max_tokens=120, prompt_tokens=600, probe_n=2, probe_tokens=64)
    config = workdir / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep))
    result = snakemake(workdir, "all", "--configfile", str(config))
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir / "results/sim-sweep/ABCD"


def test_sweep_stalls_only_with_the_shortest_spin(sweep_run):
    stalls = pd.read_csv(sweep_run / "tables/performance.csv").set_index("arm")["stall_gaps"]
    assert stalls["D"] > 0, "busy_loop_s 0.002 with the lost wake-up: streams wait for the 5-s re-check"
    assert (stalls[["A", "B", "C"]] == 0).all(), stalls.to_dict()


def test_sweep_names_the_value_that_saves_the_most_cpu_without_stalls(sweep_run):
    summary = (sweep_run / "summary.md").read_text()
    assert "Most CPU saved without extra stalls or throughput loss beyond variance: busy_loop_s = 0.01 " in summary
    assert (sweep_run / "figures/dose_response.png").stat().st_size > 0
