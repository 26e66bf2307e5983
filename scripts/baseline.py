"""Rule baseline: the idle recording before the first phase."""
from pathlib import Path

from thermab import snake, stages

with snake.logged(snakemake.log[0]):
    stages.baseline(snake.run_for(snakemake), Path(snakemake.output[0]))
