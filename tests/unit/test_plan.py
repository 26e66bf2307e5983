from thermab.config import thaw, view
from thermab.experiment.plan import BASELINE, levels, phases, previous, with_load_s
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
    config = view({"timings": {"load_s": 600, "baseline_s": 60}, "order": "AB"})
    job = with_load_s(config, 150.0)
    assert job.timings.load_s == 150 and isinstance(job.timings.load_s, int)
    assert thaw(job) == {"timings": {"load_s": 150, "baseline_s": 60}, "order": "AB"}
    assert config.timings.load_s == 600
