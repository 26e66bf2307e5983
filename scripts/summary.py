"""Rule summary: summary.md and tables/*.md, in words from the numbers analyze wrote."""

from pathlib import Path

from thermab import jobs
from thermab.report.analyze import read_numbers, write_summary, write_table_words

with jobs.logged(snakemake.log[0]):
    result = read_numbers(Path(snakemake.input.run).parent, analysis=dict(snakemake.params.analysis))
    write_table_words(result)
    write_summary(result)
