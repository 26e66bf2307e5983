"""thermab as a package: one owner per fact, installable as a wheel, and jobs that refuse
to run someone else's copy."""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from support.paths import REPO
from support.study_chart import CHART
from thermab import config, jobs
from thermab.analysis import TABLES
from thermab.experiment import plan
from thermab.load.runner import LoadSpec
from thermab.telemetry import agent, ingest, wall_poll


def test_the_schema_defaults_follow_the_agent_registry():
    intervals = config.load_schema()["properties"]["monitor"]["properties"]["intervals"]["properties"]
    # the agent's sources, and the controller's scrape of /metrics (the schema its one owner)
    assert set(intervals) == {source.name for source in agent.SOURCES} | {"server"}
    assert {source.name: intervals[source.name]["default"] for source in agent.SOURCES} == {
        source.name: source.default_interval_s for source in agent.SOURCES
    }
    # and the wall meters' file, which the controller's poller writes
    assert set(ingest.KIND_OF_FILE) == {source.name for source in agent.SOURCES} | {wall_poll.FILE}


def test_the_defaults_are_the_schema_defaults():
    """The schema owns every default: the plan's analysis settings and the load's read it."""
    schema = config.load_schema()["properties"]
    analysis, load = schema["analysis"]["properties"], schema["load"]["properties"]
    assert plan.DEFAULT_ANALYSIS == {key: spec["default"] for key, spec in analysis.items()}
    spec = LoadSpec(duration_s=60)
    for key in ("users", "max_tokens", "prompt_tokens", "probe", "probe_n", "probe_tokens"):
        assert getattr(spec, key) == load[key]["default"], key
    assert spec.stall_gap_s == analysis["stall_gap_s"]["default"]


def test_the_workflow_declares_the_tables_the_analysis_writes():
    """analyze declares analysis/'s files (NUMBERS) and no table, the report rule tables the
    tables' CSVs and Markdown, and each report rule reads analysis/'s files."""
    rules = REPO / "workflow" / "rules"
    analyze_rule, words, figures = ((rules / name).read_text() for name in ("analyze.smk", "words.smk", "figures.smk"))
    common = (rules / "common.smk").read_text()
    assert "tables(" not in analyze_rule and "**ANALYSIS_FILES" in analyze_rule
    assert 'tables("csv")' in words and 'tables("md")' in words and words.count("**ANALYSIS_FILES") == 3
    assert "**ANALYSIS_FILES" in figures
    assert "table=TABLES" in common and "from thermab.analysis import NUMBERS, TABLES" in common
    assert "for name in NUMBERS" in common
    assert TABLES[-2:] == ["variance", "questions"]


def test_a_job_stops_when_its_thermab_is_not_the_checkouts(monkeypatch, tmp_path):
    monkeypatch.setenv(jobs.CHECKOUT_ENV, str(tmp_path / "elsewhere" / "thermab"))
    with pytest.raises(SystemExit, match="not from the checkout"):
        jobs.check_checkout()
    monkeypatch.setenv(jobs.CHECKOUT_ENV, str(Path(jobs.__file__).parent))
    jobs.check_checkout()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install .`` (not editable) into a fresh venv that sees this interpreter's
    dependencies, so only thermab itself is built and installed."""
    where = tmp_path_factory.mktemp("wheel")
    env_dir = where / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    build = where / "src"
    shutil.copytree(
        REPO,
        build,
        ignore=shutil.ignore_patterns(
            ".git", ".thermab", "results", ".snakemake", "__pycache__", "*.egg-info", "build"
        ),
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(build)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, f"pip install . failed: {result.stderr[-2000:]}"
    shutil.rmtree(build)  # nothing may reach back into a source tree
    return python, env


def run_installed(installed, *args, cwd):
    python, env = installed
    return subprocess.run(
        [str(python), "-m", "thermab", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_a_non_editable_install_runs_from_another_directory(installed, tmp_path):
    python, env = installed
    where = subprocess.run(
        [str(python), "-c", "import thermab; print(thermab.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout
    assert "site-packages" in where and str(REPO) not in where
    (tmp_path / "my.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    checked = run_installed(installed, "check-config", "my.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    imported = run_installed(installed, "import-chart", str(CHART), "study", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    analysed = run_installed(installed, "analyze", "study", cwd=tmp_path)
    assert analysed.returncode == 0, analysed.stderr
    assert (tmp_path / "study" / "tables" / "zones.csv").exists() and (tmp_path / "study" / "summary.md").exists()
    from thermab.load.runner import LOCUSTFILE

    shipped = subprocess.run(
        [str(python), "-c", "from thermab.load.runner import LOCUSTFILE; print(LOCUSTFILE)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    assert "site-packages" in shipped and Path(shipped).read_bytes() == Path(str(LOCUSTFILE)).read_bytes()
