"""Rule monitor_start: the guardian, the simulated hardware and one agent per host."""

from pathlib import Path

from thermab import jobs
from thermab.experiment import monitor

with jobs.logged(snakemake.log[0]), jobs.put_back_if_terminated(jobs.run_for(snakemake)) as run:
    monitor.monitor_start(run, Path(snakemake.output[0]))
