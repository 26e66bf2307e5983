"""Rule baseline: the idle recording before the first phase."""

from pathlib import Path

from thermab import jobs
from thermab.experiment import phase

with jobs.logged(snakemake.log[0]), jobs.put_back_if_terminated(jobs.run_for(snakemake)) as run:
    phase.baseline(run, Path(snakemake.output[0]))
