"""Rule phase: patch, restart, ready, then per level of load: load with probe, cool down;
its load window is the rule's params (workflow/rules/common.smk, ``get_load_s``)."""

from thermab import jobs
from thermab.experiment import phase

with (
    jobs.logged(snakemake.log.phase),
    jobs.put_back_if_terminated(jobs.run_for(snakemake, snakemake.params.load_s)) as run,
):
    phase.phase(run, int(snakemake.wildcards.rep), snakemake.wildcards.arm)
