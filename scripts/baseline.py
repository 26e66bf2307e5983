"""Rule baseline: the idle recording before the first phase."""
from pathlib import Path

from thermab import jobs
from thermab.experiment import phase

with jobs.logged(snakemake.log[0]):
    phase.baseline(jobs.run_for(snakemake), Path(snakemake.output[0]))
