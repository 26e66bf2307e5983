"""Clock offsets, NTP-style (hosts/clock.py): the estimator, drift, and the measuring loop."""

import pytest

from thermab.hosts import clock
from thermab.hosts.transport import LocalTransport, TransportError


def test_the_smallest_round_trip_wins_and_bounds_the_offset():
    samples = [
        clock.Sample(100.0, 105.30, 100.40),  # slow: midpoint 100.20
        clock.Sample(101.0, 106.02, 101.04),  # fast: midpoint 101.02
        clock.Sample(102.0, 107.50, 102.90),
    ]
    best = clock.estimate(samples)
    assert best.offset_s == pytest.approx(5.0) and best.uncertainty_s == pytest.approx(0.02)
    assert best.samples == 3


def test_an_asymmetric_delay_stays_inside_the_stated_uncertainty():
    # true offset 2 s; the request takes 30 ms, the answer 1 ms
    sample = clock.Sample(sent=10.0, remote=10.030 + 2.0, received=10.031)
    found = clock.estimate([sample])
    assert abs(found.offset_s - 2.0) <= found.uncertainty_s


def test_drift_is_reported_only_beyond_both_uncertainties():
    start = clock.Offset(0.010, 0.002, 8)
    assert clock.drift(start, clock.Offset(0.013, 0.002, 8)) is None
    assert clock.drift(start, clock.Offset(0.020, 0.002, 8)) == pytest.approx(0.010)


def test_exchange_times_each_answer():
    ticks = iter([1.0, 1.5, 2.0, 2.2])
    replies = iter(["11.25", "12.1"])
    samples = clock.exchange(lambda data: None, lambda: next(replies), 2, now=lambda: next(ticks))
    assert samples == [clock.Sample(1.0, 11.25, 1.5), clock.Sample(2.0, 12.1, 2.2)]


def test_a_date_without_fractions_falls_back_to_python(monkeypatch):
    monkeypatch.setattr(clock, "DATE_LOOP", "while read -r _; do date +%s.N; done")
    found = clock.measure(LocalTransport("here"), n=3)
    assert found.samples == 3 and abs(found.offset_s) <= 0.02


def test_no_clock_at_all_names_the_host(monkeypatch):
    monkeypatch.setattr(clock, "DATE_LOOP", "while read -r _; do echo soon; done")
    with pytest.raises(TransportError, match="host here: no clock reading"):
        clock.measure(LocalTransport("here"), n=2, python="no-such-python")
