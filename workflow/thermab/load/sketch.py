"""The inter-token gaps as a DDSketch (the ``ddsketch`` package, Datadog's, its logarithmic
mapping): a count per bin, bins of relative width ``RELATIVE_ACCURACY`` (1 %), so any
quantile read from it is within 1 % of the gap that the exact quantile's rank holds. Bins
merge by adding counts, so the requests of a phase and the phases of an arm pool exactly.

Small (``ddsketch`` only, no numpy or pandas), as the locustfile adds every gap of every
request here: one logarithm and a dict update a gap (the load client's CPU per token,
docs/benchmarks.md)."""

from __future__ import annotations

import math

from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

RELATIVE_ACCURACY = 0.01
MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
# A gap below the clock's resolution (two lines of one read) is counted as this: every gap
# then has a bin, none falls in DDSketch's separate zero count.
MIN_GAP_S = 1e-6


def gap_key(gap_s: float) -> int:
    """The sketch bin of one inter-token gap."""
    return MAPPING.key(gap_s if gap_s > MIN_GAP_S else MIN_GAP_S)


def merged(pairs) -> dict[int, int]:
    """Bins (key → count) of many sketches, from (keys, counts) pairs: exact pooling."""
    bins: dict[int, int] = {}
    for keys, counts in pairs:
        for key, count in zip(keys, counts, strict=True):
            bins[int(key)] = bins.get(int(key), 0) + int(count)
    return bins


def quantile_s(bins: dict[int, int], q: float) -> float:
    """The ``q`` quantile (0–1) of the gaps in ``bins``, within RELATIVE_ACCURACY; NaN when empty."""
    store = DenseStore()
    for key, count in bins.items():
        store.add(key, count)
    sketch = BaseDDSketch(MAPPING, store, DenseStore(), 0.0)
    value = sketch.get_quantile_value(q)
    return math.nan if value is None else float(value)
