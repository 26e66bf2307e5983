"""Rule fleet_report: one table and figure comparing every cluster's run of the same order."""

from pathlib import Path

from thermab import jobs
from thermab.report.fleet import write_fleet

with jobs.logged(snakemake.log[0]):
    run_dirs = {Path(p).parents[2].name: Path(p).parents[1] for p in snakemake.input}  # results/C/O/tables
    write_fleet(
        run_dirs,
        snakemake.wildcards.order,
        Path(snakemake.output.csv),
        Path(snakemake.output.markdown),
        Path(snakemake.output.figure),
        dict(snakemake.params.analysis),
    )
