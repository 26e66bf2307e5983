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
from thermab.experiment import plan
from thermab.tune import ONE_LOOK_ENV

os.environ[jobs.CHECKOUT_ENV] = str(Path(workflow.basedir) / "workflow" / "thermab")

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
    from thermab.analysis import sequential

    run_dir = layout.run_dir(cluster, config["order"]).path
    return sequential.resume_repeats(run_dir, config["order"], config["max_repeats"],
                                     plan.levels(config["load"]["users"]))


REPEATS = {cluster: repeats_of(cluster) for cluster in config["clusters"]}


def repeats_for(wildcards):
    if wildcards.order == config["order"]:
        return REPEATS.get(wildcards.cluster, config["repeats"])
    return config["repeats"]


def continue_until_decided():
    """After a successful look: the next invocation while a cluster's questions are open."""
    reached = {cluster: repeats_of(cluster) for cluster in config["clusters"]}
    if os.environ.get(ONE_LOOK_ENV):  # the tuner decides whether a trial goes on (thermab.tune)
        return
    if all(reached[c] <= REPEATS[c] for c in reached):
        print(f"thermab: until decided: stopped at {REPEATS} repeats (tables/questions.csv has the answers)")
        return
    print(f"thermab: until decided: questions still open, going on to {reached} repeats", file=sys.stderr)
    # this invocation still holds the directory's lock: the next one runs inside it
    code = subprocess.call([sys.executable, "-m", "snakemake", *sys.argv[1:], "--nolock"])
    if code:
        sys.exit(code)


# load.users as a list: one phase job per (rep, arm) runs a load window per level, each
# level's files in a phase directory of its own (plan.job_phases); None for a single number
LEVELS = plan.levels(config["load"]["users"])


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
    return [what(layout.phase_id("{rep}", "{arm}", level)) for level in plan.level_order(LEVELS, 1)]


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
}


def figure_outputs(names):
    """The named figures of a run as report outputs, keyed by name (timeline_png, …)."""
    outputs = {}
    for name in names:
        path = RUN.figure(name)
        if name.endswith(".svg"):  # the PNG's twin, for print: not shown twice in the report
            outputs[name.replace(".", "_")] = path
        elif name in CAPTIONS:
            outputs[name.replace(".", "_")] = report(path, caption=CAPTIONS[name], category="Figures")
        else:
            outputs[name.replace(".", "_")] = report(path, category="Figures")
    return outputs
