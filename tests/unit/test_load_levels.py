"""Levels of load of mixed shapes (thermab.load_levels): a level is a number of users at the
run's shape or a mapping of a shape of its own; each has a label and a slug as exact as its
numbers; levels run ascending by users, ties in the list's order, the other way round in even
repeats; a question names levels by users, label or index; and any list that is no list of
distinct levels is refused, each problem one line naming the key."""

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from thermab import load_levels
from thermab.load_levels import Level

BOUNDS = {"users": 1024, "rate": 100000, "burstiness": 1000, "think_s": 86400}  # the schema's maxima
PROFILE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MIXED = [4, {"rate": 0.5, "users": 4}, {"think_s": 2, "users": 4}, 1, {"rate": 0.5, "burstiness": 2.0, "users": 8}]


def test_a_number_is_a_level_at_the_run_shape_and_a_mapping_is_its_own_shape():
    closed, rate, think, one, bursty = load_levels.parse({"users": MIXED})
    assert (closed.kind, rate.kind, think.kind, one.kind, bursty.kind) == ("closed", "rate", "think", "closed", "rate")
    assert rate == Level(4, rate=0.5) and think == Level(4, think_s=2) and bursty.burstiness == 2.0
    # a number takes the run's shape; a mapping does not
    run = {"users": [4, {"users": 2}], "rate": 1.5, "burstiness": 0.5, "think_s": None}
    assert load_levels.parse(run) == [Level(4, rate=1.5, burstiness=0.5), Level(2)]
    # the burstiness of a loop is 1 whatever load.burstiness says, so that equal levels are equal
    assert load_levels.parse({"users": 4, "burstiness": 3.0}) == [Level(4)]


def test_each_level_has_a_short_label_and_a_slug():
    labels = [one.label for one in load_levels.parse({"users": MIXED})]
    assert labels == ["4 users", "0.5 req/s ≤4", "4 users think 2 s", "1 user", "0.5 req/s ≤8 burstiness 2"]
    slugs = [one.slug for one in load_levels.parse({"users": MIXED})]
    assert slugs == ["u4", "r0.5-u4", "u4-think2", "u1", "r0.5-u8-b2"]
    assert Level(16).slug == "u16"  # a number's phase directory is the one a run of levels always had
    assert Level(2, rate=1e-5).label == "1e-05 req/s ≤2"


def test_levels_run_by_users_ties_in_the_list_order_and_back_in_even_repeats():
    every = load_levels.parse({"users": MIXED})
    odd = [one.label for one in load_levels.in_order(every, 1)]
    assert odd == ["1 user", "4 users", "0.5 req/s ≤4", "4 users think 2 s", "0.5 req/s ≤8 burstiness 2"]
    assert [one.label for one in load_levels.in_order(every, 2)] == odd[::-1]


numbers = st.one_of(
    st.integers(1, 20),
    st.floats(0.001, 50, allow_nan=False).map(lambda x: round(x, 3)),
)
levels = st.one_of(
    st.integers(1, 64),
    st.builds(lambda users: {"users": users}, st.integers(1, 64)),
    st.builds(lambda users, rate: {"users": users, "rate": rate}, st.integers(1, 64), numbers),
    st.builds(lambda u, r, b: {"users": u, "rate": r, "burstiness": b}, st.integers(1, 64), numbers, numbers),
    st.builds(lambda users, think: {"users": users, "think_s": think}, st.integers(1, 64), numbers),
)


@PROFILE
@given(st.lists(levels, min_size=1, max_size=8), st.integers(1, 6))
def test_distinct_levels_have_distinct_labels_and_slugs_and_balanced_positions(users, rep):
    every = load_levels.parse({"users": users})
    distinct = len(set(every)) == len(every)
    assert (load_levels.problems({"users": users}) == []) == distinct
    if not distinct:
        return
    assert len({one.label for one in every}) == len(every) == len({one.slug for one in every})
    odd, even = load_levels.in_order(every, 2 * rep - 1), load_levels.in_order(every, 2 * rep)
    assert [one.users for one in odd] == sorted(one.users for one in every)
    for one in every:  # each level first as often as last over a pair of repeats, as an arm is
        assert odd.index(one) + even.index(one) == len(every) - 1


junk = st.one_of(
    st.integers(-3, 2000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
items = st.one_of(
    junk,
    st.dictionaries(st.sampled_from(["users", "rate", "burstiness", "think_s", "cap", "rates"]), junk, max_size=4),
)


def _is_level(item) -> bool:
    """What a level is, said plainly: the oracle the checks are tested against."""

    def positive(value, bound):
        return type(value) in (int, float) and math.isfinite(value) and 0 < value <= bound

    if not isinstance(item, dict):
        return type(item) is int and 1 <= item <= BOUNDS["users"]
    rate, think = item.get("rate"), item.get("think_s")
    return (
        set(item) <= {"users", "rate", "burstiness", "think_s"}
        and type(item.get("users")) is int
        and 1 <= item["users"] <= BOUNDS["users"]
        and (rate is None or positive(rate, BOUNDS["rate"]))
        and (think is None or positive(think, BOUNDS["think_s"]))
        and not (rate is not None and think is not None)
        and (
            "burstiness" not in item
            or (positive(item["burstiness"], BOUNDS["burstiness"]) and (rate is not None or item["burstiness"] == 1))
        )
    )


@PROFILE
@given(st.one_of(st.lists(items, max_size=6), junk))
def test_any_users_is_read_as_distinct_levels_or_refused_line_by_line_naming_the_key(users):
    problems = load_levels.problems({"users": users}, bounds=BOUNDS)
    listed = users if isinstance(users, list) else [users]
    valid = bool(listed) and all(map(_is_level, listed))
    if valid:
        every = load_levels.parse({"users": users})
        valid = len(set(every)) == len(every)
    assert (problems == []) == valid, problems
    for problem in problems:
        assert "\n" not in problem and problem.startswith("config key 'load.users"), problem


@pytest.mark.parametrize(
    "users, key, words",
    [
        ([4, {"rate": 0.0, "users": 4}], "load.users.1.rate", "not a finite number above 0"),
        ([{"rate": math.inf, "users": 4}], "load.users.0.rate", "not a finite number above 0"),
        ([{"think_s": -2, "users": 4}], "load.users.0.think_s", "not a finite number above 0"),
        ([{"think_s": math.nan, "users": 4}], "load.users.0.think_s", "not a finite number above 0"),
        ([{"rate": 1, "burstiness": 0, "users": 4}], "load.users.0.burstiness", "not a finite number above 0"),
        ([{"burstiness": 2, "users": 4}], "load.users.0.burstiness", "this level has none"),
        ([{"rate": 1, "think_s": 2, "users": 4}], "load.users.0.think_s", "give one of them"),
        ([{"rate": 1, "users": 4, "cap": 2}], "load.users.0.cap", "unknown key"),
        ([{"rate": 1}], "load.users.0.users", "required"),
        ([4, {"users": 4}], "load.users.1", "'4 users' is given twice (first as 'load.users.0')"),
        ([{"rate": 0.5, "users": 4}, {"rate": 0.5, "burstiness": 1, "users": 4}], "load.users.1", "given twice"),
        ([{"rate": 1e6, "users": 4}], "load.users.0.rate", "above 100000"),
        ([], "load.users", "no level"),
    ],
)
def test_a_level_that_is_none_is_one_line_naming_its_key(users, key, words):
    problems = load_levels.problems({"users": users}, bounds=BOUNDS)
    assert len(problems) == 1 and f"config key '{key}'" in problems[0] and words in problems[0], problems


def test_a_question_names_levels_by_users_label_or_index():
    every = load_levels.parse({"users": MIXED})
    closed, rate, think, one, bursty = every
    assert load_levels.asked_levels({}, every) == every
    assert load_levels.asked_levels({"users": [4]}, every) == [closed, rate, think]
    assert load_levels.asked_levels({"levels": ["0.5 req/s ≤4", 4]}, every) == [rate, bursty]
    assert load_levels.question_problems({"levels": ["0.5 req/s ≤4", 4]}, every) == []
    (key, problem), *_ = load_levels.question_problems({"levels": ["5 users", 9]}, every)
    assert key == "levels" and "'5 users', 9 names no level" in problem and "index from 0 to 4" in problem
    (key, problem), *_ = load_levels.question_problems({"users": [2]}, every)
    assert key == "users" and "2 not among the users of 'load.users' (1, 4, 8)" in problem
    assert load_levels.question_problems({"users": [4], "levels": [0]}, every)[0][0] == "levels"
