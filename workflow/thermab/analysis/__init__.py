"""analysis: a run directory's contracts in, numbers out (the tables, the questions'
answers); the report room (``thermab.report``) puts them in words and pictures.

The tables a run gets, in ``tables/{name}.{csv,md}``: the one list that the analysis
writes and the workflow's outputs are declared from; analyze also writes each, with its
types, as ``analysis/{name}.parquet`` for the report rules (contracts.py)."""

PHASE_TABLES = ["thresholds", "zones", "cpu", "performance", "validity", "energy", "speed", "latency"]
TABLES = PHASE_TABLES + ["wakeup", "variance", "questions"]
# ... and beside them in analysis/{name}.parquet with their types, with the frames the words
# are also made from: each phase's load window and each arm's acceptance balance
NUMBERS = TABLES + ["windows", "acceptance"]
