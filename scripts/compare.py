"""Rule compare: every analysed run of each cluster pooled into one variance table."""

from pathlib import Path

from thermab import jobs, layout
from thermab.report.analyze import compare_runs

with jobs.logged(snakemake.log[0]):
    for cluster in snakemake.params.clusters:
        variance = layout.run_dir(cluster, "*").table("variance")  # every order's run
        run_dirs = sorted(p.parents[1] for p in Path().glob(str(variance)))
        if not run_dirs:
            jobs.progress(f"{cluster}: no analysed run under results/{cluster}/ yet: nothing to compare")
            continue
        out = layout.RunDir(run_dirs[0]).compare
        compare_runs(run_dirs, out, dict(snakemake.params.analysis))
        jobs.progress(f"{cluster}: pooled {', '.join(str(p) for p in run_dirs)} into {out}/")
