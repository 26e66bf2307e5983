"""Rule phase: patch, restart, ready, load with probe, cool down."""
from pathlib import Path

from thermab import jobs
from thermab.experiment import phase

with jobs.logged(snakemake.log.phase), jobs.put_back_if_terminated(jobs.run_for(snakemake)) as run:
    phase.phase(run, int(snakemake.wildcards.rep), snakemake.wildcards.arm,
                 Path(snakemake.output.phase), Path(snakemake.output.requests), Path(snakemake.log.locust))
