"""The load window of each phase of ``until: decided`` (docs/planning.md, "The window the
open questions need"): the run's full window, ``timings.load_s``, while any question outside
``metric_names.BETWEEN_RESTARTS`` is open; once a look leaves only questions of speed and
energy per token open, the next crossover block runs the window they need.

Their spread is between restarts (a CV of 7–15 %, docs/simulation.md), the noise of a
phase's own window a small part of it, so a window only long enough that its noise stays
small beside the restart spread decides them almost as fast and takes less cluster time.
The rule: the within-phase standard error of the throughput (``metrics.in_window_se``)
scales as 1/√window; the next block runs the shortest window at which it is at most
``WITHIN_SHARE`` of the spread between restarts seen so far, not below ``timings.min_load_s``
and never above ``timings.load_s``.  Every phase of a block, so both arms of each repeat, runs
the same window.  The other speed and per-token metrics follow the throughput: J/token is
the window's energy over its tokens, whose relative error is the throughput's (the power
moves far less), and the probes' decode speed does not depend on the window at all.

Every other metric pools only the phases of the run's full window (``with_windows``):
a heat metric's phase is one climb up a heat-up ramp, whose mean depends on how long it
climbed, and a count of stall gaps on how long it counted.  They are decided on the full
windows before any shorter one runs, and stay decided on them.

Pure functions over the run's tables; ``next_block_window`` reads them from a look's
directory for the look's decision (report/look.py).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from thermab.analysis import sequential, stats
from thermab.analysis.levels import LEVEL
from thermab.analysis.metrics import PHASE_KEYS, long
from thermab.analysis.planning import restart_spread
from thermab.analysis.questions import UNDECIDED
from thermab.analysis.stats import WINDOW
from thermab.config import read_bounded
from thermab.errors import UserError
from thermab.experiment import plan
from thermab.layout import RunDir
from thermab.metric_names import BETWEEN_RESTARTS, OUTPUT_THROUGHPUT

WITHIN_SHARE = 1 / 3  # the within-phase standard error's most, as a share of the restart spread
NUMBERS = ["rep", "window_s", "output_tok_s_in_window", "output_tok_s_se"]  # what it reads of performance.csv
MAX_TABLE_BYTES = 64 * 2**20  # a performance.csv of 100 repeats at 32 levels is far less


def next_window_s(
    open_metrics: Iterable[str], within_se_1s: float, restart_sd: float, load_s: int, min_load_s: int
) -> int:
    """The load window of the next block of phases: ``load_s`` unless every open metric is one
    of BETWEEN_RESTARTS, a spread between restarts was seen and a within-phase error measured;
    then the shortest whole seconds w at which ``within_se_1s`` / √w is at most WITHIN_SHARE ×
    ``restart_sd``, not below ``min_load_s`` and never above ``load_s``."""
    open_metrics = set(open_metrics)
    if not open_metrics or not open_metrics <= BETWEEN_RESTARTS:
        return int(load_s)
    if not (restart_sd > 0 and math.isfinite(restart_sd) and math.isfinite(within_se_1s)):
        return int(load_s)  # no restart spread seen: the window's own noise is all there is
    needed = math.ceil((within_se_1s / (WITHIN_SHARE * restart_sd)) ** 2)
    return int(min(load_s, max(min_load_s, needed)))


def within_se_1s(performance: pd.DataFrame) -> float:
    """The within-phase standard error of the throughput of a 1-s window: se × √window of
    each phase, their root mean square; NaN without one."""
    se, window = performance["output_tok_s_se"].astype(float), performance["window_s"].astype(float)
    known = se.notna() & (window > 0)
    return float(np.sqrt(np.mean(se[known] ** 2 * window[known]))) if known.any() else math.nan


def restart_sd(performance: pd.DataFrame, order: str, reference: str) -> float:
    """The throughput's spread between restarts seen in a crossover run's phases: the residual
    sd of its arm effect (OLS arm + position, ``stats.arm_effects``) less the phases' own
    noise (``planning.restart_spread``); the smallest over the arms.  NaN where it cannot be
    estimated (one phase per arm)."""
    values = long(performance, "output_tok_s_in_window", OUTPUT_THROUGHPUT, "tok/s").dropna(subset=["value"])
    values["order"] = [plan.order_of_repeat(order, int(rep)) for rep in values["rep"]]
    within = performance["output_tok_s_se"].astype(float).dropna()
    within_sd = float(np.sqrt(np.mean(within**2))) if len(within) else math.nan
    spreads = [
        restart_spread(effect["se"] / math.sqrt(1 / effect["n"] + 1 / effect["ref_n"]), within_sd)
        for effect in stats.arm_effects(values, reference).values()
    ]
    spreads = [spread for spread in spreads if not math.isnan(spread)]
    return min(spreads) if spreads else math.nan


def look_window_s(
    performance: pd.DataFrame, answers: pd.DataFrame, order: str, reference: str, load_s: int, min_load_s: int
) -> int:
    """The window of the block after a look, from its performance.csv and questions.csv: at
    each level of load (a run of levels) ``next_window_s`` of that level, the longest of them."""
    open_metrics = answers.loc[answers["verdict"] == UNDECIDED, "metric"]
    if LEVEL in performance and performance[LEVEL].notna().any():
        levels = [level for _label, level in performance.groupby(LEVEL, sort=False)]
    else:
        levels = [performance]
    return max(
        next_window_s(open_metrics, within_se_1s(level), restart_sd(level, order, reference), load_s, min_load_s)
        for level in levels
    )


def next_block_window(look_dir: Path, order: str, reference: str, load_s: int, min_load_s: int) -> int:
    """The window of the block after the look whose run directory is ``look_dir``
    (``layout.RunDir.look``), from its questions.csv and performance.csv (``look_window_s``);
    ``load_s`` where its tables lack what the rule reads."""
    files = RunDir(look_dir)
    questions, performance = files.table("questions"), files.table("performance")
    if not (questions.is_file() and performance.is_file()):
        return int(load_s)
    answers, table = sequential.read_answers(questions), _read_performance(performance)
    if "metric" not in answers or table is None:
        return int(load_s)  # tables without what the rule reads: the full window
    return look_window_s(table, answers, order, reference, load_s, min_load_s)


def _read_performance(path: Path) -> pd.DataFrame | None:
    """performance.csv with its numbers as numbers; None where it lacks a column the rule
    reads; a file that is not such a table is a UserError naming it."""
    try:
        table = pd.read_csv(io.BytesIO(read_bounded(path, MAX_TABLE_BYTES)), encoding="utf-8")
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not a performance table: {' '.join(str(error).split())[:200]}") from None
    if any(column not in table for column in [*PHASE_KEYS, *NUMBERS]):
        return None
    numbers = table[NUMBERS].apply(pd.to_numeric, errors="coerce")
    rep = numbers["rep"]
    if (numbers.isna() & table[NUMBERS].notna()).any().any() or rep.isna().any() or (rep != rep.round()).any():
        raise UserError(f"{path}: a column of {', '.join(NUMBERS)} holds a value that is not a number (rep: whole)")
    return table.assign(
        **numbers.astype({"rep": "int64"}), order=table["order"].astype(str), arm=table["arm"].astype(str)
    )


def _asked_windows(validity: pd.DataFrame) -> pd.Series:
    """The load window each phase of one run's ``validity`` was asked for, by PHASE_KEYS: the
    run's longest where a phase recorded none."""
    phases = validity.assign(rep=validity["rep"].astype("int64"), load_s=validity["load_s"].astype("float64"))
    lengths = phases.set_index(PHASE_KEYS)["load_s"]
    return lengths.fillna(lengths.max())


def full_window_phases(validity: pd.DataFrame) -> pd.DataFrame:
    """The rows of one run's ``validity`` of its longest window (a phase that recorded none
    counts as full): the phases heat and the other metrics outside BETWEEN_RESTARTS pool,
    and so the ones whose start temperatures must be balanced for them (a speed-only phase
    waits for no heat cooldown, by design)."""
    if "load_s" not in validity or validity["load_s"].isna().all():
        return validity
    asked = _asked_windows(validity)
    full: pd.DataFrame = validity[(asked >= asked.max()).to_numpy()]
    return full


def with_windows(values: pd.DataFrame, validity: pd.DataFrame) -> pd.DataFrame:
    """The per-phase metrics of one run (``run_analysis.run_metrics``'s rows, keyed by the run's
    own order), each with its phase's load window (``WINDOW``: the window asked, the run's
    longest where a phase recorded none), without the phases of a shorter window than the
    run's longest for every metric outside BETWEEN_RESTARTS.  The window is a term of the
    fits of the metrics pooled over windows (``stats``): a speed-only phase runs more probes
    beside the load, which moves a window's energy per token by itself, the same in both arms."""
    if "load_s" not in validity or validity["load_s"].isna().all() or values.empty:
        return values
    lengths = _asked_windows(validity)
    full = float(lengths.max())
    keys = pd.MultiIndex.from_frame(values[PHASE_KEYS].astype({"rep": "int64"}))
    asked = pd.Series(lengths.reindex(keys).to_numpy(), index=values.index).fillna(full)
    keep = values["metric"].isin(BETWEEN_RESTARTS) | ~(asked < full)
    return values.assign(**{WINDOW: asked})[keep].reset_index(drop=True)
