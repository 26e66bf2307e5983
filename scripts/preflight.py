"""Rule preflight: check every host before anything changes."""
from pathlib import Path

from thermab import snake, stages

with snake.logged(snakemake.log[0]):
    stages.preflight(snake.run_for(snakemake), Path(snakemake.output.preflight), Path(snakemake.output.run))
