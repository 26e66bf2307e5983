"""Plans checked against what they plan: a fixed crossover study of the repeats a plan asks
for decides at about the power planned (simulated), and a synthetic run's summary plans
its open questions and gives the commands that would decide them."""

import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from support.crossover import PERIOD, design, least_squares
from support.synthetic_run import write_synthetic_run
from thermab.analysis import questions
from thermab.report import analyze


def simulated_power(d: float, repeats: int, n: int = 4000, seed: int = 3) -> np.ndarray:
    """Decisions of ``n`` fixed crossover studies of ``repeats`` repeats (OLS arm + position,
    one test at α) whose true distance from the decisive bound is ``d`` sd of a phase."""
    is_b, position = design(repeats)
    y = np.random.default_rng(seed).normal(size=(n, len(is_b))) + d * is_b + PERIOD * position
    estimate, se, df = least_squares(y, is_b, position)
    half = questions.interval(0.0, 1.0, df, questions.ALPHA)[1]
    return estimate - half * se > 0


@pytest.mark.parametrize("d", [0.7, 1.0, 1.5, 2.5])
def test_a_planned_study_decides_at_about_its_planned_power(d):
    needed = questions.phases_needed(d, 1.0)
    repeats = int(math.ceil(needed / 2) * 2)
    decided = simulated_power(d, repeats)
    low, high = proportion_confint(decided.sum(), len(decided), method="wilson")
    power = f"power {decided.mean():.3f} (95 % Wilson {low:.3f}–{high:.3f})"
    print(f"d = {d}: plan {needed:.0f} phases per arm, {repeats} repeats: {power}")
    # the plan's solver has 2n − 2 df, the fit 2n − 3, and a plan runs whole blocks: at least
    # the planned power, less a df's worth
    assert 0.77 <= decided.mean() <= 0.93


def test_the_summary_plans_the_open_questions_and_gives_the_commands(tmp_path):
    path = write_synthetic_run(tmp_path / "AB", reps=1)
    analyze.analyze(path)
    text = (path / "summary.md").read_text()
    section = text.split("## What would decide the open questions")[1].split("\n## ")[0]
    assert "One phase per arm: the spread between restarts cannot be estimated" in section
    # probe speed at the field's 7.5 % restart CV, assumed: 21 phases per arm, 22 repeats in pairs
    assert "Decided at 80 % power by 21 phases per arm: 22 repeats" in section
    # the command is evidence.md's: no spread measured yet, so the schema's default cap
    # priced at the run's measured jobs, each from the end of the one before it: 8 repeats of
    # 2 phases at the median 438 s and the 50-s baseline, 2.0 cluster-hours
    command = "`snakemake --cores 1 all --config until=decided max_repeats=8` (at most 2.0 cluster-hours"
    assert f"To run it, resuming from the phases on disk (`budget_hours=H` caps its cluster time): {command}" in section
    assert command in (path / "evidence.md").read_text()
    assert f"python -m thermab plan {path} --hours H" in section
    decided = write_synthetic_run(
        tmp_path / "decided" / "AB", reps=4, power={("head", "node"): {"A": 90, "B": 80, "idle": 50}}
    )
    analyze.analyze(decided)
    answers = pd.read_csv(decided / "tables" / "questions.csv")
    assert (answers["verdict"] != "undecided").all(), answers[["question", "verdict"]]
    assert "What would decide the open questions" not in (decided / "summary.md").read_text()
