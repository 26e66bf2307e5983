"""``python -m thermab tune CONFIG``: the setting's best value within a declared range, each
candidate measured as an experiment against the reference arm (docs/tune.md).

- ``plan``: pure functions: the trial's config, the looks' arithmetic, racing, the best;
- ``study``: Optuna's study (sampler, SQLite storage) asked and told;
- ``report``: best.json, trials.csv, the figure and summary.md;
- ``run``: the command, which runs each trial's looks through Snakemake.
"""
