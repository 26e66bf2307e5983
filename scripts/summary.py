"""Rule summary: summary.md, in words from the numbers analyze wrote."""

from pathlib import Path

from thermab import jobs
from thermab.report.analyze import read_report, write_summary

with jobs.logged(snakemake.log[0]):
    write_summary(read_report(Path(snakemake.input.run).parent, analysis=dict(snakemake.params.analysis)))
