"""report: what a run's numbers say in words and pictures: the summary, the figures, the
HTML report, the fleet report, the provenance, and ``analyze``, the entry point that reads a
run directory, has the analysis compute its tables and writes the numbers (rule analyze)
apart from the words made from them (rules summary and evidence; figures draws them)."""
