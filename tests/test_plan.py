from thermab.experiment.plan import BASELINE, phases, previous


def test_phases_repeat_every_arm_in_order():
    assert [p.id for p in phases("BA", 2)] == ["rep1-B", "rep1-A", "rep2-B", "rep2-A"]


def test_chain_starts_at_the_baseline_and_follows_the_order():
    assert previous("AB", 1, "A") == BASELINE
    assert previous("AB", 1, "B") == "rep1-A"
    assert previous("AB", 2, "A") == "rep1-B"
    assert previous("DCBA", 1, "A") == "rep1-B"


def test_raising_repeats_never_changes_earlier_links():
    assert [p.id for p in phases("AB", 5)][:6] == [p.id for p in phases("AB", 3)]
