"""Rule monitor_stop: restore every host, stop servers and agents, pull the logs; an
until: decided run ended at its last look, which did all that: its stop is that look's."""

import shutil
from pathlib import Path

from thermab import jobs
from thermab.experiment import monitor

with jobs.logged(snakemake.log[0]):
    if snakemake.input.last_look:
        shutil.copyfile(snakemake.input.last_look, snakemake.output[0])
    else:
        monitor.monitor_stop(jobs.run_for(snakemake), Path(snakemake.output[0]))
