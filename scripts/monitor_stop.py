"""Rule monitor_stop: restore every host, stop servers and agents, pull the logs."""
from pathlib import Path

from thermab import snake, stages

with snake.logged(snakemake.log[0]):
    stages.monitor_stop(snake.run_for(snakemake), Path(snakemake.output[0]))
