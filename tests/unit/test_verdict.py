"""The verdict line (report/verdict.py), read from rows of questions.csv: the question's words
alone in at most 60 characters, every number in its unit (CPU in cores, stall gaps per
phase), the bound the interval must clear, the phases per arm, and for an open question what
would decide it; the caveats, method and balance stay in their own columns."""

import math

import pandas as pd

from thermab.analysis import questions, speed
from thermab.analysis.model import Plan
from thermab.report import analyze, verdict

NAN = math.nan


def row(**changes) -> dict:
    base = {
        "question": "head TSOC mean lower",
        "metric": "head TSOC mean",
        "arm": "B",
        "reference": "A",
        "kind": "lower",
        "margin": NAN,
        "estimate": -8.87,
        "ci_low": -9.4,
        "ci_high": -8.3,
        "level": 0.9,
        "method": "OLS arm + position, orders pooled",
        "phases_per_arm": 4,
        "verdict": "yes",
        "phases_needed": NAN,
        "unit": "°C",
        "better": "lower",
        "note": "",
        "balance": "",
    }
    return {**base, **changes}


def lines(*rows, command=""):
    return verdict.verdict_lines(pd.DataFrame(list(rows)), command)


def test_each_kind_of_question_in_its_unit():
    assert lines(row()) == ["YES — head TSOC mean lower: −8.9 °C [−9.4, −8.3 °C] vs margin 0 °C, 4 phases per arm"]
    cpu = row(question="head vLLM CPU median lower", estimate=-188.95, ci_low=-210.0, ci_high=-170.0)
    assert lines({**cpu, "unit": "% of one core"}) == [
        "YES — head vLLM CPU median lower: −1.89 cores (−189 % of one core) [−2.10, −1.70 cores]"
        " vs margin 0 cores, 4 phases per arm"
    ]
    stalls = row(
        question="stall gaps no worse than 0.5 (lower is better)",
        kind="non_inferior",
        margin=0.5,
        estimate=1.25,
        ci_low=0.75,
        ci_high=1.75,
        unit="gaps",
        verdict="no",
    )
    assert lines(stalls) == [
        "NO — stall gaps no worse than 0.5 (lower is better): +1.2 gaps per phase [+0.8, +1.8 gaps per phase]"
        " vs margin +0.5 gaps per phase, 4 phases per arm"
    ]
    speed = row(
        question="output throughput no worse than 5 % (higher is better)",
        kind="non_inferior",
        better="higher",
        margin=10.53,
        estimate=2.77,
        ci_low=-1.0,
        ci_high=6.5,
        unit="tok/s",
    )
    assert "+2.8 tok/s [−1.0, +6.5 tok/s] vs margin −10.5 tok/s" in lines(speed)[0]
    same = row(question="p99 ITL equivalent within ± 2", kind="equivalent", better="", margin=2.0, unit="ms")
    assert "vs margin ± 2.00 ms" in lines(same)[0]
    faster = row(question="probe decode speed higher by at least 1", kind="higher", better="higher", margin=1.0)
    assert "vs margin +1.0 °C" in lines(faster)[0]
    unknown = row(kind="non_inferior", margin=NAN)  # in % of a reference mean that cannot be told from zero
    assert "vs margin unknown," in lines(unknown)[0]


def test_an_open_question_says_what_decides_it_and_the_caveats_stay_out():
    one = row(verdict="undecided", ci_low=NAN, ci_high=NAN, phases_per_arm=1, note="one phase in an arm: no interval")
    need = row(verdict="undecided", phases_needed=14.0, ci_high=0.4)
    absent = row(verdict="undecided", estimate=NAN, ci_low=NAN, ci_high=NAN, phases_per_arm=0, note="no data")
    got = lines(one, need, absent, row(), command="`snakemake all` (at most 3.0 cluster-hours)")
    assert got == [
        "UNDECIDED — head TSOC mean lower: −8.9 °C [no interval] vs margin 0 °C, 1 phase per arm; to decide:"
        " a spread between phases needs at least two phases per arm, `snakemake all` (at most 3.0 cluster-hours)",
        "UNDECIDED — head TSOC mean lower: −8.9 °C [−9.4, +0.4 °C] vs margin 0 °C, 4 phases per arm; to decide:"
        " about 14 phases per arm at the spread seen, `snakemake all` (at most 3.0 cluster-hours)",
        "UNDECIDED — head TSOC mean lower: not measured in this run",  # no repeat measures what has no source
        "YES — head TSOC mean lower: −8.9 °C [−9.4, −8.3 °C] vs margin 0 °C, 4 phases per arm",
    ]
    assert not any("no data" in line or "no interval)" in line for line in got)


def test_the_label_is_at_most_sixty_characters_and_names_the_arm_and_level_where_there_are_several():
    long = "a zone named at length on a host named at length mean lower by at least 2"
    (line,) = lines(row(question=long))
    label = line.split(" — ", 1)[1].split(": ", 1)[0]
    assert len(label) == verdict.LABEL_CHARS and label.endswith("…") and long.startswith(label[:-1])
    several = lines(row(load_level="1 user"), row(arm="C", load_level="4 users"))
    assert several[0].startswith("YES — head TSOC mean lower (B vs A at 1 user): ")
    assert several[1].startswith("YES — head TSOC mean lower (C vs A at 4 users): ")


def test_a_table_written_before_the_unit_columns_gives_bare_numbers():
    old = {k: v for k, v in row().items() if k not in ("unit", "better", "note", "balance")}
    assert lines(old) == ["YES — head TSOC mean lower: −8.87 [−9.40, −8.30] vs margin 0, 4 phases per arm"]


def test_answers_carry_unit_direction_note_and_balance_in_their_own_columns():
    plan = Plan(
        {"reference_arm": "A", "arms": {"A": {}, "B": {}}, "hosts": {"head": {}}, "head": "head", "covariates": []}
    )

    def effect(diff, unit, n=4):
        se = 0.5 if n > 1 else NAN
        ref = {"mean": 80.0, "sd": 1.0, "n": n}
        return {"diff": diff, "se": se, "df": 5.0, "n": n, "ref_n": n, "ref": ref, "method": "Welch t", "unit": unit}

    asked = [
        {"metric": "output throughput", "kind": "non_inferior", "better": "higher", "margin_pct": 5},
        {"metric": "head TSOC mean", "kind": "lower"},
        {"metric": "stall gaps", "kind": "non_inferior", "better": "lower", "margin": 0.5},
    ]
    effects = {("output throughput", "B"): effect(-1.0, "tok/s"), ("head TSOC mean", "B"): effect(-3.0, "°C", n=1)}
    numbers = questions.answer(asked, effects, plan)
    assert list(numbers.columns) == questions.ANSWER_COLUMNS
    check = {"state": speed.BALANCED, "low_pct": -1.0, "high_pct": 2.0, "margin_pct": 5.0, "n": 4}
    answers = analyze.answers_in_words(numbers, speed.balance_frame({"B": check}, "A"), plan)
    assert list(answers.columns) == questions.QUESTION_COLUMNS
    answers = answers.set_index("metric")
    assert answers["question"].tolist() == [
        "output throughput no worse than 5 % (higher is better)",
        "head TSOC mean lower",
        "stall gaps no worse than 0.5 (lower is better)",
    ]
    assert answers["unit"].fillna("").tolist() == ["tok/s", "°C", ""]
    assert answers["better"].tolist() == ["higher", "lower", "lower"]
    assert answers.at["head TSOC mean", "note"] == "one phase in an arm: no interval"
    assert answers.at["stall gaps", "note"] == "no data for stall gaps in this run"
    assert answers.at["output throughput", "balance"] == (
        "acceptance length of B vs A: -1.0 % to +2.0 % (TOST at ± 5 %, 4 phases per arm): balanced"
    )
    assert answers.at["head TSOC mean", "balance"] == ""
