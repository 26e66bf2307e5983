"""The whole workflow on the embedded simulated cluster, as a user runs it (tier 2).

One module-scoped AB run (short timings from tests/data/e2e-config.yaml) feeds most tests;
the BA run with two repeats and the Ctrl-C run come after it. Several minutes."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from support.command_line import run_thermab, snakemake_command
from support.paths import REPO
from support.processes import start_as_a_terminal_job
from support.sim_runs import CONFIGS, assert_clean, ports_file
from thermab import layout
from thermab.analysis import TABLES, energy, metrics
from thermab.experiment.events import EVENTS
from thermab.metric_names import PROBE_ACCEPTANCE_LENGTH
from thermab.sim import restart

COLUMNS = {  # each table begins with the columns its analysis defines (docs/design.md's first)
    "thresholds": metrics.THRESHOLD_COLUMNS,
    "zones": metrics.ZONE_COLUMNS,
    "cpu": metrics.CPU_COLUMNS,
    "performance": metrics.PERFORMANCE_COLUMNS,
    "energy": energy.ENERGY_COLUMNS,
}
# what a completed run of this config need not write: no idle window (timings.idle_s 0), no
# abort, and a restore or a note only where something was put back or happened
NOT_IN_EVERY_RUN = {"idle_start", "idle_end", "abort", "restored", "note"}


def snakemake(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, *args, configfiles=[*CONFIGS, ports_file(workdir)])
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    (workdir / f"snakemake-{len(list(workdir.glob('snakemake-*.log')))}.log").write_text(result.stdout + result.stderr)
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def ab_run(workdir):
    result = snakemake(workdir, "all")  # the module's first run in workdir: its output is snakemake-0.log
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir / "results/sim/AB"


def test_tables_have_the_contract_columns(ab_run):
    for name, columns in COLUMNS.items():
        table = pd.read_csv(ab_run / f"tables/{name}.csv")
        assert list(table.columns[: len(columns)]) == columns, name
        assert (ab_run / f"tables/{name}.md").exists()
    assert (ab_run / "tables/variance.csv").exists()


def test_stock_arm_burns_more_cpu_and_runs_hotter(ab_run):
    cpu = pd.read_csv(ab_run / "tables/cpu.csv").set_index(["host", "arm"])
    stock, patched = cpu.loc[("head", "A"), "median_pct"], cpu.loc[("head", "B"), "median_pct"]
    assert stock - patched >= 50, f"head vLLM CPU median: stock {stock} %, patched {patched} %"
    zones = pd.read_csv(ab_run / "tables/zones.csv")
    tsoc = zones[(zones["host"] == "head") & (zones["sensor"] == "TSOC")].set_index("arm")
    assert tsoc.loc["A", "max_c"] > tsoc.loc["B", "max_c"]
    # The first phase starts from idle, the second from the cooldown limit: over this test's
    # short windows the whole-window mean mostly measures that start, so compare the
    # second half of each window, where the zones have settled.
    telemetry = pd.read_parquet(ab_run / "tidy/telemetry.parquet")
    head_tsoc = telemetry[(telemetry["host"] == "head") & (telemetry["sensor"] == "TSOC")]
    events = [json.loads(line) for line in (ab_run / "events.jsonl").read_text().splitlines()]
    settled = {}
    for arm in "AB":
        start = next(e["t"] for e in events if e["event"] == "load_start" and e.get("arm") == arm)
        end = next(e["t"] for e in events if e["event"] == "load_end" and e.get("arm") == arm)
        half = head_tsoc[(head_tsoc["t"] >= (start + end) / 2) & (head_tsoc["t"] < end)]
        settled[arm] = half["value"].mean()
    assert settled["A"] > settled["B"] + 3, f"settled head TSOC: {settled}"


def test_load_was_the_intended_load(ab_run):
    requests = pd.read_parquet(ab_run / "tidy/requests.parquet")
    load = requests[requests["kind"] == "load"]
    assert load["ok"].all()
    assert (load["completion_tokens"] == 120).all(), "ignore_eos gives exactly max_tokens, counted from usage"
    assert (load["cached_tokens"].fillna(0) == 0).all(), "unique tags defeat the prefix cache"
    assert set(requests["kind"]) == {"load", "probe"}
    performance = pd.read_csv(ab_run / "tables/performance.csv")
    assert (performance["output_tok_s"] > 0).all() and (performance["probe_n"] == 2).all()


def test_the_probes_own_tokens_per_step_are_what_the_simulated_drafter_accepts(ab_run):
    """The server streams a chunk a step, so a probe's tokens after the first over its chunks
    after the first are the tokens its steps yielded: from one (no draft accepted) to one
    plus the drafter's five.  The phase's value (two probes of 64 tokens, some 26 steps each)
    lies near the drafter's expected 1 + Σₖ Πⱼ≤ₖ pⱼ (2.38 at 0.6), which each start draws
    around (a few %) and each probe's own drafts spread (about ± 0.3 a probe)."""
    requests = pd.read_parquet(ab_run / "tidy/requests.parquet")
    probes = requests[requests["kind"] == "probe"]
    per_probe = metrics.request_tokens_per_step(probes)
    assert per_probe.between(1, 1 + restart.MTP_DRAFT_TOKENS).all(), per_probe.tolist()
    per_phase = pd.read_csv(ab_run / "tables/performance.csv")["probe_tokens_per_step"]
    expected = restart.acceptance_length(restart.FIXED.acceptance)
    assert (per_phase - expected).abs().lt(0.8).all(), f"{per_phase.tolist()} against {expected:.2f}"
    variance = pd.read_csv(ab_run / "tables/variance.csv")
    assert set(variance.loc[variance["metric"] == PROBE_ACCEPTANCE_LENGTH, "arm"]) == {"A", "B"}


def test_events_and_tidy_telemetry(ab_run):
    names = [json.loads(line)["event"] for line in (ab_run / "events.jsonl").read_text().splitlines()]
    for name in [event for event in EVENTS if event not in NOT_IN_EVERY_RUN]:
        assert name in names, name
    assert "abort" not in names
    assert names.count("load_start") == 2
    telemetry = pd.read_parquet(ab_run / "tidy/telemetry.parquet")
    assert list(telemetry.columns) == ["t", "host", "kind", "sensor", "value"]
    assert {"thermal", "cpu", "freq"} <= set(telemetry["kind"])
    assert set(telemetry["host"]) == {"head", "worker"}


def test_energy_per_arm_from_the_simulated_power_tree(ab_run):
    energy = pd.read_csv(ab_run / "tables/energy.csv")
    domains = {"package-0", "package-0/core", "package-0/uncore", "dram-0", "hwmon/power_meter/node", "wall-0"}
    for host in ("head", "worker"):
        assert set(energy[energy["host"] == host]["domain"]) == domains, host
    assert energy.drop(columns=["idle_w", "energy_above_idle_j", "j_per_token_above_idle"]).notna().all().all()
    total = energy[(energy["host"] == "all") & (energy["domain"] == "total")].set_index("arm")
    onboard = energy[(energy["host"] == "all") & (energy["domain"] == "onboard")].set_index("arm")
    assert list(total.index) == ["A", "B"] == list(onboard.index)
    walls = energy[energy["domain"] == "wall-0"].groupby("arm")["mean_w"].sum()
    parts = energy[energy["domain"].isin(["package-0", "dram-0"])].groupby("arm")["mean_w"].sum()
    for arm in "AB":
        row = total.loc[arm]
        assert row["mean_w"] == pytest.approx(walls[arm]), "the total is the plugs at the wall"
        assert onboard.loc[arm, "mean_w"] == pytest.approx(parts[arm]), "on board: packages + DRAM, never the core"
        assert row["j_per_token"] > onboard.loc[arm, "j_per_token"], "the wall holds the supply's loss and more"
        assert row["energy_j"] == pytest.approx(row["mean_w"] * row["window_s"])
        assert 0 < row["idle_w"] < row["mean_w"], "the baseline is idle, the window under load"
        assert row["j_per_token"] == pytest.approx(row["energy_j"] / row["output_tokens"])
        assert 0 < row["j_per_token_above_idle"] < row["j_per_token"]
    # the simulated package holds its core and uncore: the sub-domains read less than it
    head = energy[energy["host"] == "head"].set_index(["arm", "domain"])["mean_w"]
    assert head[("A", "package-0/core")] + head[("A", "package-0/uncore")] < head[("A", "package-0")]
    telemetry = pd.read_parquet(ab_run / "tidy/telemetry.parquet")
    assert (telemetry[telemetry["kind"] == "power"]["value"] > 0).all()
    assert "## Energy under load" in (ab_run / "summary.md").read_text()
    variance = pd.read_csv(ab_run / "tables/variance.csv")
    assert (variance["metric"] == "cluster energy per token").sum() == 2


def test_report_figures_and_provenance(ab_run):
    assert "stock" in (ab_run / "summary.md").read_text()
    for name in (
        "figures/timeline.png",
        "figures/timeline.svg",
        "figures/timeline.html",
        "report.html",
        "provenance/dag.dot",
        "provenance/dag.mmd",
        "provenance/dag.svg",
        "provenance/config.yaml",
        "provenance/versions.json",
        "provenance/sha256.txt",
    ):
        assert (ab_run / name).stat().st_size > 0, name
    assert not (ab_run / "figures/wakeup.png").exists(), "no wake-up probes in this config: no wake-up figure"
    assert (
        "rule_phase" in (ab_run / "provenance/dag.dot").read_text()
        or "phase" in (ab_run / "provenance/dag.dot").read_text()
    )


def test_changed_analysis_settings_analyse_again(ab_run, workdir, tmp_path):
    """analysis.* reach analyze and the report rules through params: changed, `all` analyses again with
    them (nothing else runs), while run.json keeps the values the run was made with."""
    copy = tmp_path / "copy"  # the module's run stays as it is for the tests after this one
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns(".thermab"))
    run = copy / "results/sim/AB"
    made_with = (run / "run.json").read_text()
    changed = ("--config", "analysis={thresholds_c: [30, 31], timeline_zone: TS1P}")
    dry = snakemake(copy, "all", "-n", *changed)
    assert dry.returncode == 0, dry.stderr[-4000:]
    jobs = dry.stdout + dry.stderr
    rules = ("analyze", "tables", "summary", "evidence", "figures")
    assert all(f"rule {name}:" in jobs for name in rules), jobs[-4000:]
    assert "rule phase:" not in jobs and "rule ingest:" not in jobs, jobs[-4000:]
    assert "params" in jobs.lower()  # Snakemake names the changed params as the reason
    result = snakemake(copy, "all", *changed)
    assert result.returncode == 0, result.stderr[-4000:]
    assert set(pd.read_csv(run / "tables/thresholds.csv")["threshold_c"]) == {30, 31}
    assert set(pd.read_csv(ab_run / "tables/thresholds.csv")["threshold_c"]) == {85, 90, 92, 95}
    assert "head TS1P mean" in set(pd.read_csv(run / "tables/variance.csv")["metric"])
    assert (run / "run.json").read_text() == made_with
    again = snakemake(copy, "all", "-n", *changed)
    assert "Nothing to be done" in again.stdout + again.stderr


def planned_rules(output: str) -> set[str]:
    """The rules a dry run's output plans a job of."""
    return set(re.findall(r"^(?:local)?rule (\w+):$", output, re.MULTILINE))


def test_changed_wording_reruns_only_the_report_jobs(ab_run, workdir, tmp_path):
    """The tables users read, the words and the figures are made from analyze's files, and the
    report rules carry the report room's code as a param (Snakemake's code trigger sees a
    rule's `script:` file, not the modules it imports): in a checkout whose verdict words
    changed, a dry run of the finished run plans tables, summary, evidence and figures for
    their changed params, and neither analyze nor anything before it."""
    checkout = tmp_path / "checkout"
    keep = shutil.ignore_patterns("__pycache__")
    for name in ("workflow", "scripts", "config", "envs"):  # copy2: each file keeps its mtime
        shutil.copytree(REPO / name, checkout / name, symlinks=True, ignore=keep)
    shutil.copy2(REPO / "Snakefile", checkout / "Snakefile")

    def dry_run() -> str:
        command = snakemake_command(
            workdir, "all", "-n", configfiles=[*CONFIGS, ports_file(workdir)], snakefile=checkout / "Snakefile"
        )
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        return result.stdout + result.stderr

    # the copy as it is: its words are the run's (figures keeps the Snakefile's path, which it draws the DAG with)
    assert not planned_rules(dry_run()) & {"tables", "summary", "evidence", "analyze"}
    words = checkout / "workflow/thermab/report/summary.py"
    words.write_text(words.read_text().replace("no difference shown", "no difference seen"))
    output = dry_run()
    assert "analyze" not in planned_rules(output), output[-4000:]
    assert planned_rules(output) == {"tables", "summary", "evidence", "figures", "all"}, output[-4000:]
    assert "params" in output.lower()


def test_every_printed_command_continues_this_run(ab_run, workdir):
    """The command that decides the open questions is one, wherever the run prints it, and
    carries the config files and --cores the run was made with: planned (--dry-run) where
    the run was made, it goes on to this run's next phases and runs none of those done (a
    config other than the run's would change their params and run them again)."""
    said = {
        "evidence.md": (ab_run / "evidence.md").read_text(),
        "summary.md": (ab_run / "summary.md").read_text(),
        "status": run_thermab("status", ab_run).stdout,
        "plan": run_thermab("plan", ab_run).stdout,
        "the end of the run": (workdir / "snakemake-0.log").read_text(),
    }
    commands = {name: set(re.findall(r"`(snakemake [^`]*until=decided[^`]*)`", text)) for name, text in said.items()}
    assert all(commands.values()), commands
    assert len(set().union(*commands.values())) == 1, commands
    words = shlex.split(commands["status"].pop())
    assert words[words.index("--cores") + 1] == "1"
    assert words[words.index("--configfile") + 1 : words.index("--config")] == [*CONFIGS, ports_file(workdir)]
    dry = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *words[1:], "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
    )
    assert dry.returncode == 0, dry.stderr[-4000:]
    outputs = re.findall(r"^\s*output: (.*)$", dry.stdout + dry.stderr, re.MULTILINE)
    files = [path.strip() for line in outputs for path in line.split(",")]
    assert files and all(path.startswith("results/sim/AB/") for path in files), (files, dry.stdout[-3000:])
    assert any("/phases/rep2-" in path for path in files), files
    assert not any("/phases/rep1-" in path or "/phases/baseline" in path for path in files), files


def test_snakemake_lint_finds_nothing(tmp_path):
    """As the Snakemake workflows' CI does: the linter's advice is taken, or it fails here."""
    result = snakemake(tmp_path, "--lint")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_snakemake_report_holds_every_figure_and_table(ab_run, workdir):
    result = snakemake(workdir, "--report", "report.zip")
    assert result.returncode == 0, result.stderr[-4000:]
    with zipfile.ZipFile(workdir / "report.zip") as archive:
        names = "\n".join(archive.namelist())
    for name in [*layout.FIGURES, *(f"{table}.csv" for table in TABLES)]:
        if not name.endswith(".svg"):  # the PNG's twin is an output, not a report item
            assert name in names, name
    assert "wakeup.png" not in names  # no wake-up probes: the figure is neither drawn nor listed


def test_nothing_left_running_or_patched_after_success(ab_run, workdir):
    assert_clean(workdir, ab_run)


def test_ba_with_repeats_accumulates_beside_ab(ab_run, workdir):
    result = snakemake(workdir, "all", "--config", "order=BA", "repeats=2")
    assert result.returncode == 0, result.stderr[-4000:]
    ba = workdir / "results/sim/BA"
    phases = sorted(p.name for p in (ba / "phases").iterdir() if p.name != "baseline")
    assert phases == ["rep1-A", "rep1-B", "rep2-A", "rep2-B"]
    variance = pd.read_csv(ba / "tables/variance.csv")
    assert (variance["n"] == 2).any()
    dry = snakemake(workdir, "all", "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr, "the AB run stays complete"
    assert_clean(workdir, ba)
    # every run of the cluster pooled: AB (1 repeat) and BA (2), the order effect separated
    assert snakemake(workdir, "compare").returncode == 0
    pooled = pd.read_csv(workdir / "results/sim/compare/variance.csv")
    assert set(pooled["n"].dropna().astype(int)) == {3}
    assert pooled["period_effect"].notna().any()
    assert "results/sim/AB" in (workdir / "results/sim/compare/summary.md").read_text()


def test_interrupt_restores_and_stops_everything(ab_run, workdir):
    configs = [*CONFIGS, ports_file(workdir)]
    command = snakemake_command(workdir, "all", "--config", "order=AB", "repeats=2", configfiles=configs)
    # its own process group, so the SIGINT reaches Snakemake and its jobs as a Ctrl-C does
    process = start_as_a_terminal_job(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = workdir / "results/sim/AB/events.jsonl"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            lines = events.read_text().splitlines() if events.exists() else []
            if any('"load_start"' in line and '"rep": 2' in line for line in lines):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the second repeat never started")
        time.sleep(3)  # in the middle of a load, with the host patched or about to be
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert_clean(workdir, workdir / "results/sim/AB")
    names = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert "abort" in names[-8:], "the interruption is marked"
    # re-running the same command resumes (with the flag Snakemake asks for after an
    # interruption): the interrupted phase is redone, earlier ones kept
    finished = workdir / "results/sim/AB/phases/rep1-B/phase.json"
    finished_mtime = finished.stat().st_mtime
    result = snakemake(workdir, "all", "--config", "order=AB", "repeats=2", "--rerun-incomplete")
    assert result.returncode == 0, result.stderr[-4000:]
    assert finished.stat().st_mtime == finished_mtime
    starts = [
        e
        for e in map(json.loads, events.read_text().splitlines())
        if e["event"] == "load_start" and e.get("rep") == 2 and e.get("arm") == "A"
    ]
    assert len(starts) == 2, "rep2-A was redone after the interruption"
    assert_clean(workdir, workdir / "results/sim/AB")
