"""Rule restore: every host back to its original files, servers and agents stopped."""

from thermab import jobs
from thermab.experiment.restore import restore_all

with jobs.logged(snakemake.log[0]):
    problems, patched = restore_all("results", jobs.progress)
    if patched:
        raise SystemExit(f"restore: still patched: {', '.join(patched)}; problems: {'; '.join(problems)}")
    if problems:
        raise SystemExit(f"restore finished with {len(problems)} problem(s), see above")
