"""Rule monitor_start: the guardian, the simulated hardware and one agent per host."""
from pathlib import Path

from thermab import snake, stages

with snake.logged(snakemake.log[0]):
    stages.monitor_start(snake.run_for(snakemake), Path(snakemake.output[0]))
