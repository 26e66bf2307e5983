import hashlib
import json
import os
import sys
from pathlib import Path

from snakemake.utils import update_config

# The Snakefile imports the package from the checkout; jobs import the installed one
# (`pip install -e .`, or the `-e ..` line of each conda env) and stop if it is another.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from thermab import config as thermab_config
from thermab import jobs, layout
from thermab.analysis import NUMBERS, TABLES
from thermab.contracts import Decision
from thermab.experiment import plan

os.environ[jobs.CHECKOUT_ENV] = str(Path(workflow.basedir) / "workflow" / "thermab")
# preflight records these in run.json: the command that continues the run starts it the same
# way, so what cannot be printed into that command is refused here, before any job
INVOCATION = plan.invocation(
    workflow.overwrite_configfiles or [], workflow.resource_settings.cores, workflow.config_settings.config
)
for problem in plan.invocation_problems(INVOCATION)[:1]:
    print(f"thermab: {problem}", file=sys.stderr)
    sys.exit(2)
os.environ[plan.INVOCATION_ENV] = json.dumps(INVOCATION)

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
    repeats=r"\d+",
    arm="|".join(config["arms"]),


# Every path a rule names comes from thermab.layout, with the wildcards left in.
RUN = layout.RunDir(layout.RUN_PATTERN)
FLEET = layout.fleet_dir("{order}")
# What analyze hands the report rules besides tables/*.csv (contracts.py, "analysis/"), and
# the run's own files the words and figures also read.
ANALYSIS_FILES = {
    **{f"{name}_frame": RUN.frame(name) for name in NUMBERS},
    "pooled": RUN.pooled,
    "open_plan": RUN.open_plan,
    "record": RUN.analysis_record,
}
RUN_FILES = {
    "run": RUN.run_json,
    "preflight": RUN.preflight,
    "telemetry": RUN.tidy_telemetry,
    "requests": RUN.tidy_requests,
}


def room_digest(room):
    """A digest of the checkout's sources of one room of the package. Snakemake's code
    trigger sees a `script:` file's own changes, not the modules it imports; as a param of
    the report rules this digest makes a change of the report room's code (its wording, its
    figures) rerun those jobs, and only those."""
    folder = Path(workflow.basedir) / "workflow" / "thermab" / room
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


REPORT_CODE = room_digest("report")


def get_final_outputs(wildcards):
    outputs = [
        path
        for cluster in config["clusters"]
        for files in [layout.run_dir(cluster, config["order"])]
        for path in (files.summary, files.evidence, files.report)
    ]
    if len(config["clusters"]) > 1:
        outputs.append(layout.fleet_dir(config["order"]) / "fleet.md")
    return outputs


def get_stopping_looks(wildcards):
    """until: decided: the look that stops each cluster's study, asked for through each look's
    checkpoint, so that a summary already on disk (a run of `repeats` continued until
    decided) never keeps Snakemake from the looks it has not had. An input function of its
    own: while a look is to come, it alone waits for the checkpoint."""
    if not CROSSOVER:
        return []
    return [
        layout.run_dir(cluster, config["order"]).look(
            decided_repeats(cluster, config["order"], checkpointed(cluster, config["order"]))
        ).decision
        for cluster in config["clusters"]
    ]


def get_fleet_inputs(wildcards):
    return [layout.run_dir(cluster, wildcards.order).table("variance") for cluster in config["clusters"]]


# until: decided adds crossover blocks of repeats until every question is decided. Each look
# is the checkpoint `look` (rules/analyze.smk), whose decision (looks/{repeats}/look.json,
# contracts.Decision) the input functions below read: the run's last phases, its stop and
# its tables wait for the look that stops it, and Snakemake adds the next block's phases to
# the DAG while a look goes on (Snakemake's data-dependent conditional execution).
CROSSOVER = config["until"] == "decided"
LOOK = RUN.look("{repeats}")


def one_line(read):
    """``read``'s result; a run directory's file that cannot be read (a damaged phase.json or
    look.json) stops Snakemake in one line naming it, as a bad config does."""
    try:
        return read()
    except thermab_config.UserError as error:
        print(f"thermab: {error}", file=sys.stderr)
        sys.exit(2)


def decided_repeats(cluster, order, decision_of):
    """The repeats the study reaches: from the first look, each look's next while it goes on
    (``decision_of(repeats)``: that look's contracts.Decision)."""
    repeats = plan.looks(order, config["max_repeats"])[0]
    while (decision := decision_of(repeats)).goes_on:
        repeats = decision.next_repeats
    return repeats


def checkpointed(cluster, order):
    """Each look's decision through its checkpoint: a look not yet run stops the DAG there."""

    def decision_of(repeats):
        done = checkpoints.look.get(cluster=cluster, order=order, repeats=repeats)
        return one_line(lambda: Decision.read(Path(done.output.decision)))

    return decision_of


def repeats_for(wildcards):
    if CROSSOVER and wildcards.order == config["order"]:
        return decided_repeats(wildcards.cluster, wildcards.order, checkpointed(wildcards.cluster, wildcards.order))
    return config["repeats"]


def get_last_look(wildcards):
    """The look that ended an until: decided run (its hosts were put back there), else none."""
    if not (CROSSOVER and wildcards.order == config["order"]):
        return []
    return layout.run_dir(wildcards.cluster, wildcards.order).look(repeats_for(wildcards)).stopped


def get_look_phases(name):
    """A file of every phase up to the look ``{repeats}`` (a PhaseDir property)."""

    def look_phases(wildcards):
        run = layout.run_dir(wildcards.cluster, wildcards.order)
        return [getattr(run.phase(phase.id), name)
                for phase in plan.phases(wildcards.order, int(wildcards.repeats), True, LEVELS)]

    return look_phases


def get_look_settings(wildcards):
    """What the look ``{repeats}`` decides with (its params): the analysis settings and where
    the study stops. A look that went on keeps the settings it decided with, so it never runs
    again (its block ran); a look that stopped decides again when they change, and the run
    goes on from it."""
    decision = layout.run_dir(wildcards.cluster, wildcards.order).look(wildcards.repeats).decision
    if decision.is_file():
        decided = one_line(lambda: Decision.read(decision))
        if decided.goes_on:
            return decided.settings
    return {
        "analysis": plan.reanalysis(config["analysis"]),
        "max_repeats": config["max_repeats"],
        "budget_hours": config["budget_hours"],
    }


def get_opening_look(wildcards):
    """The decision of the look whose block the phase job ``rep{rep}-{arm}`` is in (none in
    the first block, or without until: decided): it runs only after the look goes on."""
    opening = plan.look_before(wildcards.order, config["max_repeats"], int(wildcards.rep)) if CROSSOVER else None
    if opening is None:
        return []
    # ancient: a look decided again (new analysis settings or max_repeats) never reruns the phases it opened
    return ancient(layout.run_dir(wildcards.cluster, wildcards.order).look(opening).decision)


def print_answers():
    """The end of a run: each cluster's answers and the paths of its summary and report."""
    from thermab.report import status  # only at the end: the analysis room is not needed before

    for cluster in config["clusters"]:
        files = layout.run_dir(cluster, config["order"])
        if files.summary.is_file():  # a target short of the analysis has no answer to tell
            if CROSSOVER:
                def decision_of(repeats, files=files):
                    return Decision.read(files.look(repeats).decision)

                repeats = decided_repeats(cluster, config["order"], decision_of)
                print(f"thermab: until decided: stopped at {repeats} repeats, {decision_of(repeats).why}"
                      " (tables/questions.csv has the answers)")
            print("\n".join(status.closing_lines(files.path)))


# load.users as a list: one phase job per (rep, arm) runs a load window per level, each
# level's files in a phase directory of its own (plan.job_phases); None for a single number
LEVELS = plan.levels(config["load"])
# each phase.json's window read once as the workflow is parsed, so a damaged one is one line
one_line(lambda: [plan.recorded_windows(layout.run_dir(cluster, config["order"]).path, config["order"],
                                        max(config["repeats"], config["max_repeats"]), CROSSOVER, LEVELS)
                  for cluster in config["clusters"]])


def get_load_s(wildcards):
    """The load window of the phase job ``rep{rep}-{arm}`` (params of the phase jobs): a phase
    that ran keeps its own (its params must not change, or Snakemake would run it again);
    until: decided takes its block's from the look before it (analysis/phase_length.py),
    any other run timings.load_s."""
    run_dir, rep = layout.run_dir(wildcards.cluster, wildcards.order).path, int(wildcards.rep)
    load_s = config["timings"]["load_s"]
    if CROSSOVER:
        return one_line(lambda: plan.block_window(run_dir, wildcards.order, config["max_repeats"], rep, load_s, LEVELS))
    recorded = one_line(lambda: plan.recorded_windows(run_dir, wildcards.order, rep, False, LEVELS))
    return recorded.get(rep, load_s)


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
