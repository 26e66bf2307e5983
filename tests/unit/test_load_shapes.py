"""Load shapes (thermab.load.shapes): the draws of arrivals and think times, the rule that
judges a phase by its shape (simulated for its false alarms), and the config's refusal of
a rate, think time or burstiness that cannot be one."""

import copy
import itertools
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from support.paths import REPO as ROOT
from thermab import load_levels
from thermab.config import ConfigError, validate
from thermab.load import shapes, validity
from thermab.load.runner import LoadSpec, locust_command

RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def gaps(rate, burstiness, seed=0, n=20000):
    times = np.fromiter(itertools.islice(shapes.arrival_stream(rate, burstiness, seed), n), float)
    return np.diff(np.concatenate([[0.0], times]))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrivals_have_the_rate_and_the_spread_of_their_burstiness(burstiness):
    drawn = gaps(2.0, burstiness)
    assert drawn.mean() == pytest.approx(0.5, rel=0.05)
    # a gamma of shape k has a coefficient of variation 1/√k: Poisson 1, burstier above
    assert drawn.std() / drawn.mean() == pytest.approx(burstiness**-0.5, rel=0.05)


def test_draws_are_the_same_in_every_arm_and_differ_by_seed_and_slot():
    assert (gaps(1.0, 1.0, seed=7, n=50) == gaps(1.0, 1.0, seed=7, n=50)).all()
    assert not (gaps(1.0, 1.0, seed=7, n=50) == gaps(1.0, 1.0, seed=8, n=50)).all()
    user = [list(itertools.islice(shapes.think_stream(2.0, 0, u), 5)) for u in (1, 1, 2)]
    assert user[0] == user[1] != user[2]
    thinks = np.fromiter(itertools.islice(shapes.think_stream(2.0, 0, 1), 20000), float)
    assert thinks.mean() == pytest.approx(2.0, rel=0.05) and thinks.std() == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("expected", [10, 100, 1000])
def test_the_rate_rule_rarely_refuses_a_client_that_kept_its_schedule(burstiness, expected):
    """False alarms of the achieved-rate rule over 1000 simulated windows of a gamma renewal
    process that the client followed exactly: at most 1 % (3 sd, or 5 % when wider)."""
    rng = np.random.default_rng(1)
    rate, window = 2.0, expected / 2.0
    n = int(expected + 10 * math.sqrt(expected / burstiness) + 50)
    arrivals = np.cumsum(rng.gamma(burstiness, 1 / (rate * burstiness), size=(1000, n)), axis=1)
    assert (arrivals[:, -1] >= window).all()  # every window's arrivals drawn to its end
    achieved = (arrivals < window).sum(axis=1) / window
    tolerance = shapes.tolerance(rate * window, burstiness**-0.5)
    assert (np.abs(achieved / rate - 1) > tolerance).mean() <= 0.01


def test_the_think_rule_rarely_refuses_think_times_as_drawn():
    rng = np.random.default_rng(2)
    for n in (5, 50, 500):
        means = rng.exponential(3.0, size=(4000, n)).mean(axis=1)
        assert (np.abs(means / 3.0 - 1) > shapes.tolerance(n, 1.0)).mean() <= 0.01


def frame(rows):
    records = [
        {
            "kind": "load",
            "user": 1,
            "tag": f"[u1#{i}]",
            "t_first_token": row["t_start"] + 0.1,
            "t_end": row["t_start"] + 0.5,
            "prompt_tokens": 200,
            "completion_tokens": 20,
            "cached_tokens": 0,
            "ok": True,
            "error": "",
            "max_gap_s": 0.1,
            "stall_gaps": 0,
            "usage_source": "usage",
            "token_arrivals": 20,
            "token_span_s": 0.4,
            **row,
        }
        for i, row in enumerate(rows)
    ]
    return validity.to_frame(records, order="AB", rep=1, arm="A", users=4)


def judged(rows, shape):
    report = validity.validity_report(
        frame(rows),
        (0.0, 10.0),
        users=shape.users,
        max_tokens=20,
        prompt_tokens=200,
        probe_n=0,
        stall_gap_s=1.0,
        shape=shape,
    )
    return report["shape"], validity.shortfalls(report)


def test_an_open_loop_on_schedule_is_as_configured_and_not_judged_by_users_in_flight():
    rows = [{"t_start": t + 0.001, "t_due": t, "slot_wait_s": 0.0} for t in np.arange(0, 10, 0.5)]
    shape, short = judged(rows, shapes.Shape(4, rate=2.0))
    assert short == []  # 0.5 requests in flight of a cap of 4 is no shortfall for an open loop
    assert shape["started"] == 20 and shape["achieved_rate"] == 2.0 and shape["delayed_by_cap"] == 0
    assert shape["client_delay_s"]["median"] == pytest.approx(0.001) and shape["client_delay_s"]["late"] == 0


def test_an_open_loop_names_the_cap_the_late_client_and_the_rate_it_missed():
    capped = [{"t_start": t + 0.3, "t_due": t, "slot_wait_s": 0.3} for t in np.arange(0, 10, 0.5)]
    _, short = judged(capped, shapes.Shape(4, rate=2.0))
    assert short == ["20 of 20 arrivals waited for one of the 4 slots: the cap, not the rate, set the load"]
    late = [{"t_start": t + 0.2, "t_due": t, "slot_wait_s": 0.0} for t in np.arange(0, 10, 0.5)]
    _, short = judged(late, shapes.Shape(4, rate=2.0))
    assert short == [
        "20 of 20 requests left more than 0.05 s after they were due (p99 0.2 s): the client fell behind its schedule"
    ]
    _, short = judged(late[:10] and [dict(r, t_start=r["t_due"]) for r in late[::4]], shapes.Shape(4, rate=20.0))
    assert short == ["0.5 requests/s started against the configured 20 (tolerance 21.2%)"]


def test_a_think_loop_is_judged_by_its_draws_and_the_client_keeping_them():
    rows = [{"t_start": t, "t_due": t, "think_s": 2.0} for t in np.arange(0, 10, 0.2)]
    shape, short = judged(rows, shapes.Shape(4, think_s=2.0))
    assert short == [] and shape["thinks"] == 50 and shape["think_ratio"] == 1.0
    _, short = judged(rows, shapes.Shape(4, think_s=8.0))
    assert short == ["think times drawn 2 s on average against the configured 8 s (tolerance 42.4%)"]


def test_a_closed_loop_is_judged_as_before():
    rows = [{"t_start": 0.0}]
    assert judged(rows, shapes.Shape(4)) == ({"kind": "closed", "users": 4}, ["0.05 of 4 requests in flight"])


def test_an_open_loop_is_one_locust_user_dispatching_to_its_cap():
    spec = LoadSpec(duration_s=60, users=16, rate=0.5, burstiness=0.5, shape_seed=3, probe=False)
    joined = " ".join(locust_command("http://127.0.0.1:1", "r", "e", spec, "x"))
    for part in ("-u 1 -r 1", "--rate 0.5", "--burstiness 0.5", "--max-inflight 16", "--shape-seed 3"):
        assert part in joined
    think = " ".join(LoadSpec(duration_s=60, users=4, think_s=2.0).locust_args())
    assert "-u 4 -r 4" in think and "--think-s 2.0" in think and "--rate" not in think


def with_load(**load):
    raw = copy.deepcopy(RAW)
    raw.setdefault("load", {}).update(load)
    return raw


@settings(max_examples=40, deadline=None)
@given(
    key=st.sampled_from(["rate", "think_s", "burstiness"]),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not (math.isfinite(v) and v > 0)),
        st.integers(-(10**6), 0),
    ),
)
def test_a_rate_think_time_or_burstiness_that_is_no_positive_number_is_one_line_naming_the_key(key, value):
    with pytest.raises(ConfigError) as caught:
        validate(with_load(**{key: value}), ROOT)
    message = str(caught.value)
    assert f"load.{key}" in message and "\n" not in message


def test_a_rate_with_a_think_time_is_refused_and_each_alone_is_taken():
    with pytest.raises(ConfigError, match=r"config key 'load.think_s': .*set one of them"):
        validate(with_load(rate=1.0, think_s=2.0), ROOT)
    assert validate(with_load(rate=0.2, burstiness=0.5), ROOT)["load"]["rate"] == 0.2
    assert validate(with_load(think_s=5), ROOT)["load"]["think_s"] == 5


def test_shapes_describe_themselves():
    assert shapes.Shape(8, rate=0.2).describe() == "0.2 requests/s (Poisson), at most 8 in flight"
    assert shapes.Shape(4, think_s=3).describe() == "4 users thinking 3 s on average"
    assert pd.isna(np.nan) and shapes.Shape(4).kind == load_levels.CLOSED
