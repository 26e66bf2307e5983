"""Rule tables: tables/*.csv and *.md, the numbers analyze wrote with their word columns."""

from pathlib import Path

from thermab import jobs
from thermab.report.analyze import read_report, write_tables

with jobs.logged(snakemake.log[0]):
    write_tables(read_report(Path(snakemake.input.run).parent, analysis=dict(snakemake.params.analysis)))
