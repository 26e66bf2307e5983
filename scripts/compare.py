"""Rule compare_cluster: every finished run of a cluster pooled into one variance table."""
from pathlib import Path

from thermab import snake
from thermab.analyze import compare_runs

with snake.logged(snakemake.log[0]):
    run_dirs = [Path(p).parents[1] for p in snakemake.input]  # results/C/O/tables/variance.csv
    compare_runs(run_dirs, Path(snakemake.output.summary).parent)
