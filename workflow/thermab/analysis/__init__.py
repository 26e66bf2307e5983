"""analysis: a run directory's contracts in, tables, summary, figures and reports out.

The tables a run gets, in ``tables/{name}.{csv,md}``: the one list that the analysis
writes and the workflow's outputs are declared from."""

PHASE_TABLES = ["thresholds", "zones", "cpu", "performance", "validity", "energy"]
TABLES = PHASE_TABLES + ["variance", "questions"]
