"""Property-based tests of the config validator (hypothesis): whatever number or string a
user puts in any field, validation either accepts the config, and then every template
renders and every name is a safe path component, or refuses it with a ConfigError naming
the key in one line. No other exception, ever."""

import copy
import math
import re
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from thermab.config import ConfigError, cluster_spec, validate

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
RAW.setdefault("safety", {})
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
NUMBER_PATHS = sorted({p for p, v in leaves(FULL) if isinstance(v, (int, float)) and not isinstance(v, bool)}
                      | {("safety", "abort_at_c"), ("safety", "max_load_minutes"), ("safety", "max_sensor_silence_s"),
                         (*HOST, "port")}, key=str)
STRING_PATHS = sorted({p for p, v in leaves(FULL) if isinstance(v, str)}
                      | {(*HOST, name) for name in ("address", "user", "key_file", "known_hosts", "jump",
                                                    "container", "process_pattern")}, key=str)
RENAMES = [("clusters", "sim"), ("clusters", "sim", "hosts", "head"), ("clusters", "sim", "hosts", "worker"),
           ("arms", "B")]

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10 ** 40, 10 ** 40),
                    st.booleans(), st.none(), st.just(2.0), st.just(1e30))
texts = st.one_of(st.text(), st.text(alphabet="{}[]().:!$/\\ \n\0-_*|?+x0", max_size=12),
                  st.sampled_from(["{python}", "{root}", "{env}", "{value}", "{{}}", ".", "..", "/", "http://",
                                   "http://h:1", "0.002", "'s'", "True", "vllm", "(", "\n"]))
anything = st.recursive(st.one_of(numbers, texts), lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner, max_size=3)),
    max_leaves=6)


def put(config: dict, path: tuple, value) -> None:
    target = config
    for part in path[:-1]:
        target = target.setdefault(part, {})
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
        cluster = cluster_spec(config, name, ROOT)
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
@given(path=st.sampled_from(NUMBER_PATHS + STRING_PATHS + [("load", "extra_body"), ("arms",), ("clusters",)]),
       value=anything)
def test_any_value_of_any_type_anywhere(path, value):
    config = copy.deepcopy(RAW)
    put(config, path, value)
    check(config)
