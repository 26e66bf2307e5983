"""Planning a study from a run (``python -m thermab plan``), its cluster-time budget and the
throughput counted in the window: what a run says it would take to decide its questions,
checked against the run it is read from (the power, against simulated studies:
integration/test_planning_runs.py)."""

import copy
import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from support.paths import REPO as ROOT, default_config
from support.synthetic_run import PHASE_S, plan_view, write_synthetic_run
from thermab.__main__ import main
from thermab.analysis import metrics, phase_length, planning, questions, run_analysis, sequential
from thermab.analysis.model import Plan, load_run, read_events
from thermab.config import ConfigError, validate
from thermab.experiment import plan as experiment_plan
from thermab.report import plan_words

DEFAULT = default_config()


@pytest.fixture
def raw():
    return copy.deepcopy(DEFAULT)


def test_timings_are_the_runs_own_and_cluster_hours_scale_them(tmp_path):
    run = load_run(write_synthetic_run(tmp_path / "AB", reps=2))
    timings = planning.measured_timings(run.events, time_scale=30)
    # each synthetic job: restart_start, 15 s to load_start, PHASE_S of load, 120 s of cooldown
    assert timings.job_s == pytest.approx(15 + PHASE_S + 120) and timings.jobs == 4
    assert timings.baseline_s == pytest.approx(50)
    assert timings.hours(4, 2) == pytest.approx((50 + 8 * 435) * 30 / 3600)
    # a budget buys at least one crossover pair (2 repeats of 2 arms at 435 s, ×30, is 14.5 h),
    # then single repeats: the looks test after every one
    assert timings.repeats_within(14.0, 2) == 0
    assert timings.repeats_within(20.0, 2) == 2
    assert timings.repeats_within(40.0, 2) == 5
    assert planning.measured_timings(run.events.iloc[:0]) is None


def test_throughput_in_the_window_counts_each_requests_share(tmp_path):
    run = load_run(write_synthetic_run(tmp_path / "AB", tok_s={"A": 85.0, "B": 92.0}))
    windows = metrics.load_windows(run.events)
    performance = metrics.performance(run.requests, windows).set_index("arm")
    # a closed loop at 85 and 92 tok/s (the fixture's first request of each user is shorter
    # than the others but as long in tokens: a few % more in the window's first seconds)
    in_window = performance["output_tok_s_in_window"]
    assert in_window.to_dict() == pytest.approx({"A": 85.0, "B": 92.0}, rel=0.04)
    assert in_window["B"] / in_window["A"] == pytest.approx(92 / 85, rel=0.005)
    pooled = run_analysis.run_metrics(run, run_analysis.phase_tables(run))
    throughput = pooled[pooled["metric"] == "output throughput"].set_index("arm")["value"]
    assert throughput.to_dict() == pytest.approx(performance["output_tok_s_in_window"].to_dict())


def test_one_phase_per_arm_says_what_it_cannot_estimate_and_what_one_more_pair_gives(tmp_path, capsys):
    path = write_synthetic_run(tmp_path / "AB", reps=1)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "One phase per arm: the spread between restarts cannot be estimated" in out
    assert "2 phases per arm" in out and "1 residual df" in out and "3 phases per arm" in out and "3 residual df" in out
    # speed plans on the field's restart spread, labelled as assumed; heat says where its spread is measured
    throughput = next(line for line in out.splitlines() if line.startswith("- output throughput"))
    assert "restart CV 7.5 % assumed (vLLM's at 4 streams" in throughput and "cluster-hours" in throughput
    assert " tok/s (restart CV" in throughput and " tok/s from the decisive bound" in throughput  # in units
    heat = next(line for line in out.splitlines() if line.startswith("- head TSOC mean"))
    assert "measured at the first look of until: decided that tests (3 repeats" in heat
    assert "no spread to plan on" not in out


def test_a_restart_cv_plans_speed_questions_and_a_budget_names_what_is_out_of_reach(tmp_path, capsys):
    path = write_synthetic_run(tmp_path / "AB", reps=1, tok_s={"A": 85.0, "B": 85.0})
    assert main(["plan", str(path), "--restart-cv", "7", "--hours", "0.6"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("- output throughput"))
    # 5 % margin at 7 % restart CV (within-phase spread added): d ≈ 0.7, about 26 phases per arm
    assert "restart CV 7 % assumed" in line
    needed = int(line.split("by ")[1].split(" phases per arm")[0])
    assert 24 <= needed <= 30
    assert "out of reach in the budget" in line and "the smallest margin decided at this estimate is" in line


def test_bad_hours_are_refused_in_one_line():
    for bad in ("nan", "inf", "0", "-1", "x"):
        with pytest.raises(SystemExit) as stop:
            main(["plan", "somewhere", "--hours", bad])
        assert stop.value.code == 2


def test_the_smallest_margin_a_budget_decides_is_the_one_it_needs():
    question = {"metric": "m", "kind": "non_inferior", "better": "higher", "margin": 0.0}
    for repeats in (4, 8, 16):
        distance = planning.smallest_effect(repeats)
        margin = planning.smallest_margin(question, -0.3, distance)
        needed = questions.phases_needed(questions.decisive_distance("non_inferior", 1, margin, -0.3), 1.0)
        assert needed == pytest.approx(repeats, abs=1)
    equivalence = {"metric": "m", "kind": "equivalent", "margin": 0.0}
    assert planning.smallest_margin(equivalence, -0.3, 1.0) == pytest.approx(1.3)


def test_an_estimate_on_the_margin_is_out_of_reach():
    effect = {
        "diff": -1.0,
        "se": 0.5,
        "df": 5,
        "method": "Welch t",
        "n": 4,
        "ref_n": 4,
        "ref": {"mean": 20.0, "sd": 1.0, "n": 4, "cv_pct": 5.0},
        "unit": "tok/s",
    }
    run = Plan({"reference_arm": "A", "arms": {"A": {}, "B": {}}, "order": "AB"})
    question = {"metric": "m", "kind": "non_inferior", "better": "higher", "margin": 1.0}
    rows = planning.plan_rows([question], {("m", "B"): effect}, run, planning.Timings(0, 3600, 4), hours=100)
    assert rows.loc[0, "reach"].startswith("out of reach: the estimate lies on the margin")
    assert math.isnan(rows.loc[0, "phases_needed"])


# The budget's runs below: full windows of 60 s with a heat cooldown of at most 40 s (the
# config's price of a full job, 100 s) and speed-only windows of 40 s (their price, 40 s).
FULL = planning.NextJobs(window_s=60, load_s=60, cooldown_max_s=40)
SPEED_ONLY = planning.NextJobs(window_s=40, load_s=60, cooldown_max_s=40)


def budget_run(path, jobs_s):
    """A run directory of the phase jobs ``jobs_s`` (rep → (window asked, seconds of each
    of its two jobs)) after a baseline of 100 s: their phase records, events, and
    questions.csv with a question still open after them."""
    path.mkdir(parents=True)
    events = [{"t": 0.0, "event": "baseline_start"}, {"t": 100.0, "event": "baseline_end"}]
    t = 100.0
    for rep, (window, seconds) in jobs_s.items():
        for arm, job_s in zip(sequential.order_of_repeat("AB", rep), seconds, strict=True):
            (path / "phases" / f"rep{rep}-{arm}").mkdir(parents=True)
            (path / "phases" / f"rep{rep}-{arm}" / "phase.json").write_text(json.dumps({"load_s": window}))
            keys = {"order": "AB", "rep": rep, "arm": arm}
            events += [{"t": t, "event": "restart_start", **keys}, {"t": t + job_s, "event": "cooldown_end", **keys}]
            t += job_s
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (path / "tables").mkdir()
    answers = pd.DataFrame({"metric": ["output throughput"], "phases_per_arm": [len(jobs_s)], "verdict": ["undecided"]})
    answers.to_csv(path / "tables" / "questions.csv", index=False)
    return path, answers


def windows_of(path):
    return experiment_plan.recorded_windows(path, "AB", 8, crossover=True)


def test_the_budget_stops_when_the_next_look_cannot_fit(tmp_path):
    path, _answers = budget_run(tmp_path / "AB", {rep: (60, (900, 900)) for rep in range(1, 5)})
    # 4 repeats took 8 × 900 s + 100 s = 2.03 h; the next look (1 repeat) needs 0.5 h more
    # at the measured full job
    assert planning.resume_within_budget(path, "AB", 8) == 5
    assert planning.resume_within_budget(path, "AB", 8, budget_hours=2.6, jobs=FULL) == 5
    assert planning.resume_within_budget(path, "AB", 8, budget_hours=2.5, jobs=FULL) == 4
    # a speed-only look, none of whose kind ran, at the config's price of its window: 2 × 40 s
    assert planning.resume_within_budget(path, "AB", 8, budget_hours=2.06, jobs=SPEED_ONLY) == 5
    assert planning.resume_within_budget(path, "AB", 8, budget_hours=2.04, jobs=SPEED_ONLY) == 4
    check = planning.run_budget_check(path, "AB", None, FULL, 4, 5, 2.5)
    assert not check.fits and round(check.used, 2) == 2.03 and check.need == pytest.approx(0.5)
    assert check.measured and check.job_s == 900
    sentence = plan_words.budget_sentence(check)
    assert "does not fit" in sentence and "2.03 used" in sentence
    assert "0.50 h at the median 900 s of this run's full phase jobs" in sentence
    check = planning.run_budget_check(path, "AB", None, SPEED_ONLY, 4, 5, 2.06)
    assert check.fits and not check.measured and check.job_s == 40
    assert "the config's price of at most 40 s per speed-only phase job (none measured yet)" in (
        plan_words.budget_sentence(check)
    )


def test_full_jobs_only_price_a_full_look_at_their_median_and_a_speed_only_one_at_its_window(tmp_path):
    path, _answers = budget_run(tmp_path / "AB", {1: (60, (85, 88)), 2: (60, (90, 86)), 3: (60, (89, 87))})
    events = read_events(path / "events.jsonl")
    assert planning.job_price(events, windows_of(path), FULL) == (87.5, True)
    assert planning.job_price(events, windows_of(path), SPEED_ONLY) == (40, False)
    # a job of a repeat whose window no phase record holds ran the full window
    assert planning.job_price(events, {}, FULL) == (87.5, True)


def test_a_speed_only_look_is_priced_at_the_speed_only_jobs_never_the_full_ones(tmp_path):
    jobs = {1: (60, (85, 88)), 2: (60, (90, 86)), 3: (60, (89, 87)), 4: (40, (46, 51)), 5: (40, (45, 49))}
    path, _answers = budget_run(tmp_path / "AB", jobs)
    events, windows = read_events(path / "events.jsonl"), windows_of(path)
    assert windows == {1: 60, 2: 60, 3: 60, 4: 40, 5: 40}
    # the speed-only jobs' median, above the config's 40 s (their restart and the wait for
    # the requests in flight), far below the median of all ten jobs
    assert planning.job_price(events, windows, SPEED_ONLY) == (47.5, True)
    assert planning.measured_timings(events).job_s == 85.5
    assert planning.job_price(events, windows, FULL) == (87.5, True)
    # two levels of load: each job ran both, and its measured seconds hold both
    assert planning.job_price(events, windows, dataclasses.replace(SPEED_ONLY, levels=2)) == (47.5, True)
    check = planning.budget_check(events, windows, SPEED_ONLY, 2, 5, 6, 10.0)
    assert check.job_s == 47.5 and check.need == pytest.approx(2 * 47.5 / 3600) and check.speed_only


def test_with_no_job_measured_the_price_is_the_configs_and_the_first_look_runs(tmp_path):
    path, _answers = budget_run(tmp_path / "AB", {})
    events = read_events(path / "events.jsonl")
    assert planning.job_price(events, {}, FULL) == (100, False)
    assert planning.job_price(events, {}, SPEED_ONLY) == (40, False)
    assert planning.job_price(events, {}, dataclasses.replace(SPEED_ONLY, levels=3)) == (120, False)
    assert planning.budget_check(events, {}, FULL, 2, 0, 3, 0.01) is None


def test_the_summary_words_the_numbers_the_budget_stop_acted_on(tmp_path):
    """The stop (report/look.py: the look's window, ``resume_within_budget``) and summary.md's
    budget sentence (``plan_words.next_look_check``) price the next look alike."""
    rng = np.random.default_rng(3)
    jobs = {1: (60, (85, 88)), 2: (60, (90, 86)), 3: (60, (89, 87)), 4: (40, (46, 51))}
    path, answers = budget_run(tmp_path / "AB", jobs)
    performance = pd.DataFrame(
        [
            {"order": "AB", "rep": rep, "arm": arm, "window_s": float(window), "output_tok_s_se": 2.0}
            for rep, (window, _seconds) in jobs.items()
            for arm in "AB"
        ]
    ).assign(output_tok_s_in_window=lambda frame: 215 + rng.normal(0, 16, len(frame)))
    performance.to_csv(path / "tables" / "performance.csv", index=False)
    window = phase_length.next_block_window(path, "AB", "A", 60, 40)
    assert window == 40  # speed only: the floor
    used = (100 + sum(sum(seconds) for _window, seconds in jobs.values())) / 3600
    for budget, goes_on in ((used + 2 * 48.5 / 3600, True), (used + 2 * 48 / 3600, False)):
        plan = plan_view(
            until="decided", max_repeats=8, budget_hours=budget, load_s=60, min_load_s=40, cooldown_max_s=40
        )
        stop = dataclasses.replace(SPEED_ONLY, window_s=window)
        reached = planning.resume_within_budget(path, "AB", 8, None, budget, 1.0, stop)
        check = plan_words.next_look_check(plan, path, performance, answers, 4)
        assert (reached == 5) == goes_on == check.fits
        assert check.job_s == 48.5 and check.measured and check.speed_only and check.target == 5
        sentence = plan_words.budget_sentence(check)
        assert "the median 48 s of this run's speed-only phase jobs" in sentence
        assert sentence.endswith(" fits.") == goes_on
    # a run.json of another tool's, without the timings that price a window: no account
    assert (
        plan_words.next_look_check(plan_view(until="decided", budget_hours=1.0), path, performance, answers, 4) is None
    )


@pytest.mark.parametrize(
    "budget, fragment",
    [
        (float("nan"), "not a finite number"),
        (float("inf"), "not a finite number"),
        (0, "budget_hours"),
        (-1.0, "budget_hours"),
        (0.5, "less than one pair of phases"),
    ],
)
def test_a_bad_budget_is_a_one_line_config_error(raw, budget, fragment):
    bad = copy.deepcopy(raw)
    bad.update(until="decided", budget_hours=budget)
    with pytest.raises(ConfigError) as error:
        validate(bad, ROOT)
    assert "budget_hours" in str(error.value) and fragment in str(error.value)
    assert "\n" not in str(error.value)


def test_a_budget_without_until_decided_is_refused(raw):
    with pytest.raises(ConfigError, match="budget_hours"):
        validate({**raw, "budget_hours": 8}, ROOT)


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_budget_hours_is_accepted_exactly_when_it_fits_one_pair(budget):
    config = {**copy.deepcopy(DEFAULT), "until": "decided", "budget_hours": budget}
    timings = DEFAULT["timings"]
    floor = (timings["baseline_s"] + 2 * timings["load_s"]) * timings["time_scale"] / 3600
    fits = math.isfinite(budget) and 0 < budget <= 1e6 and budget >= floor
    try:
        validate(config, ROOT)
        accepted = True
    except ConfigError as error:
        assert "budget_hours" in str(error) and "\n" not in str(error)
        accepted = False
    assert accepted == fits


@settings(max_examples=80, deadline=None)
@given(
    budget=st.floats(0.2, 200.0),
    max_repeats=st.integers(4, 100),
    repeats=st.integers(1, 4),  # at most max_repeats: a config below is refused
    cooldown_max_s=st.floats(1.0, 600.0),
)
def test_a_budget_lowers_max_repeats_to_the_repeats_it_fits_at_the_configs_timings(
    budget, max_repeats, repeats, cooldown_max_s
):
    """The validated ``max_repeats`` is the most repeats whose study fits the budget, each
    phase up to the first testing look (3 repeats) at its load and a full cooldown, and
    after it at the shortest window with no heat cooldown: one more would not (unless
    ``max_repeats`` or the floor of ``repeats`` and one pair set it)."""
    raw = copy.deepcopy(DEFAULT)
    raw.update(until="decided", budget_hours=budget, max_repeats=max_repeats, repeats=repeats)
    raw["timings"]["cooldown_max_s"] = cooldown_max_s
    timings = raw["timings"]
    if budget < (timings["baseline_s"] + 2 * timings["load_s"]) * timings["time_scale"] / 3600:
        return  # below one pair: refused (the test above)
    fitted = validate(raw, ROOT)["max_repeats"]

    def hours(r):
        full, speed_only = min(r, 3), max(0, r - 3)
        seconds = full * 2 * (timings["load_s"] + cooldown_max_s) + speed_only * 2 * timings["min_load_s"]
        return (timings["baseline_s"] + seconds) * timings["time_scale"] / 3600

    floor = max(2, repeats)
    assert fitted <= max_repeats and fitted >= min(floor, max_repeats)
    if fitted > floor:
        assert hours(fitted) <= budget + 1e-9
    if fitted < max_repeats:
        assert fitted == floor or hours(fitted + 1) > budget


def test_without_a_budget_max_repeats_is_as_given():
    raw = {**copy.deepcopy(DEFAULT), "until": "decided", "max_repeats": 12}
    assert validate(raw, ROOT)["max_repeats"] == 12


def test_plan_of_a_directory_that_is_no_run_is_one_line(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "nothing-here")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "nothing-here" in error


def test_the_plans_repeats_bound_is_the_schemas():
    schema = yaml.safe_load((ROOT / "workflow" / "thermab" / "config.schema.yaml").read_text())
    assert planning.MAX_REPEATS == schema["properties"]["max_repeats"]["maximum"]


def test_a_budget_never_offers_a_margin_of_zero_and_says_out_of_reach_once(tmp_path, capsys):
    path = write_synthetic_run(tmp_path / "AB", reps=4)
    assert main(["plan", str(path), "--hours", "8"]) == 0
    out = capsys.readouterr().out
    assert "is 0 (" not in out and "any margin above 0 is decided" in out
    assert main(["plan", str(path), "--hours", "0.1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("- ") and "No data" not in line]
    assert lines and all(line.lower().count("out of reach") == 1 for line in lines), lines
    # an estimate on the margin: out of reach at any number of phases, said once, the budget's reach beside it
    plan = Plan({"order": "AB", "arms": {"A": {"label": "stock"}, "B": {"label": "patched"}}, "reference_arm": "A"})
    row = dict.fromkeys(planning.PLAN_COLUMNS, math.nan)
    row.update(
        question="output throughput no worse than 5 %",
        metric="output throughput",
        arm="B",
        kind="non_inferior",
        verdict="undecided",
        phases_per_arm=4,
        sd_from="measured between phases",
        planned_sd=1.0,
        estimate=-5.0,
        distance=0.0,
        reach="out of reach: the estimate lies on the margin, no number of phases decides it at this estimate",
        budget_repeats=8,
        budget_distance=1.2,
        smallest_margin=6.2,
        smallest_margin_pct=6.2,
    )
    line = plan_words.plan_lines(pd.DataFrame([row]), plan, None, hours=8)[-1]
    assert line.lower().count("out of reach") == 1 and "the smallest margin decided at this estimate is 6.2" in line
    # a superiority question no `by` of which a yes clears, needing more repeats than the budget runs
    lower = {
        **row,
        "question": "cluster energy per token lower",
        "kind": "lower",
        "estimate": -0.06,
        "distance": 0.06,
        "phases_needed": 31.0,
        "repeats_needed": 32.0,
        "reach": "reachable",
        "budget_repeats": 4,
        "budget_distance": 0.18,
        "smallest_margin": math.nan,
        "smallest_margin_pct": math.nan,
    }
    line = plan_words.plan_lines(pd.DataFrame([lower]), plan, None, hours=8)[-1]
    assert line.endswith(
        "In 8 h: 4 phases per arm decide 0.18 from the bound; a yes clears no `by` at this estimate;"
        " out of reach in the budget: it needs 32 repeats."
    )
    # a margin that would show as 0 is never the smallest decided: any margin above it is
    for kind, words in (("non_inferior", "any margin above 0 is decided"), ("lower", "clears no `by` above 0")):
        zero = {**lower, "kind": kind, "smallest_margin": 0.0, "smallest_margin_pct": 0.0}
        line = plan_words.plan_lines(pd.DataFrame([zero]), plan, None, hours=8)[-1]
        assert words in line and " 0 (" not in line and "up to 0" not in line
    # a plan with no spread yet keeps its reason, the budget that fits no block says its own once
    unknown = {
        **row,
        "planned_sd": math.nan,
        "phases_needed": math.nan,
        "reach": "its spread between restarts is measured at the first look of until: decided that tests",
        "budget_repeats": 0,
    }
    line = plan_words.plan_lines(pd.DataFrame([unknown]), plan, None, hours=1)[-1]
    assert "Its spread between restarts is measured at the first look" in line
    assert line.endswith("In 1 h: out of reach: the budget does not fit one crossover block of 2 repeats.")


def test_cluster_hours_are_named_as_the_runs_measured_phase_times_scaled(tmp_path, capsys):
    path = write_synthetic_run(tmp_path / "AB", reps=2)
    assert main(["plan", str(path), "--time-scale", "30"]) == 0
    first = capsys.readouterr().out.splitlines()[2]
    assert first.startswith("Cluster-hours are this run's measured phase times × its time scale: a phase job")
    assert "× 30 study seconds per second of the run" in first and "not of your cluster" not in first
    # on the simulated cluster: the simulated study's timings, not the user's cluster's
    (path / "preflight.json").write_text(json.dumps({"hosts": {"head": {"simulated": True}}}))
    assert main(["plan", str(path), "--time-scale", "30"]) == 0
    first = capsys.readouterr().out.splitlines()[2]
    assert "On the simulated cluster these are the timings of the study it simulates, not of your cluster" in first


def test_a_job_costs_the_cluster_time_from_the_end_of_what_came_before_it():
    """A look's analysis between two jobs is cluster time the next job adds, as its restart is."""

    def mark(t, event, rep=None, arm=None):
        return {"t": t, "event": event, "order": "AB", "rep": rep, "arm": arm}

    events = pd.DataFrame(
        [
            mark(0.0, "baseline_start"),
            mark(20.0, "baseline_end"),
            mark(25.0, "restart_start", 1, "A"),
            mark(100.0, "cooldown_end", 1, "A"),
            mark(130.0, "restart_start", 1, "B"),  # 30 s of a look's analysis before it
            mark(200.0, "cooldown_end", 1, "B"),
        ]
    )
    assert planning.measured_jobs(events).tolist() == [80.0, 100.0]
