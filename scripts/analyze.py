"""Rule analyze: the tables, summary.md and evidence.md (the same as `python -m thermab analyze RUN_DIR`),
with the config's analysis settings."""

from pathlib import Path

from thermab import jobs
from thermab.report.analyze import analyze

with jobs.logged(snakemake.log[0]):
    analyze(Path(snakemake.input.run).parent, analysis=dict(snakemake.params.analysis))
