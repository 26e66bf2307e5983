"""Rule preflight: check every host before anything changes."""

from pathlib import Path

from thermab import jobs
from thermab.experiment import preflight

with jobs.logged(snakemake.log[0]):
    preflight.preflight(
        jobs.run_for(snakemake), Path(snakemake.output.preflight), Path(snakemake.output.run), jobs.invocation()
    )
