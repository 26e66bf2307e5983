"""Rule ingest: agent CSVs and phase requests -> tidy/*.parquet."""

from pathlib import Path

from thermab import jobs
from thermab.telemetry import ingest

with jobs.logged(snakemake.log[0]):
    report = ingest.ingest(
        Path(snakemake.output.telemetry).parents[1],
        [Path(p) for p in snakemake.input.requests],
        Path(snakemake.output.telemetry),
        Path(snakemake.output.requests),
    )
    jobs.progress(f"ingest: {report['telemetry_rows']} telemetry rows, dropped {report['dropped'] or 'none'}")
