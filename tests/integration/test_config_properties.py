"""Property-based tests of the config validator (hypothesis): whatever number or string a
user puts in any field, validation either accepts the config, and then every template
renders and every name is a safe path component, or refuses it with a ConfigError naming
the key in one line. No other exception, ever."""

import copy
import math
import re

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from support.paths import REPO as ROOT
from thermab.config import (
    ConfigError,
    cluster_spec,
    default_questions,
    load_schema,
    typed_overrides,
    validate,
    view,
)

RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
RAW.setdefault("safety", {})
RAW.setdefault("questions", default_questions())  # a list, so that put() can reach into its items
HOST = ["clusters", "sim", "hosts", "head"]
PROFILE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def leaves(value, path=()):
    if isinstance(value, dict):
        for name, item in value.items():
            yield from leaves(item, path + (name,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, path + (index,))
    else:
        yield path, value


FULL = validate(RAW, ROOT)  # with every default filled in, so every field is reached
NUMBER_PATHS = sorted(
    {p for p, v in leaves(FULL) if isinstance(v, (int, float)) and not isinstance(v, bool)}
    | {("safety", "abort_at_c"), ("safety", "max_load_minutes"), ("safety", "max_sensor_silence_s"), (*HOST, "port")},
    key=str,
)
STRING_PATHS = sorted(
    {p for p, v in leaves(FULL) if isinstance(v, str)}
    | {
        (*HOST, name) for name in ("address", "user", "key_file", "known_hosts", "jump", "container", "process_pattern")
    },
    key=str,
)
RENAMES = [
    ("clusters", "sim"),
    ("clusters", "sim", "hosts", "head"),
    ("clusters", "sim", "hosts", "worker"),
    ("arms", "B"),
]

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**40), 10**40),
    st.booleans(),
    st.none(),
    st.just(2.0),
    st.just(1e30),
)
texts = st.one_of(
    st.text(),
    st.text(alphabet="{}[]().:!$/\\ \n\0-_*|?+x0", max_size=12),
    st.sampled_from(
        [
            "{python}",
            "{root}",
            "{env}",
            "{value}",
            "{{}}",
            ".",
            "..",
            "/",
            "http://",
            "http://h:1",
            "0.002",
            "'s'",
            "True",
            "vllm",
            "(",
            "\n",
        ]
    ),
)
anything = st.recursive(
    st.one_of(numbers, texts),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner, max_size=3)
    ),
    max_leaves=6,
)


def put(config: dict, path: tuple, value) -> None:
    target = config
    for part in path[:-1]:
        target = target[part] if isinstance(target, list) else target.setdefault(part, {})
    target[path[-1]] = value


def rename(config: dict, path: tuple, new) -> None:
    parent = config
    for part in path[:-1]:
        parent = parent[part]
    items = [(new if name == path[-1] else name, value) for name, value in parent.items()]
    parent.clear()
    parent.update(items)


def check(config: dict, named: str | None = None) -> None:
    """The property: accepted and usable, or refused in one line naming a key."""
    try:
        valid = validate(config, ROOT)
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message and "config key '" in message
        if named is not None:
            assert f"'{named}" in message, (named, message)
        return
    usable(valid)


def usable(config: dict) -> None:
    for path, value in leaves(config):
        assert not (isinstance(value, float) and not math.isfinite(value)), path
    for name in config["clusters"]:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", name)
        cluster = cluster_spec(view(config), name, ROOT)
        for host in cluster.hosts:
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", host.name)
            for which in ("stop", "start"):
                host.command(which, {"VAR": "v a l"})  # never raises once accepted
    setting = config["setting"]
    if setting["method"] == "file":
        for arm in config["arms"].values():
            rendered = setting["replacement"].format(value=arm["value"])
            assert len(re.findall(setting["anchor"], rendered)) == 1


@PROFILE
@given(path=st.sampled_from(NUMBER_PATHS), value=numbers)
def test_any_number_in_any_numeric_field(path, value):
    config = copy.deepcopy(RAW)
    put(config, path, value)
    check(config, ".".join(map(str, path)))


@PROFILE
@given(path=st.sampled_from(STRING_PATHS), value=texts)
def test_any_string_in_any_string_field(path, value):
    config = copy.deepcopy(RAW)
    put(config, path, value)
    check(config)


@PROFILE
@given(path=st.sampled_from(RENAMES), name=st.one_of(texts, st.integers(), st.booleans(), st.none()))
def test_any_name_for_a_cluster_host_or_arm(path, name):
    config = copy.deepcopy(RAW)
    rename(config, path, name)
    check(config)


@PROFILE
@given(
    path=st.sampled_from(NUMBER_PATHS + STRING_PATHS + [("load", "extra_body"), ("arms",), ("clusters",)]),
    value=anything,
)
def test_any_value_of_any_type_anywhere(path, value):
    config = copy.deepcopy(RAW)
    put(config, path, value)
    check(config)


# -- `--config` mappings: Snakemake hands them over as text ----------------------------------------


def admitted(path, value) -> bool:
    """Whether the schema's type at ``path`` takes ``value``'s type."""
    schema = load_schema()
    for part in path:
        if isinstance(part, int):
            schema = schema["items"]
        else:
            schema = schema.get("properties", {}).get(part) or schema["additionalProperties"]
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if value is None:
        return "null" in types
    return "number" in types or ("integer" in types and isinstance(value, int))


def as_snakemake_text(value):
    """What Snakemake's `--config KEY={...}` makes of a value: YAML's base loader, all text."""
    if isinstance(value, dict):
        return {name: as_snakemake_text(item) for name, item in value.items()}
    if isinstance(value, list):
        return [as_snakemake_text(item) for item in value]
    return yaml.load(yaml.safe_dump(value), Loader=yaml.BaseLoader)


@PROFILE
@given(
    path=st.sampled_from([p for p in NUMBER_PATHS if len(p) > 1]),
    value=st.one_of(st.integers(-(10**6), 10**6), st.floats(allow_nan=True, allow_infinity=True), st.none()),
)
def test_a_number_in_a_config_mapping_keeps_its_type(path, value):
    """`--config timings={load_s: 30}`: the number given is the number validated."""
    override = {}
    put(override, path, value)
    typed = typed_overrides(as_snakemake_text(override))
    got = typed
    for part in path:
        got = got[part]
    if admitted(path, value):
        assert got == value or (value != value and got != got), (value, got)
        assert type(got) is type(value)
    else:
        assert isinstance(got, str), "a value of a type the key does not take stays text, for validation to name"
    config = copy.deepcopy(RAW)
    put(config, path, got)
    check(config, ".".join(str(p) for p in path))


@PROFILE
@given(
    path=st.sampled_from([p for p in STRING_PATHS if len(p) > 1]),
    value=st.sampled_from(["0.002", "1", "true", "null", "1e3", "[1]", "{a: 1}", "x"]),
)
def test_text_in_a_config_mapping_stays_text_where_text_is_asked(path, value):
    """An arm value of 0.002 is the text the file gets, not a float."""
    override = {}
    put(override, path, value)
    got = typed_overrides(as_snakemake_text(override))
    for part in path:
        got = got[part]
    assert got == value


def test_text_that_is_not_the_wanted_type_is_left_for_validation_to_name():
    typed = typed_overrides({"timings": {"load_s": "five", "baseline_s": "1.5"}, "load": {"probe": "0"}})
    assert typed == {"timings": {"load_s": "five", "baseline_s": 1.5}, "load": {"probe": "0"}}
