import json
import os
import subprocess
import sys
from pathlib import Path

from snakemake.utils import update_config

# The Snakefile imports the package from the checkout; jobs import the installed one
# (`pip install -e .`, or the `-e ..` line of each conda env) and stop if it is another.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from thermab import config as thermab_config
from thermab import jobs, layout
from thermab.analysis import TABLES
from thermab.experiment import plan, progress
from thermab.tune import ONE_LOOK_ENV

os.environ[jobs.CHECKOUT_ENV] = str(Path(workflow.basedir) / "workflow" / "thermab")
# preflight records these in run.json: the command that continues the run starts it the same way
os.environ[plan.INVOCATION_ENV] = json.dumps(
    plan.invocation(workflow.overwrite_configfiles or [], workflow.resource_settings.cores)
)

# Every check of thermab.config before any job: the config files Snakemake merged are read
# again strictly (Snakemake's own reader keeps the last of a key given twice), then the
# merged config is validated with defaults filled in. An error is one line naming the file
# or key, and exit status 2.
# Mappings and lists given with --config are typed by the schema (Snakemake reads them as text).
try:
    for path in workflow.configfiles:
        thermab_config.read_file(path)
    update_config(config, thermab_config.typed_overrides(workflow.config_settings.config))
    config.update(thermab_config.validate(config))
except thermab_config.ConfigError as error:
    print(f"thermab: {error}", file=sys.stderr)
    sys.exit(2)


wildcard_constraints:
    cluster="|".join(config["clusters"]),
    order="[" + "".join(config["arms"]) + "]+",
    rep=r"\d+",
    arm="|".join(config["arms"]),


# Every path a rule names comes from thermab.layout, with the wildcards left in.
RUN = layout.RunDir(layout.RUN_PATTERN)
FLEET = layout.fleet_dir("{order}")


def get_final_outputs(wildcards):
    outputs = [
        path
        for cluster in config["clusters"]
        for path in (layout.run_dir(cluster, config["order"]).summary, layout.run_dir(cluster, config["order"]).report)
    ]
    if len(config["clusters"]) > 1:
        outputs.append(layout.fleet_dir(config["order"]) / "fleet.md")
    return outputs


def get_fleet_inputs(wildcards):
    return [layout.run_dir(cluster, wildcards.order).table("variance") for cluster in config["clusters"]]


# until: decided adds crossover pairs of repeats until every question is decided. The DAG is
# static, so each invocation reaches the next look (sequential.resume_repeats, read from the
# run directory: an interrupted run resumes there) and, on success, starts the next one.
CROSSOVER = config["until"] == "decided"


def repeats_of(cluster):
    if not CROSSOVER:
        return config["repeats"]
    # imported here: it needs scipy and pandas, seconds of a core that every Snakemake start
    # (each job under SLURM, each report's DAG) would pay for a run not `until: decided`
    from thermab.analysis import planning

    run_dir = layout.run_dir(cluster, config["order"]).path
    return planning.resume_within_budget(run_dir, config["order"], config["max_repeats"],
                                         plan.levels(config["load"]), config["budget_hours"],
                                         config["timings"]["time_scale"])


def repeats_reached():
    """Each cluster's repeats; a run directory that cannot be read (a damaged questions.csv)
    stops Snakemake in one line naming the file, as a bad config does."""
    try:
        return {cluster: repeats_of(cluster) for cluster in config["clusters"]}
    except thermab_config.UserError as error:
        print(f"thermab: {error}", file=sys.stderr)
        sys.exit(2)


REPEATS = repeats_reached()
os.environ[progress.LOOK_ENV] = json.dumps(REPEATS)  # the phase jobs' progress line counts this look


def repeats_for(wildcards):
    if wildcards.order == config["order"]:
        return REPEATS.get(wildcards.cluster, config["repeats"])
    return config["repeats"]


def continue_until_decided():
    """After a successful look: the next invocation while a cluster's questions are open.
    Whether it ran one (which then ends with the answers)."""
    reached = repeats_reached()
    if os.environ.get(ONE_LOOK_ENV):  # the tuner decides whether a trial goes on (thermab.tune)
        return True
    if all(reached[c] <= REPEATS[c] for c in reached):
        print(f"thermab: until decided: stopped at {REPEATS} repeats (tables/questions.csv has the answers)")
        return False
    print(f"thermab: until decided: questions still open, going on to {reached} repeats", file=sys.stderr)
    # this invocation still holds the directory's lock: the next one runs inside it
    code = subprocess.call([sys.executable, "-m", "snakemake", *sys.argv[1:], "--nolock"])
    if code:
        sys.exit(code)
    return True


def print_answers():
    """The end of a run: each cluster's answers and the paths of its summary and report."""
    from thermab.report import status  # only at the end: the analysis room is not needed before

    for cluster in config["clusters"]:
        files = layout.run_dir(cluster, config["order"])
        if files.summary.is_file():  # a target short of the analysis has no answer to tell
            print("\n".join(status.closing_lines(files.path)))


# load.users as a list: one phase job per (rep, arm) runs a load window per level, each
# level's files in a phase directory of its own (plan.job_phases); None for a single number
LEVELS = plan.levels(config["load"])


def windows_of(cluster, order, repeats):
    """rep → the load window of its phase jobs: a phase that ran keeps its own (its params
    must not change, or Snakemake would run it again); until: decided takes the next
    block's from the latest look (analysis/phase_length.py), any other run timings.load_s."""
    run_dir = layout.run_dir(cluster, order).path
    load_s = config["timings"]["load_s"]
    if CROSSOVER and order == config["order"]:
        from thermab.analysis import phase_length  # pandas: only where a look decides it

        return phase_length.job_windows(run_dir, order, next(iter(config["arms"])), repeats, config["max_repeats"],
                                        LEVELS, load_s, config["timings"]["min_load_s"])
    recorded = plan.recorded_windows(run_dir, order, repeats, CROSSOVER, LEVELS)
    return {rep: recorded.get(rep, load_s) for rep in range(1, repeats + 1)}


def windows_reached(clusters, order, repeats_of):
    """Each cluster's windows for its repeats; an unreadable phase.json or table (a window
    no config could ask for among them) stops Snakemake in one line naming the file."""
    try:
        return {cluster: windows_of(cluster, order, repeats_of(cluster)) for cluster in clusters}
    except thermab_config.UserError as error:
        print(f"thermab: {error}", file=sys.stderr)
        sys.exit(2)


WINDOWS = windows_reached(config["clusters"], config["order"], REPEATS.get)


def get_load_s(wildcards):
    """The load window of the phase job ``rep{rep}-{arm}`` (the rule phase's params)."""
    if wildcards.order == config["order"]:
        windows = WINDOWS.get(wildcards.cluster, {})
    else:
        windows = windows_reached([wildcards.cluster], wildcards.order, lambda _: int(wildcards.rep))[wildcards.cluster]
    return windows.get(int(wildcards.rep), config["timings"]["load_s"])


def get_previous_phase(wildcards):
    previous = plan.previous(wildcards.order, int(wildcards.rep), wildcards.arm, CROSSOVER, LEVELS)
    return layout.run_dir(wildcards.cluster, wildcards.order).phase(previous).phase_json


def get_phase_files(name):
    """A file of every phase of the run (a PhaseDir property: "requests", "validity", …)."""

    def phase_files(wildcards):
        run = layout.run_dir(wildcards.cluster, wildcards.order)
        return [getattr(run.phase(phase.id), name)
                for phase in plan.phases(wildcards.order, repeats_for(wildcards), CROSSOVER, LEVELS)]

    return phase_files


def job_files(what):
    """The files of each level of one phase job, with the wildcards left in ({rep}, {arm}):
    ``what(phase_id)`` names one level's file from its phase id."""
    return [what(plan.Phase("{rep}", "{arm}", level).id) for level in plan.level_order(LEVELS, 1)]


def tables(suffix):
    return expand(str(RUN.table("{table}", suffix)), table=TABLES, allow_missing=True)


# One arm letter, for the report rules' order constraints (a {m,n} quantifier there would
# read as a wildcard, so the letters are repeated instead).
ARM = "[" + "".join(config["arms"]) + "]"
CAPTIONS = {
    "timeline.png": "../report/timeline.rst",
    "timeline.html": "../report/timeline_html.rst",
    "questions.png": "../report/questions.rst",
    "tradeoff.png": "../report/tradeoff.rst",
    "wakeup.png": "../report/wakeup.rst",
    "latency.png": "../report/latency.rst",
    "cpu.png": "../report/per_arm.rst",
    "throughput.png": "../report/per_arm.rst",
}


# whether the runs make wake-up probes: the figure of their latencies is drawn only then
WAKEUP = bool(config["load"]["wakeup_gaps_s"])


def figure_outputs(names):
    """The named figures of a run as report outputs, keyed by name (timeline_png, …)."""
    outputs = {}
    for name in names:
        path = RUN.figure(name)
        if name.endswith(".svg"):  # the PNG's twin, for print: not shown twice in the report
            outputs[name.replace(".", "_")] = path
        else:  # the timeline first (the report sorts by name within a subcategory)
            where = {"category": "Figures", "subcategory": "1. Timeline" if name.startswith("timeline") else "2. Arms"}
            if name in CAPTIONS:
                where["caption"] = CAPTIONS[name]
            outputs[name.replace(".", "_")] = report(path, **where)
    return outputs
