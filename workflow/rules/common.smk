import os
import sys
from pathlib import Path

# The Snakefile imports the package from the checkout; jobs import the installed one
# (`pip install -e .`, or the `-e ..` line of each conda env) and stop if it is another.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from thermab import config as thermab_config
from thermab import jobs
from thermab.analysis import TABLES
from thermab.experiment import plan

os.environ[jobs.CHECKOUT_ENV] = str(Path(workflow.basedir) / "workflow" / "thermab")

# JSON-schema validation (workflow/schemas/config.schema.yaml) with defaults filled in;
# an error names the config key at fault and stops the run before any job.
config.update(thermab_config.validate(config))


wildcard_constraints:
    cluster="|".join(config["clusters"]),
    order="[" + "".join(config["arms"]) + "]+",
    rep=r"\d+",
    arm="|".join(config["arms"]),


def get_final_outputs(wildcards):
    outputs = [
        f"results/{cluster}/{config['order']}/{name}"
        for cluster in config["clusters"]
        for name in ("summary.md", "report.html")
    ]
    if len(config["clusters"]) > 1:
        outputs.append(f"results/fleet/{config['order']}/fleet.md")
    return outputs


def get_fleet_inputs(wildcards):
    return [
        f"results/{cluster}/{wildcards.order}/tables/variance.csv"
        for cluster in config["clusters"]
    ]


def get_previous_phase(wildcards):
    previous = plan.previous(wildcards.order, int(wildcards.rep), wildcards.arm)
    return f"results/{wildcards.cluster}/{wildcards.order}/phases/{previous}/phase.json"


def get_phase_files(name):
    def phase_files(wildcards):
        return [
            f"results/{wildcards.cluster}/{wildcards.order}/phases/{phase.id}/{name}"
            for phase in plan.phases(wildcards.order, config["repeats"])
        ]

    return phase_files
