"""Rule monitor_stop: restore every host, stop servers and agents, pull the logs."""

from pathlib import Path

from thermab import jobs
from thermab.experiment import monitor

with jobs.logged(snakemake.log[0]):
    monitor.monitor_stop(jobs.run_for(snakemake), Path(snakemake.output[0]))
