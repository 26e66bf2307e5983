"""Rule analyze: the numbers, analysis/ (the same as `python -m thermab analyze RUN_DIR`
writes before its tables and words), with the config's analysis settings."""

from pathlib import Path

from thermab import jobs
from thermab.analysis.run_analysis import compute, write_numbers

with jobs.logged(snakemake.log[0]):
    write_numbers(compute(Path(snakemake.input.run).parent, analysis=dict(snakemake.params.analysis)))
