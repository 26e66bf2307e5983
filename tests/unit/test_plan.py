import math

from hypothesis import assume, given, settings, strategies as st

from thermab.config import thaw, view
from thermab.experiment import plan
from thermab.experiment.plan import (
    BASELINE,
    SPEED_ONLY_PROBE_AT,
    SPEED_ONLY_PROBES,
    levels,
    phases,
    previous,
    speed_only,
    with_load_s,
)
from thermab.load_levels import Level


def test_phases_repeat_every_arm_in_order():
    assert [p.id for p in phases("BA", 2)] == ["rep1-B", "rep1-A", "rep2-B", "rep2-A"]


def test_chain_starts_at_the_baseline_and_follows_the_order():
    assert previous("AB", 1, "A") == BASELINE
    assert previous("AB", 1, "B") == "rep1-A"
    assert previous("AB", 2, "A") == "rep1-B"
    assert previous("DCBA", 1, "A") == "rep1-B"


def test_raising_repeats_never_changes_earlier_links():
    assert [p.id for p in phases("AB", 5)][:6] == [p.id for p in phases("AB", 3)]


def test_a_views_levels_are_the_dicts():
    """The config's view holds ``load.users`` as a tuple of sections: the same levels."""
    load = {"users": [4, {"rate": 0.5, "users": 4}], "rate": None, "burstiness": 1.0, "think_s": None}
    assert levels(view({"load": load}).load) == levels(load) == [Level(4), Level(4, rate=0.5)]
    assert levels(view({"load": {**load, "users": 4}}).load) is None


def test_a_phase_jobs_window_is_a_new_view_the_configs_left_as_it_was():
    load = {"probe": True, "probe_n": 3, "probe_at": 0.6}
    config = view({"timings": {"load_s": 600, "baseline_s": 60}, "order": "AB", "load": load})
    assert with_load_s(config, 600) == config and not speed_only(config, 600)
    job = with_load_s(config, 150.0)
    assert job.timings.load_s == 150 and isinstance(job.timings.load_s, int)
    # a shorter window is speed-only: more probes, from early in the window
    assert speed_only(config, 150)
    assert thaw(job) == {
        "timings": {"load_s": 150, "baseline_s": 60},
        "order": "AB",
        "load": {"probe": True, "probe_n": 3 * SPEED_ONLY_PROBES, "probe_at": SPEED_ONLY_PROBE_AT},
    }
    assert config.timings.load_s == 600 and config.load.probe_n == 3
    many = view({"timings": {"load_s": 600}, "load": {**load, "probe_n": 90}})
    assert with_load_s(many, 150).load.probe_n == 100  # the schema's most
    unprobed = view({"timings": {"load_s": 600}, "load": {**load, "probe": False}})
    assert with_load_s(unprobed, 150).load.probe_n == 3


def test_a_speed_only_phase_cools_only_until_nothing_throttles(tmp_path):
    from support.paths import default_config
    from thermab.config import validate
    from thermab.contracts import Preflight, Safety
    from thermab.experiment.cluster import ClusterRun
    from thermab.experiment.phase import THROTTLE_MARGIN_C, cooldown_target

    config = view(validate(default_config()))
    heat = ClusterRun(config, "sim", "AB", tmp_path, tmp_path)
    speed = ClusterRun(config, "sim", "AB", tmp_path, tmp_path, speed_only=True)
    Preflight(safety=Safety(lowest_trip_point_c=104.8)).write(speed.files.preflight)
    assert cooldown_target(heat) == (config.timings.cooldown_below_c, "")
    target, why = cooldown_target(speed)
    assert target == 104.8 - THROTTLE_MARGIN_C and "speed-only phase" in why
    Preflight(safety=Safety()).write(speed.files.preflight)  # no trip point found: the heat cooldown
    assert cooldown_target(speed) == (config.timings.cooldown_below_c, "")


def _snakemake_reads(entry: str):
    from snakemake.cli import parse_config

    return parse_config([f"key={entry}"])["key"]


@settings(deadline=None)  # the first example imports Snakemake's parser
@given(typed=st.one_of(st.text(), st.from_regex(r"\{[a-z]+: [^,{}]*\}|\[[^\[\],]*\]", fullmatch=True)))
def test_a_config_entry_is_recorded_as_text_snakemake_reads_back_to_what_it_was(typed):
    """What Snakemake's --config parser made of what a user typed, written as text in
    run.json's ``overrides``, is read by that parser as the same value: the command that
    continues a run gives the run's own budget, load or cluster again, on one line."""
    try:
        value = _snakemake_reads(typed)
    except (ValueError, AssertionError):  # Snakemake refuses it: no run is started with it
        return
    # no text gives the empty string back (Snakemake strips quotes), and no config key takes it
    assume(value != "")
    text = plan.override_text(value)
    if not text.isprintable():  # it could not be printed into that command: the run is refused
        assert plan.invocation_problems(plan.invocation([], 1, {"key": value}))
        return
    read = _snakemake_reads(text)
    assert read == value or (isinstance(value, float) and math.isnan(value) and math.isnan(read))


def test_the_entries_that_continue_a_run_are_its_own_but_those_the_continuation_sets():
    recorded = plan.invocation([], 2, {"budget_hours": 6.5, "until": "decided", "repeats": 3, "load_s": 300})
    assert recorded["overrides"] == {"budget_hours": "6.5", "until": "decided", "repeats": "3", "load_s": "300"}
    assert plan.continuation_entries(recorded["overrides"]) == ["budget_hours=6.5", "load_s=300"]
    assert plan.invocation_problems(recorded) == []
    assert plan.invocation_problems({"overrides": {"budget_hours": "6`rm`"}}) == [
        "--config entry 'budget_hours' (run.json's overrides): must be one printable line without a backtick"
    ]
    assert plan.invocation_problems({"overrides": ["budget_hours=6"]}) != []
