"""Rule compare: every analysed run of each cluster pooled into one variance table."""
from pathlib import Path

from thermab import jobs
from thermab.analysis.analyze import compare_runs

with jobs.logged(snakemake.log[0]):
    for cluster in snakemake.params.clusters:
        run_dirs = sorted(p.parents[1] for p in Path("results", cluster).glob("*/tables/variance.csv"))
        if not run_dirs:
            jobs.progress(f"{cluster}: no analysed run under results/{cluster}/ yet: nothing to compare")
            continue
        compare_runs(run_dirs, Path("results", cluster, "compare"))
        jobs.progress(f"{cluster}: pooled {', '.join(str(p) for p in run_dirs)} into results/{cluster}/compare/")
