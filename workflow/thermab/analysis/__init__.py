"""analysis: a run directory's contracts in, numbers out (the tables, the questions'
answers); the report room (``thermab.report``) puts them in words and pictures.

The tables a run gets, in ``tables/{name}.{csv,md}``: the one list that
the workflow's outputs are declared from; analyze (``run_analysis``) writes each, with its
types, as ``analysis/{name}.parquet``, and the report rule ``tables`` writes them for users,
with their word columns, as csv and Markdown (contracts.py)."""

PHASE_TABLES = ["thresholds", "zones", "cpu", "performance", "validity", "energy", "speed", "latency"]
TABLES = PHASE_TABLES + ["wakeup", "variance", "questions"]
# ... and beside them in analysis/{name}.parquet with their types, with the frames the words
# are also made from: each phase's load window, each arm's acceptance balance and each host's
# telemetry completeness
NUMBERS = TABLES + ["windows", "acceptance", "completeness"]
