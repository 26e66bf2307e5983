"""What a simulated server start draws (thermab.sim.restart): the drafter's acceptance per
position and the step-time factor, their spread across starts, the environment's override."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given, strategies as st

from thermab.sim import restart, vllm


def test_a_start_draws_each_positions_acceptance_around_the_default():
    starts = [restart.draw(random.Random(seed)) for seed in range(2000)]
    assert all(len(start.acceptance) == restart.MTP_DRAFT_TOKENS for start in starts)
    assert statistics.mean(s.acceptance[0] for s in starts) == pytest.approx(restart.ACCEPTANCE, abs=0.01)
    assert statistics.mean(s.step_factor for s in starts) == pytest.approx(1.0, abs=0.005)
    assert len({s.acceptance for s in starts}) == len(starts)  # every start its own


def test_the_restart_cv_of_throughput_at_four_users_is_the_fields():
    """vLLM's MTP drafter moved throughput at 4 streams by a CV of 7.5 % across restarts; the
    study saw ±13–15 % between two restarts, about 1.3 sd of a difference of two such draws."""
    cv = restart.throughput_cv(random.Random(1))
    assert 0.065 <= cv <= 0.085
    assert restart.throughput_cv(random.Random(1), acceptance_logit_sd=0, position_logit_sd=0) < 0.03


def test_off_every_start_is_the_same():
    assert restart.start_draw(random.Random(), False, {}) == restart.FIXED
    assert restart.acceptance_length(restart.FIXED.acceptance) == pytest.approx(2.38336)


def test_the_environment_sets_the_acceptance_of_every_position():
    start = restart.start_draw(random.Random(3), True, {restart.ENV_ACCEPTANCE: "0.45"})
    assert start.acceptance == (0.45,) * restart.MTP_DRAFT_TOKENS
    assert start.step_factor == restart.draw(random.Random(3)).step_factor  # the kernels still drawn
    assert restart.start_draw(random.Random(3), True, {restart.ENV_ACCEPTANCE: ""}) == restart.draw(random.Random(3))


@given(st.text(max_size=20))
def test_any_environment_value_is_a_probability_or_a_one_line_error(text):
    try:
        value = restart.parse_acceptance(text)
    except ValueError as error:
        assert str(error).startswith(restart.ENV_ACCEPTANCE) and "\n" not in str(error)
    else:
        assert 0.0 <= value <= 1.0


def test_the_engines_drafts_follow_the_starts_acceptance():
    rng = random.Random(5)
    never = [vllm.accepted_tokens(rng, (0.0,) * 5) for _ in range(100)]
    always = [vllm.accepted_tokens(rng, (1.0,) * 5) for _ in range(100)]
    assert set(never) == {1} and set(always) == {1 + restart.MTP_DRAFT_TOKENS}
    mean = statistics.mean(vllm.accepted_tokens(rng, restart.FIXED.acceptance) for _ in range(20000))
    assert mean == pytest.approx(restart.acceptance_length(restart.FIXED.acceptance), abs=0.03)
