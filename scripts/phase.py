"""Rule phase: patch, restart, ready, load with probe, cool down."""
from pathlib import Path

from thermab import jobs
from thermab.experiment import phase

with jobs.logged(snakemake.log.phase):
    phase.phase(jobs.run_for(snakemake), int(snakemake.wildcards.rep), snakemake.wildcards.arm,
                 Path(snakemake.output.phase), Path(snakemake.output.requests), Path(snakemake.log.locust))
