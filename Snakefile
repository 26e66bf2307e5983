# thermab: controlled A/B experiments of heat, CPU and speed on LLM inference servers.
# Stages and file contracts: docs/design.md; every config key: config/README.md.
from snakemake.utils import min_version

min_version("9.0")


# The default config (the simulated study) sits beside this file, so `--directory`
# elsewhere still finds it. A config given with --configfile replaces it rather than
# merging into it: a GB10 preset must not also run the simulated cluster.
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/monitor.smk"
include: "workflow/rules/phase.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/words.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/fleet.smk"


rule all:
    input:
        get_final_outputs,
        get_stopping_looks,
    default_target: True


onsuccess:
    print_answers()
