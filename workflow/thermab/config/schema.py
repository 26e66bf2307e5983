"""The JSON schema: validation with every default written in, the defaults themselves,
one key's problems, and ``--config`` values typed by it."""

from __future__ import annotations

import copy
import datetime
import functools
import math
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import Any

import jsonschema
import yaml
from jsonschema import ValidationError
from jsonschema.protocols import Validator

from thermab import load_levels
from thermab.config.problems import ConfigError, _key
from thermab.config.reader import StrictLoader

# package data, so a non-editable install validates the same way (workflow/schemas/ links here)
SCHEMA = resources.files("thermab") / "config.schema.yaml"
MAX_VALUES = 100_000  # values in one config, counted through YAML aliases (a billion laughs stops here)


def _is_integer(_checker: object, instance: object) -> bool:
    # JSON Schema calls 2.0 an integer; here an integer key takes a whole number written
    # without a decimal point (`range(1, 2.0 + 1)` is a crash, `1e30` a hang)
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _schema() -> dict[str, Any]:
    """The schema the validator is built from, as the dict it is (the validator's ``schema`` is
    typed as any JSON schema, a boolean too)."""
    return load_schema()


@functools.cache
def _validator() -> Validator:
    """Draft 2020-12 with strict integers, writing each property's schema default into the
    instance; built once (reading the schema is most of the cost of a validation)."""
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(
        validator: Validator, properties: dict[str, Any], instance: object, schema: dict[str, Any]
    ) -> Iterator[ValidationError]:
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    def full_pattern(
        validator: Validator, pattern: str, instance: object, schema: dict[str, Any]
    ) -> Iterator[ValidationError]:
        # JSON Schema's `pattern` is re.search, where `$` also matches before a final
        # newline ("AB\n" would pass "^[A-Z]+$"): here every pattern matches the whole text
        if isinstance(instance, str) and re.fullmatch(pattern, instance) is None:
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")

    # types-jsonschema leaves extend unannotated
    validator: type[Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        base,
        {"properties": set_defaults, "pattern": full_pattern},
        type_checker=base.TYPE_CHECKER.redefine("integer", _is_integer),
    )
    return validator(_schema())


def _describe(error: jsonschema.ValidationError) -> str:
    path = list(error.absolute_path)
    schema = error.schema if isinstance(error.schema, Mapping) else {}  # a boolean schema has no keys
    keys = error.instance if isinstance(error.instance, Mapping) else {}  # the mapping a key is missing from
    if error.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        unknown = sorted(set(keys) - set(allowed))
        named = ", ".join(f"'{_key(path + [name])}'" for name in unknown)
        return f"config key {named}: unknown key" + (f" (allowed here: {', '.join(allowed)})" if allowed else "")
    if error.validator == "required":
        # one error per missing key, each carrying the whole list: the message names its own
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [name for name in required if name not in keys]
        name = next((name for name in missing if error.message.startswith(repr(name))), missing[0])
        return f"config key '{_key(path + [name])}': required but missing"
    # the message quotes the value: a long one is cut, so the line still says what is wrong
    shown = repr(error.instance)
    message = error.message.replace(shown, shown if len(shown) <= 60 else shown[:57] + "…")
    if error.validator == "pattern" and "description" in schema:
        message += f" ({schema['description']})"
    return f"config key '{_key(path)}': {message}"


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    return schema


def defaults(section: str) -> dict[str, Any]:
    """The schema's default of each key of a top-level section (``load``, ``analysis``): the
    one owner of the defaults, which LoadSpec, the locustfile and the run plan read."""
    properties = _schema()["properties"][section]["properties"]
    return {name: copy.deepcopy(spec["default"]) for name, spec in properties.items() if "default" in spec}


def top_level_defaults(*keys: str) -> dict[str, Any]:
    """The schema's default of each of these top-level keys (``until``, ``max_repeats``)."""
    properties = _schema()["properties"]
    return {key: copy.deepcopy(properties[key]["default"]) for key in keys}


def key_problem(path: tuple[str, ...], value: Any) -> str | None:
    """Why ``value`` cannot be the config key at ``path`` (``("load", "users")``): the
    schema's type, bounds and pattern, a finite number; None when it can.  For command-line
    options that set what a config key sets, so both take the same values."""
    schema = _schema()
    for name in path:
        schema = schema["properties"][name]
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    error = next(iter(type(_validator())(schema).iter_errors(value)), None)
    return None if error is None else error.message


def key_problems(path: tuple[str, ...], value: Any) -> list[str]:
    """Every problem of ``value`` as the config key at ``path``, each a line naming the key
    (and the item inside it) as validation does: what no schema keyword catches, then the
    schema's own.  For values another tool wrote that stand for a config key (run.json),
    so that they are held to the config's checks."""
    schema = _schema()
    for name in path:
        schema = schema["properties"][name]
    problems: list[str] = []
    _value_problems(value, list(path), problems, [MAX_VALUES])
    if problems:
        return problems
    errors = list(type(_validator())(schema).iter_errors(copy.deepcopy(value)))
    for error in errors:
        error.path.extendleft(reversed(path))
    return [_describe(error) for error in errors]


def _value_problems(value: object, path: list[Any], problems: list[str], budget: list[int]) -> None:
    """What no schema keyword catches, anywhere in the config: numbers that are not
    finite (every comparison with NaN is false, so an interlock at NaN never fires), keys
    that are not strings (YAML reads `on:` as True and `1:` as 1), NUL in strings, and a
    config too large once its aliases are expanded."""
    budget[0] -= 1
    if budget[0] < 0:
        if budget[0] == -1:
            problems.append(
                f"config key '{_key(path)}': the config has more than {MAX_VALUES} values "
                "once YAML aliases are expanded"
            )
        return
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"config key '{_key(path)}': {value} is not a finite number")
    elif isinstance(value, (datetime.date, bytes)):  # YAML's dates and !!binary: run.json is JSON
        problems.append(
            f"config key '{_key(path)}': YAML reads this as a {type(value).__name__}, which JSON "
            "cannot hold (quote it to keep it text)"
        )
    elif isinstance(value, str) and "\0" in value:
        problems.append(f"config key '{_key(path)}': contains a NUL character")
    elif isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                problems.append(
                    f"config key '{_key(path + [name])}': the key {name!r} is of type "
                    f"{type(name).__name__}, not a string (quote it)"
                )
                continue
            _value_problems(item, path + [name], problems, budget)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _value_problems(item, path + [index], problems, budget)


# -- `--config` on the command line ----------------------------------------------------------

SCALAR_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def _subschema(schema: dict[str, Any], name: str | int) -> dict[str, Any]:
    if isinstance(name, int):
        items: dict[str, Any] = schema.get("items", {})
        return items
    properties: dict[str, dict[str, Any]] = schema.get("properties", {})
    if name in properties:
        return properties[name]
    extra = schema.get("additionalProperties", {})
    return extra if isinstance(extra, dict) else {}


def _typed(value: object, schema: dict[str, Any]) -> object:
    if isinstance(value, dict):
        return {name: _typed(item, _subschema(schema, name)) for name, item in value.items()}
    if isinstance(value, list):
        return [_typed(item, _subschema(schema, index)) for index, item in enumerate(value)]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if not isinstance(value, str) or "string" in types or not any(t in SCALAR_TYPES for t in types):
        return value
    try:
        parsed = yaml.load(value, Loader=StrictLoader)
    except (yaml.YAMLError, ConfigError):
        return value
    wanted: tuple[type | tuple[type, ...], ...] = tuple(SCALAR_TYPES[t] for t in types if t in SCALAR_TYPES)
    if isinstance(parsed, bool) and "boolean" not in types:
        return value
    return parsed if isinstance(parsed, wanted) else value


def typed_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``--config`` values with their types.  Snakemake reads a scalar as an int, float or
    bool, but a mapping or list (``timings={load_s: 30}``) with YAML's base loader, all text;
    here text where the schema wants a number, a boolean or null is read as YAML.  Text that
    does not read as the wanted type is left as it is, for validation to name."""
    schema = _schema()  # the schema validation reads, read once
    return {name: _typed(item, _subschema(schema, name)) for name, item in overrides.items()}


def question_kinds() -> tuple[str, ...]:
    """The kinds a question may be: the schema's, their one owner."""
    return tuple(_schema()["properties"]["questions"]["items"]["properties"]["kind"]["enum"])


def level_bounds() -> dict[str, Any]:
    """The most each key of a level may be: the schema's maximum of load's key of that name."""
    return {name: maximum("load", name) for name in load_levels.LEVEL_KEYS}


def maximum(section: str, key: str | None = None) -> float | None:
    """The schema's maximum of ``section.key``, or of the top-level key ``section`` (None where
    it sets none)."""
    spec = _schema()["properties"][section]
    bound: float | None = (spec if key is None else spec["properties"][key]).get("maximum")
    return bound
