"""Rule phase: patch, restart, ready, load with probe, cool down."""
from pathlib import Path

from thermab import snake, stages

with snake.logged(snakemake.log.phase):
    stages.phase(snake.run_for(snakemake), int(snakemake.wildcards.rep), snakemake.wildcards.arm,
                 Path(snakemake.output.phase), Path(snakemake.output.requests), Path(snakemake.log.locust))
