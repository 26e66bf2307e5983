"""Rule monitor_start: the guardian, the simulated hardware and one agent per host."""
from pathlib import Path

from thermab import jobs
from thermab.experiment import phase

with jobs.logged(snakemake.log[0]):
    phase.monitor_start(jobs.run_for(snakemake), Path(snakemake.output[0]))
