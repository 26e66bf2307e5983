"""Rule restore: every host back to its original files, servers and agents stopped."""
from thermab import jobs
from thermab.experiment.restore import restore_all

with jobs.logged(snakemake.log[0]):
    problems = restore_all("results", jobs.progress)
    if problems:
        raise SystemExit(f"restore finished with {len(problems)} problem(s), see above")
