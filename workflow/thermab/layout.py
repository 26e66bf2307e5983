"""Where every file of a run lives (docs/design.md, "Stages and their files"): the one
owner of the paths under ``results/``.

The rules build their ``input:``/``output:``/``log:`` from it with the wildcards left in
(``RunDir(RUN_PATTERN).preflight`` is ``results/{cluster}/{order}/preflight.json``), the
jobs and the package with a real run directory, so a rule and the code it calls can never
name two different files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESULTS = "results"
RUN_PATTERN = f"{RESULTS}/{{cluster}}/{{order}}"  # a run directory, as the rules name it
PHASE_PATTERN = "rep{rep}-{arm}"  # plan.Phase.id with the wildcards left in


def phase_id(rep, arm, level_slug: str | None = None) -> str:
    """A phase's id: ``rep{rep}-{arm}``, and in a run whose load.users is a list of levels the
    level's slug after it (``load_levels.Level.slug``): each level's window its own phase
    directory, e.g. rep1-A-u16, rep1-A-r0.5-u4 (docs/design.md, "Levels of load")."""
    return PHASE_PATTERN.format(rep=rep, arm=arm) + ("" if level_slug is None else f"-{level_slug}")


BASELINE = "baseline"  # the idle phase's directory under phases/
SESSION_FILE = "session.json"  # restore finds the runs to put back by it

# The figures of a run (report/plots.py draws them): always these, for a run with wake-up
# probes (load.wakeup_gaps_s) also WAKEUP_FIGURES, and for a sweep of more than two arms also
# SWEEP_FIGURES: a figure the run can have no data for is not drawn. The config tells which
# before the run (the report rule declares them) and run.json after it (plots draws them).
FIGURES = (
    "timeline.png",
    "timeline.svg",
    "timeline.html",
    "cpu.png",
    "throughput.png",
    "time_to_threshold.png",
    "questions.png",
    "tradeoff.png",
    "latency.png",
)
WAKEUP_FIGURES = ("wakeup.png",)
SWEEP_FIGURES = ("dose_response.png",)


def figures(arms_in_order: int, wakeup: bool = False) -> tuple[str, ...]:
    """The figure names a run with this many distinct arms in its order gets, ``wakeup``:
    whether it makes wake-up probes.  In the order the reports show them: the timeline first."""
    return FIGURES + (WAKEUP_FIGURES if wakeup else ()) + (SWEEP_FIGURES if arms_in_order > 2 else ())


@dataclass(frozen=True)
class PhaseDir:
    """``phases/{phase}/``: what one phase (or the baseline) writes."""

    path: Path

    @property
    def phase_json(self) -> Path:
        return self.path / "phase.json"

    @property
    def requests(self) -> Path:  # the load's requests, one row each (tidy/requests.parquet's parts)
        return self.path / "requests.parquet"

    @property
    def records(self) -> Path:  # the locustfile's raw records, kept when the phase fails
        return self.path / "requests.jsonl"

    @property
    def marks(self) -> Path:  # the load's own marks (load_start, probe_*, load_end)
        return self.path / "load_events.jsonl"

    @property
    def validity(self) -> Path:
        return self.path / "validity.json"

    @property
    def latency(self) -> Path:  # the window's latency in vllm bench serve's keys, with its ITL sketch
        return self.path / "latency.json"

    @property
    def extra_body(self) -> Path:  # load.extra_body, written for the locustfile (not on its command line)
        return self.path / "extra_body.json"

    @property
    def server_metrics(self) -> Path:  # the endpoint's /metrics scraped during the load
        return self.path / "server.csv"


@dataclass(frozen=True)
class RunDir:
    """``results/{cluster}/{order}/`` (or any run directory, an imported one included)."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def preflight(self) -> Path:
        return self.path / "preflight.json"

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def session(self) -> Path:  # what the guardian needs to rebuild the run
        return self.path / SESSION_FILE

    def is_run(self) -> bool:
        """Whether a run has begun here: the first file of each a run writes (the session its
        preflight starts with, its logs, events, plan), or an imported run's plan."""
        return any(path.exists() for path in (self.session, self.logs, self.events, self.run_json))

    @property
    def run_id(self) -> Path:  # the run's id, made once: its leases on the hosts name it
        return self.path / "run-id"

    @property
    def monitor(self) -> Path:
        return self.path / "monitor"

    def host_monitor(self, host: str) -> Path:  # the agent logs pulled from a host
        return self.monitor / host

    @property
    def status(self) -> Path:  # where the run stands, rewritten every few seconds of a load
        return self.path / "status.json"

    @property
    def started(self) -> Path:
        return self.monitor / "started.json"

    @property
    def stopped(self) -> Path:
        return self.monitor / "stopped.json"

    @property
    def phases(self) -> Path:
        return self.path / "phases"

    def phase(self, phase_id: str) -> PhaseDir:
        return PhaseDir(self.phases / phase_id)

    def phase_log(self, phase_id: str) -> Path:  # one per phase job (its levels share it)
        return self.log(f"{phase_id}.log")

    def locust_log(self, phase_id: str) -> Path:  # one per load window
        return self.log(f"{phase_id}.locust.log")

    @property
    def tidy_telemetry(self) -> Path:
        return self.path / "tidy" / "telemetry.parquet"

    @property
    def tidy_requests(self) -> Path:
        return self.path / "tidy" / "requests.parquet"

    @property
    def ingest_report(self) -> Path:
        return self.path / "tidy" / "ingest.json"

    @property
    def tables(self) -> Path:
        return self.path / "tables"

    def table(self, name: str, suffix: str = "csv") -> Path:
        return self.tables / f"{name}.{suffix}"

    @property
    def numbers(self) -> Path:  # what analyze hands the report rules besides tables/ (contracts.py)
        return self.path / "analysis"

    @property
    def pooled(self) -> Path:  # the per-phase metrics the comparisons pool (contracts.POOLED_COLUMNS)
        return self.numbers / "pooled.parquet"

    def frame(self, name: str) -> Path:  # a table of tables/ (or windows, acceptance) with its types
        return self.numbers / f"{name}.parquet"

    @property
    def open_plan(self) -> Path:  # what would decide the open questions (contracts.PLAN_COLUMNS)
        return self.numbers / "plan.parquet"

    @property
    def analysis_record(self) -> Path:  # the runs pooled, a sweep's best setting (contracts.AnalysisRecord)
        return self.numbers / "analysis.json"

    @property
    def summary(self) -> Path:
        return self.path / "summary.md"

    @property
    def evidence(self) -> Path:  # the answer for a pull request (analysis.evidence)
        return self.path / "evidence.md"

    @property
    def figures(self) -> Path:
        return self.path / "figures"

    def figure(self, name: str) -> Path:
        return self.figures / name

    @property
    def report(self) -> Path:
        return self.path / "report.html"

    def look(self, repeats) -> RunDir:
        """The look of ``until: decided`` at ``repeats``: a run directory of its own, the
        run's files and its phases up to the look linked in, its own stop, tidy/ and tables/."""
        return RunDir(self.path / "looks" / str(repeats))

    @property
    def decision(self) -> Path:  # a look's: whether the study goes on (contracts.Decision)
        return self.path / "look.json"

    @property
    def provenance(self) -> Path:
        return self.path / "provenance"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def log(self, name: str) -> Path:
        return self.logs / name

    @property
    def preflight_failed(self) -> Path:  # the preflight report, kept when Snakemake deletes preflight.json
        return self.log("preflight-failed.json")

    @property
    def cluster_dir(self) -> Path:  # results/{cluster}: what every run of the cluster shares
        return self.path.parent

    def patch_state(self, host: str) -> Path:  # a host's original bytes while it is patched
        return patch_state(self.cluster_dir, host)

    @property
    def compare(self) -> Path:
        return self.cluster_dir / "compare"


def run_dir(cluster: str, order: str) -> RunDir:
    return RunDir(RUN_PATTERN.format(cluster=cluster, order=order))


def patch_state(cluster_dir: Path, host: str) -> Path:
    return Path(cluster_dir) / "patch-state" / host


def fleet_dir(order: str) -> Path:
    return Path(RESULTS) / "fleet" / order


def results_log(name: str) -> Path:  # logs of the rules that span clusters (compare, restore)
    return Path(RESULTS) / "logs" / name


# -- the tune (python -m thermab tune, docs/tune.md) ------------------------------------------

TRIAL_PATTERN = "trial-{number:03d}"  # a trial's directory under the tune's, by Optuna's trial number


@dataclass(frozen=True)
class TrialDir:
    """``results/{cluster}/tune/trial-NNN/``: one trial, a workflow directory of its own
    (Snakemake runs there with ``--directory``), so its run directory, patch state, locks and
    simulated nodes are its own and an interrupted trial resumes as any run does."""

    path: Path

    @property
    def config(self) -> Path:  # the generated config the trial's Snakemake runs
        return self.path / "config.yaml"

    @property
    def log(self) -> Path:  # Snakemake's output, every look appended
        return self.path / "snakemake.log"

    def run(self, cluster: str, order: str) -> RunDir:
        return RunDir(self.path / RUN_PATTERN.format(cluster=cluster, order=order))


@dataclass(frozen=True)
class TuneDir:
    """``results/{cluster}/tune/``: the search's state and its answer."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def study(self) -> Path:  # Optuna's RDB storage (SQLite): an interrupted tune resumes from it
        return self.path / "study.db"

    @property
    def best(self) -> Path:
        return self.path / "best.json"

    @property
    def trials(self) -> Path:
        return self.path / "trials.csv"

    @property
    def figure(self) -> Path:  # objective against value, every trial with its interval
        return self.path / "tune.png"

    @property
    def summary(self) -> Path:
        return self.path / "summary.md"

    def trial(self, number: int) -> TrialDir:
        return TrialDir(self.path / TRIAL_PATTERN.format(number=number))


def tune_dir(cluster: str) -> TuneDir:
    return TuneDir(Path(RESULTS) / cluster / "tune")
