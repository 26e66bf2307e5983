"""Checkpoint look: a look of until: decided, its tables and its decision (thermab.report.look)."""

from pathlib import Path

from thermab import jobs
from thermab.report import look

with jobs.logged(snakemake.log[0]):
    decision = look.look(
        jobs.run_for(snakemake),
        int(snakemake.wildcards.repeats),
        dict(snakemake.params.settings),
        Path(snakemake.output.decision),
    )
    jobs.progress(f"look at {decision.repeats} repeats: {decision.why}")
