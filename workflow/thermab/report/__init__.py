"""report: what a run's numbers say in words and pictures: the tables users read, the
summary, the evidence, the figures, the HTML report, the fleet report, the provenance.
``analyze`` is the border: it reads the numbers rule analyze wrote (analysis/run_analysis.py)
and puts them in words (rules tables, summary and evidence; figures draws them), and runs
both sides in one process for ``python -m thermab analyze`` and a look."""
