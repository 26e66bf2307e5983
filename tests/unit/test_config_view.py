"""The config's typed, read-only view: the validated dict's values under typed sections,
every schema key annotated, nothing in it changeable, an unknown key named."""

from __future__ import annotations

import copy
import functools
import json
import operator
import types
import typing
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from support.paths import REPO
from thermab.analysis import levels
from thermab.analysis.model import STUDY_DESIGN, UNRECORDED, Plan
from thermab.config import load, load_schema
from thermab.config.view import Config, Section, thaw, view
from thermab.experiment import plan

CONFIG_DIR = REPO / "config"
CONFIGS = [CONFIG_DIR / "config.yaml", *sorted(CONFIG_DIR.glob("examples/*.yaml"))]


def conforms(value, hint) -> bool:
    """``value`` is of the annotated type (an int passes for a float, as in Python's typing)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if origin is tuple:
        return isinstance(value, tuple) and all(conforms(item, args[0]) for item in value)
    if origin is Mapping:
        return isinstance(value, Section) and all(conforms(item, args[1]) for item in value.values())
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def same_values(section: Section, values: dict, where: str = "") -> None:
    """Each key of ``values`` is the section's, typed as the section's class says (a
    mapping by name, such as ``arms``, is a plain Section), its mappings sections and its
    lists tuples."""
    hints = typing.get_type_hints(type(section))
    assert set(section) == set(values), where
    for name, value in values.items():
        got = section[name]
        assert thaw(got) == value, f"{where}{name}"
        if type(section) is not Section:
            assert name in hints, f"{where}{name}: not annotated on {type(section).__name__}"
            assert getattr(section, name) is got and conforms(got, hints[name]), f"{where}{name}: {got!r}"
        if isinstance(value, dict):
            same_values(got, value, f"{where}{name}.")
        elif isinstance(value, list):
            assert isinstance(got, tuple), f"{where}{name}"
            for index, (item, raw) in enumerate(zip(got, value, strict=True)):
                if isinstance(raw, dict):
                    same_values(item, raw, f"{where}{name}.{index}.")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_view_holds_the_configs_values(path):
    config = load(path)
    cfg = view(config)
    assert isinstance(cfg, Config) and thaw(cfg) == config
    same_values(cfg, config)
    assert cfg.timings.load_s == config["timings"]["load_s"]
    assert cfg.analysis.thresholds_c == tuple(config["analysis"]["thresholds_c"])
    assert list(cfg.arms) == list(config["arms"])  # the first arm is the reference: order kept


def resolved(schema: dict, root: dict) -> dict:
    """A subschema, its ``$ref`` (``#/properties/questions/items``) followed from the root."""
    if "$ref" not in schema:
        return schema
    for part in schema["$ref"].removeprefix("#/").split("/"):
        root = root[part]
    return root


def typed_keys(cls: type[Section], schema: dict, where: str, found: list[str], root: dict) -> None:
    """What differs between ``cls``'s annotations and the schema's keys at ``where``, and so
    on down every section."""
    hints = typing.get_type_hints(cls)
    keys = set(schema["properties"])
    found += [f"'{where}{name}' in the schema, not annotated on {cls.__name__}" for name in sorted(keys - set(hints))]
    found += [f"'{where}{name}' annotated on {cls.__name__}, not in the schema" for name in sorted(set(hints) - keys)]
    for name in sorted(keys & set(hints)):
        hint, sub = hints[name], resolved(schema["properties"][name], root)
        inner = [arg for arg in (hint, *typing.get_args(hint)) if isinstance(arg, type) and issubclass(arg, Section)]
        if not inner:
            continue
        if typing.get_origin(hint) is Mapping:
            typed_keys(inner[0], resolved(sub["additionalProperties"], root), f"{where}{name}.*.", found, root)
        elif "items" in sub:
            typed_keys(inner[0], resolved(sub["items"], root), f"{where}{name}.N.", found, root)
        else:
            typed_keys(inner[0], sub, f"{where}{name}.", found, root)


def test_every_schema_key_is_annotated_on_its_section():
    """A key added to the schema gets its line, with its type, in its section's class."""
    found: list[str] = []
    schema = load_schema()
    typed_keys(Config, schema, "", found, schema)
    assert not found, "; ".join(found)


def test_the_check_of_annotations_can_fail():
    class Short(Section):
        order: str

    found: list[str] = []
    schema = {"properties": {"order": {}, "repeats": {}}}
    typed_keys(Short, schema, "", found, schema)
    assert found == ["'repeats' in the schema, not annotated on Short"]


def test_a_run_plan_is_typed_as_run_json_holds_it():
    """Every key run.json may hold (run_plan's, the config values the checks know, the
    writers' facts) is annotated on Plan, and read back typed: its lists tuples, its arms Arms."""
    config = load(CONFIG_DIR / "config.yaml")
    facts = {key: functools.reduce(operator.getitem, path, config) for key, path in plan.CONFIG_KEYS.items()}
    facts |= {"users": [1, {"users": 4, "rate": 0.5}], "trip_point_c": 95.0, "hosts_without_zones": ["worker"]}
    facts |= {"inferred": True, "imported_from": "chart.csv", "epoch_s": 0.0, "load_level": "4 users", "model": "m"}
    facts |= plan.invocation(["/study/config.yaml"], 2, {"budget_hours": 6.5})
    written = plan.run_plan(cluster="sim", setting="s", head="head", hosts=["head", "worker"], **facts)
    written = json.loads(json.dumps(written))  # as read back from run.json
    plan_view = Plan(written)
    same_values(plan_view, written)
    assert plan_view.arms["A"].label == written["arms"]["A"]["label"] and plan_view.users[1].rate == 0.5


def test_a_fact_run_json_lacks_reads_as_its_absence_and_is_never_added():
    """A run.json of what every writer writes and no more: each other annotated fact reads as
    what its absence means (``UNRECORDED``), typed as annotated, and is no key of the plan,
    so a plan thawed, or a level's plan made of it, holds run.json's keys alone."""
    arms = {"A": {"label": "a", "value": "1"}, "B": {"label": "b", "value": "2"}}
    written = plan.run_plan(cluster="sim", order="AB", repeats=1, arms=arms, setting="s", head="h", hosts=["h"])
    plan_view = Plan(json.loads(json.dumps(written)))
    hints = typing.get_type_hints(Plan)
    assert set(hints) == set(written) | set(STUDY_DESIGN) | set(UNRECORDED)
    for name, absent in UNRECORDED.items():
        assert name not in plan_view and getattr(plan_view, name) == absent, name
        assert conforms(absent, hints[name]), name
    assert plan_view.users is None and plan_view.configfiles is None and plan_view.hosts_without_zones == ()
    assert thaw(plan_view) == thaw(levels.plan_at(plan_view, None)) == {**STUDY_DESIGN, **written}
    with pytest.raises(AttributeError, match="'lod_s': not in the config"):
        _ = plan_view.lod_s


def test_nothing_in_the_view_changes():
    config = load(CONFIG_DIR / "config.yaml")
    cfg = view(config)
    with pytest.raises(AttributeError, match="'timings.load_s': the config is read-only"):
        cfg.timings.load_s = 1
    with pytest.raises(AttributeError, match="read-only"):
        del cfg.order
    with pytest.raises(TypeError):
        cfg.load["users"] = 8
    with pytest.raises(TypeError):
        cfg.clusters["sim"].hosts["head"]["root"] = "/"
    with pytest.raises(AttributeError):
        cfg.analysis.thresholds_c.append(99)
    with pytest.raises(TypeError):
        cfg.load.extra_body["temperature"] = 0
    config["timings"]["load_s"] = 1  # the view copied: the dict's changes are not its
    assert cfg.timings.load_s != 1 and copy.deepcopy(cfg) is cfg


def test_an_unknown_key_is_an_attribute_error_naming_it():
    cfg = view(load(CONFIG_DIR / "config.yaml"))
    with pytest.raises(AttributeError, match=r"^config key 'timings\.lod_s': not in the config$"):
        _ = cfg.timings.lod_s
    with pytest.raises(AttributeError, match=r"'clusters\.sim\.hosts\.head\.adress'"):
        _ = cfg.clusters["sim"].hosts["head"].adress
    with pytest.raises(AttributeError, match=r"'questions\.0\.margin'"):
        _ = cfg.questions[0].margin  # a key this question leaves out
    assert "tune" not in cfg and cfg.get("tune") is None and not hasattr(cfg, "tune")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def mutable(value) -> bool:
    if isinstance(value, (dict, list, set)):
        return True
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, tuple) else ()
    return any(mutable(item) for item in items)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a busy machine draws slowly
@given(values=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_any_json_mapping_comes_back_unchanged_and_frozen(values):
    section = Section(values)
    assert thaw(section) == values and not mutable(section)
    for name, value in values.items():
        assert thaw(section[name]) == value
        if name.isidentifier() and not name.startswith("_") and not hasattr(Mapping, name):
            assert getattr(section, name) is section[name]
