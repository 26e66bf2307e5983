"""Load and check the workflow config: a strict YAML reader, JSON-schema validation with
defaults, then the checks a schema cannot express (templates, regexes, URLs, paths, what a
patch will write).  Everything is checked before any job runs; every error is one line
naming the config key (or the file) at fault."""

from __future__ import annotations

import ast
import copy
import datetime
import functools
import io
import ipaddress
import json
import math
import os
import re
import shlex
import stat
import string
import sys
import tokenize
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import yaml

from thermab import metric_names as names
from thermab.errors import UserError  # noqa: F401 (imported from here by much of the package)

try:  # the regex parser, to judge a user's pattern before it runs (no public API has it)
    from re import _constants as _re_constants, _parser as _re_parser
except ImportError:  # Python 3.10
    import sre_constants as _re_constants
    import sre_parse as _re_parser

# package data, so a non-editable install validates the same way (workflow/schemas/ links here)
SCHEMA = resources.files("thermab") / "config.schema.yaml"
MAX_VALUES = 100_000  # values in one config, counted through YAML aliases (a billion laughs stops here)
MAX_MESSAGE = 300  # characters of a value shown in an error
MAX_CONFIG_BYTES = 4 * 2**20  # a config file; larger is not a config
# load.extra_body as JSON: it is merged into every request (it travels in a file, not on a
# command line), so this bounds each request's body, not an argument
MAX_EXTRA_BODY = 2**20
MAX_DIGITS = 100  # an integer written longer is a mistake (Python refuses to convert past 4300)


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message names the key."""


def _key(path) -> str:
    text = ".".join(str(part) for part in path) or "(top level)"
    return text.encode("unicode_escape").decode("ascii")  # a newline in a key stays on the line


def _short(text: str) -> str:
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "…"


def _raise(problems: list[str]) -> None:
    """One line for any number of problems."""
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems: " + "; ".join(problems))


# -- reading a file ----------------------------------------------------------------------


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_file(path: str | Path, limit: int) -> os.stat_result:
    """``path`` is a regular file of at most ``limit`` bytes, or a UserError naming it; for
    files a library opens itself (parquet). ``stat`` never blocks, as opening a FIFO would."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None
    return _checked(path, info, limit)


def _checked(path, info: os.stat_result, limit: int) -> os.stat_result:
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{path}: {_file_kind(info.st_mode)}, not a file")
    if info.st_size > limit:
        raise UserError(f"{path}: {info.st_size} bytes, more than the {limit} such a file may have")
    return info


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The bytes of a file the user named, refused at once (a UserError naming it) when it
    is not a regular file (a FIFO, a device such as /dev/zero, a directory) or is larger
    than ``limit``.  Opened non-blocking, so a FIFO without a writer cannot hang the open;
    at most ``limit`` + 1 bytes are read, so a file still growing cannot exhaust memory.
    Every reader of a user's file goes through here (configs, known_hosts, key files,
    chart sources and marks, the files of a run directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None
    try:
        _checked(path, os.fstat(fd), limit)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(2**20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UserError(f"{path}: more than the {limit} bytes such a file may have (it grew while read)")
    return b"".join(chunks)


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    one silently, so an arm or host written twice would vanish without a word), on one line
    of a flow mapping too, and refusing YAML 1.1's implicit readings that change what was
    written: ``0600`` (octal, 384), ``1_000``, ``1:30`` (sexagesimal, 90), ``0x1F``, ``yes``
    / ``no`` / ``on`` / ``off`` as booleans.  A plain number is decimal as written, a
    boolean is true or false; anything else is quoted."""


def _line(loader: StrictLoader, node: yaml.Node) -> str:
    return f"{loader.name}: line {node.start_mark.line + 1}"


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *defaults`: keys written beside it override it, as YAML says
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise ConfigError(
                    f"{_line(loader, key_node)}: key {_short(repr(key))} given twice in one "
                    f"mapping (first on line {seen[key]})"
                )
            seen[key] = key_node.start_mark.line + 1
        except TypeError:
            continue  # an unhashable key: the constructor below reports it
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
DECIMAL_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+\.[0-9]*)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
BOOLEANS = ("true", "True", "TRUE", "false", "False", "FALSE")


def _as_written(kind: str, pattern: re.Pattern | None, construct):
    def constructor(loader: StrictLoader, node: yaml.ScalarNode):
        text = node.value
        if kind == "integer" and len(text) > MAX_DIGITS:
            raise ConfigError(f"{_line(loader, node)}: an integer of {len(text)} characters (at most {MAX_DIGITS})")
        written = text in BOOLEANS if pattern is None else pattern.fullmatch(text)
        if not written:
            value = construct(loader, node)
            raise ConfigError(
                f"{_line(loader, node)}: {_short(text)!r} would be read by YAML 1.1 as the {kind} "
                f"{_short(repr(value))}; write a plain decimal number, true or false, or quote it "
                "to keep it text"
            )
        return construct(loader, node)

    return constructor


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
StrictLoader.add_constructor(
    "tag:yaml.org,2002:int", _as_written("integer", DECIMAL_INT, yaml.SafeLoader.construct_yaml_int)
)
StrictLoader.add_constructor(
    "tag:yaml.org,2002:float", _as_written("number", DECIMAL_FLOAT, yaml.SafeLoader.construct_yaml_float)
)
StrictLoader.add_constructor(
    "tag:yaml.org,2002:bool", _as_written("boolean", None, yaml.SafeLoader.construct_yaml_bool)
)


def read_file(path: str | Path) -> dict:
    """A config file (YAML or JSON) as a mapping; anything else is a ConfigError naming the file."""
    try:
        data = read_bounded(path, MAX_CONFIG_BYTES)
    except UserError as error:
        raise ConfigError(str(error)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    loader = None
    try:
        loader = StrictLoader(text)  # its reader refuses control characters already
        loader.name = str(path)
        raw = loader.get_single_data()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}: not valid YAML: {where}{_short(' '.join(problem.split()))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys, not a {type(raw).__name__}")
    return raw


# -- the schema ----------------------------------------------------------------------------


def _is_integer(_checker, instance) -> bool:
    # JSON Schema calls 2.0 an integer; here an integer key takes a whole number written
    # without a decimal point (`range(1, 2.0 + 1)` is a crash, `1e30` a hang)
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    """Draft 2020-12 with strict integers, writing each property's schema default into the
    instance; built once (reading the schema is most of the cost of a validation)."""
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    def full_pattern(validator, pattern, instance, schema):
        # JSON Schema's `pattern` is re.search, where `$` also matches before a final
        # newline ("AB\n" would pass "^[A-Z]+$"): here every pattern matches the whole text
        if validator.is_type(instance, "string") and re.fullmatch(pattern, instance) is None:
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")

    validator = jsonschema.validators.extend(
        base,
        {"properties": set_defaults, "pattern": full_pattern},
        type_checker=base.TYPE_CHECKER.redefine("integer", _is_integer),
    )
    return validator(load_schema())


def _describe(error: jsonschema.ValidationError) -> str:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        keys = ", ".join(f"'{_key(path + [name])}'" for name in unknown)
        return f"config key {keys}: unknown key" + (f" (allowed here: {', '.join(allowed)})" if allowed else "")
    if error.validator == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        return "; ".join(f"config key '{_key(path + [name])}': required but missing" for name in missing)
    # the message quotes the value: a long one is cut, so the line still says what is wrong
    shown = repr(error.instance)
    message = error.message.replace(shown, shown if len(shown) <= 60 else shown[:57] + "…")
    if error.validator == "pattern" and "description" in error.schema:
        message += f" ({error.schema['description']})"
    return f"config key '{_key(path)}': {message}"


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))


def defaults(section: str) -> dict:
    """The schema's default of each key of a top-level section (``load``, ``analysis``): the
    one owner of the defaults, which LoadSpec, the locustfile and the run plan read."""
    properties = _validator().schema["properties"][section]["properties"]
    return {name: copy.deepcopy(spec["default"]) for name, spec in properties.items() if "default" in spec}


def key_problem(path: tuple[str, ...], value) -> str | None:
    """Why ``value`` cannot be the config key at ``path`` (``("load", "users")``): the
    schema's type, bounds and pattern, a finite number; None when it can.  For command-line
    options that set what a config key sets, so both take the same values."""
    schema = _validator().schema
    for name in path:
        schema = schema["properties"][name]
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    error = next(iter(type(_validator())(schema).iter_errors(value)), None)
    return None if error is None else error.message


def user_levels(users) -> list[int]:
    """``load.users`` (or run.json's ``users``) as its levels, ascending: a single number is
    one level."""
    return sorted(users) if isinstance(users, list) else [users]


def _value_problems(value, path: list, problems: list[str], budget: list[int]) -> None:
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


def validate(raw: dict, workdir: str | Path | None = None) -> dict:
    """Return a copy of ``raw`` with defaults filled in, or raise ConfigError.  ``workdir``
    (default: the current directory) is where relative paths such as simulated roots lie."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config: the top level must be a mapping of config keys, not a {type(raw).__name__}")
    problems: list[str] = []
    _value_problems(raw, [], problems, [MAX_VALUES])
    _raise(problems)
    config = copy.deepcopy(raw)
    errors = sorted(_validator().iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    _raise([_describe(e) for e in errors])
    _raise(_semantic_problems(config, Path(workdir or Path.cwd()).resolve()))
    return config


# -- `--config` on the command line ----------------------------------------------------------

SCALAR_TYPES = {"integer": int, "number": (int, float), "boolean": bool, "null": type(None)}


def _subschema(schema: dict, name) -> dict:
    if isinstance(name, int):
        return schema.get("items", {})
    properties = schema.get("properties", {})
    if name in properties:
        return properties[name]
    extra = schema.get("additionalProperties", {})
    return extra if isinstance(extra, dict) else {}


def _typed(value, schema: dict):
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
    wanted = tuple(SCALAR_TYPES[t] for t in types if t in SCALAR_TYPES)
    if isinstance(parsed, bool) and "boolean" not in types:
        return value
    return parsed if isinstance(parsed, wanted) else value


def typed_overrides(overrides: dict) -> dict:
    """``--config`` values with their types.  Snakemake reads a scalar as an int, float or
    bool, but a mapping or list (``timings={load_s: 30}``) with YAML's base loader, all text;
    here text where the schema wants a number, a boolean or null is read as YAML.  Text that
    does not read as the wanted type is left as it is, for validation to name."""
    return _typed(dict(overrides), _validator().schema)  # the schema validation reads, read once


# -- what a schema cannot express ---------------------------------------------------------------

# {controller_python} is the controller's Python (the simulated servers run with it), not a
# host's `python` key; {python} is its name in configs written before the two were told apart
SERVER_PLACEHOLDERS = ("root", "controller_python", "env", "python")
VALUE_PLACEHOLDER = "value"


def template_fields(key: str, text: str, allowed: tuple[str, ...], problems: list[str]) -> list[str] | None:
    """The placeholders of a ``str.format`` template, in order, or None (with a problem
    added) when it has another placeholder, an attribute, index, conversion or format
    spec, or an unpaired brace: what ``format`` would raise on, or leak through, at run time."""
    literal_braces = "a literal brace is written {{ or }}"
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as error:
        problems.append(f"config key '{key}': not a valid template: {error} ({literal_braces})")
        return None
    names = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in allowed or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            known = ", ".join("{" + a + "}" for a in allowed)
            problems.append(f"config key '{key}': placeholder {_short(shown)} is not one of {known} ({literal_braces})")
            return None
        names.append(name)
    return names


ANY_CHAR = object()  # a first character that could be anything


def _first_chars(items) -> set:
    """What the text matched by a parsed regex sequence can start with: characters,
    ANY_CHAR, and None when it can match the empty string."""
    c = _re_constants
    for at, (op, arg) in enumerate(items):
        if op is c.AT:
            continue
        if op is c.LITERAL:
            return {arg}
        if op is c.SUBPATTERN:
            first = _first_chars(arg[-1])
        elif op is c.BRANCH:
            first = set().union(*(_first_chars(branch) for branch in arg[1]))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            first = _first_chars(arg[2]) | ({None} if arg[0] == 0 else set())
        else:
            return {ANY_CHAR}
        if None not in first:
            return first
        return (first - {None}) | _first_chars(items[at + 1 :])
    return {None}


def _ambiguous_repeat(items, inside_repeat: bool = False) -> bool:
    """A repeat that can split one text in many ways, so a failing match backtracks
    through exponentially many: a repeat inside a repeat (``(a+)+``, ``(\\w*\\s?)*``), or,
    inside a repeat, an alternation whose branches may start alike or match nothing
    (``(a|aa)*``, ``(\\d|\\w)+``).  Conservative: some harmless patterns are refused too."""
    c = _re_constants
    for op, arg in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) and arg[1] > 1:
            if inside_repeat or _ambiguous_repeat(arg[2], True):
                return True
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            if _ambiguous_repeat(arg[2], inside_repeat and op is not c.POSSESSIVE_REPEAT):
                return True
        elif op is c.SUBPATTERN:
            if _ambiguous_repeat(arg[-1], inside_repeat):
                return True
        elif op is c.BRANCH:
            if inside_repeat:
                firsts = [_first_chars(branch) for branch in arg[1]]
                seen: set = set()
                for first in firsts:
                    if None in first or ANY_CHAR in first or first & seen or (ANY_CHAR in seen):
                        return True
                    seen |= first
            if any(_ambiguous_repeat(branch, inside_repeat) for branch in arg[1]):
                return True
        elif op is c.ATOMIC_GROUP and _ambiguous_repeat(arg, False):
            return True
    return False


def _regex(key: str, pattern: str, problems: list[str]) -> re.Pattern | None:
    try:
        compiled = re.compile(pattern)
        ambiguous = _ambiguous_repeat(_re_parser.parse(pattern))
    except (re.error, RecursionError, OverflowError) as error:
        problems.append(f"config key '{key}': not a regular expression: {error}")
        return None
    if ambiguous:
        problems.append(
            f"config key '{key}': a repeat inside a repeat, or a repeated alternation whose branches "
            "can match alike: matching it can take exponential time (catastrophic backtracking); "
            "rewrite it with one repeat, e.g. [0-9.]+ for ([0-9]+\\.?)+"
        )
        return None
    if compiled.search("") is not None:
        problems.append(f"config key '{key}': matches the empty string, so it matches everywhere")
        return None
    return compiled


def _one_line(key: str, text: str | None, problems: list[str]) -> bool:
    if isinstance(text, str) and ("\n" in text or "\r" in text):
        problems.append(f"config key '{key}': must be one line")
        return False
    return True


URL_PASSWORD = re.compile(r"(//[^/@\s:]*):[^/@\s]*@")


def redact_url(text: str) -> str:
    """``text`` with any password of a URL in it (``//user:secret@``) replaced by ``***``:
    an error message never echoes one."""
    return URL_PASSWORD.sub(r"\1:***@", text)


def port_problem(port) -> str | None:
    """Why ``port`` (an int, or its digits) is no TCP port; never wrapped to one."""
    if isinstance(port, str):
        if not port.isascii() or not port.isdigit():
            return f"port {_short(port)!r} is not a number"
        if len(port) > 5:
            return f"port {_short(port)} is outside 1-65535"
        port = int(port)
    return None if 1 <= port <= 65535 else f"port {port} is outside 1-65535"


def _host_name_problem(name: str) -> str | None:
    """A host name that is not plain ASCII: shown punycoded, or refused for an invisible character."""
    if name.isascii():
        return None
    hidden = [c for c in name if not c.isprintable() or unicodedata.category(c) in ("Cf", "Zs", "Mn")]
    if hidden:
        return (
            f"host has an invisible character ({', '.join(f'U+{ord(c):04X}' for c in hidden[:3])}); "
            "write the host in ASCII"
        )
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
        return "host is not ASCII, and has no punycode form: write the host in ASCII"
    return f"host is not ASCII: write it punycoded, as {ascii_name}"


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` is no OpenAI endpoint (http(s)://host:port[/path]), or None."""
    if url != url.strip() or any(c.isspace() for c in url):
        return "contains whitespace"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"not a URL: {error}"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    if _host_name_problem(parts.hostname):
        return _host_name_problem(parts.hostname)
    if port is not None and port_problem(port):
        return port_problem(port)
    if parts.username is not None or parts.query or parts.fragment:
        return "must be http(s)://host:port[/path], without user, query or fragment"
    return None


def literal_kind(text: str) -> str | None:
    """The kind of Python literal ``text`` is (``number`` for ints and floats alike,
    ``string``, ``bool``, ``None``, ``tuple``, …), or None when it is not a literal, or
    carries a comment (pasted into a line, a comment would swallow the rest of it)."""
    try:
        value = ast.literal_eval(text.strip())
        if any(token.type == tokenize.COMMENT for token in tokenize.generate_tokens(io.StringIO(text).readline)):
            return None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError):
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", bytes: "bytes", type(None): "None"}.get(type(value), type(value).__name__)


def _setting_problems(config: dict, problems: list[str]) -> None:
    setting, arms = config["setting"], config["arms"]
    for letter, arm in arms.items():
        _one_line(f"arms.{letter}.value", arm["value"], problems)
    if setting["method"] == "env":
        if "env_var" not in setting:
            problems.append("config key 'setting.env_var': required when method is env")
        for name, cluster in config["clusters"].items():
            starts = {
                h: host["server"]["start"] for h, host in cluster["hosts"].items() if "start" in host.get("server", {})
            }
            if not starts:
                problems.append(
                    f"config key 'clusters.{name}.hosts': with setting.method env a server.start "
                    "command with {env} must pass the value on; no host has one"
                )
            for host_name, start in starts.items():
                if "{env}" not in start:
                    problems.append(
                        f"config key 'clusters.{name}.hosts.{host_name}.server.start': must contain "
                        "{env} (setting.method env passes the arm's value through it; without it "
                        "every arm runs the same server)"
                    )
        return
    missing = [name for name in ("file", "anchor", "replacement") if name not in setting]
    for name in missing:
        problems.append(f"config key 'setting.{name}': required when method is file")
    if missing:
        return
    _one_line("setting.file", setting["file"], problems)
    _normalised("setting.file", setting["file"], problems)
    anchor = _regex("setting.anchor", setting["anchor"], problems)
    fields = template_fields("setting.replacement", setting["replacement"], (VALUE_PLACEHOLDER,), problems)
    if fields is not None and fields != [VALUE_PLACEHOLDER]:
        problems.append(
            f"config key 'setting.replacement': must contain {{value}} exactly once (it has it {len(fields)} times)"
        )
        fields = None
    if anchor is None or fields is None:
        return
    kinds = {}
    for letter, arm in arms.items():
        rendered = setting["replacement"].format(value=arm["value"])
        count = len(anchor.findall(rendered))
        if count != 1:
            problems.append(
                f"config key 'arms.{letter}.value': setting.replacement with this value "
                f"({_short(rendered)!r}) matches setting.anchor {count} times: it must match once, "
                "so that a patched file can be found, patched again and restored"
            )
        if setting["value_type"] == "literal":
            kinds[letter] = literal_kind(arm["value"])
            if kinds[letter] is None:
                problems.append(
                    f"config key 'arms.{letter}.value': {_short(arm['value'])!r} is not a Python "
                    "literal (a number, a quoted string, True, …); if the file takes code, set "
                    "setting.value_type: expression"
                )
    if len(set(k for k in kinds.values() if k)) > 1:
        problems.append(
            "config key 'arms': the values are literals of different kinds ("
            + ", ".join(f"{letter} {kind}" for letter, kind in kinds.items() if kind)
            + ")"
        )


def host_root(workdir: Path, root: str) -> Path:
    """A host's root as written, absolute and normalised: a '..' is resolved by the text, so
    it cannot climb out unseen; a link (.thermab to a shared directory) stays where the user
    put it, and a link loop is for the first read to report, not a traceback here."""
    return Path(os.path.abspath(Path(workdir) / root))


def _normalised(key: str, path: str, problems: list[str]) -> None:
    """A path that reaches a host is written normalised: a '..' would climb out of the
    simulated root (or the vllm package) the path is meant to stay in."""
    if any(part in ("", ".", "..") for part in path.split("/")[1:]) or path.startswith(("./", "../")):
        problems.append(
            f"config key '{key}': {_short(path)!r} is not a normalised path (no '.', '..' "
            "or empty component, no trailing /): it must stay where it is written"
        )


def _address_problem(address: str) -> str | None:
    if address.startswith("["):
        return "write an IPv6 address without brackets (the port goes under 'port')"
    if address.count(":") == 1:
        return "carries its own port: give the host alone, and the port under 'port'"
    if ":" in address:
        try:
            ipaddress.IPv6Address(address.partition("%")[0])
        except ValueError:
            return "is not an IPv6 address (a port goes under 'port')"
    return None


def _reaches(host: dict, workdir: Path) -> tuple:
    """What decides which files a host's paths reach: two hosts alike reach the same files."""
    where = (host.get("address", "").lower(), host.get("port", 22)) if host["transport"] == "ssh" else ("local",)
    root = str(host_root(workdir, host["root"])) if "root" in host else None
    return (*where, host.get("container_engine", "none"), host.get("container"), root)


def _host_problems(where: str, host: dict, workdir: Path, problems: list[str]) -> None:
    if host["transport"] == "ssh" and "address" not in host:
        problems.append(f"config key '{where}.address': required for transport ssh")
    if "address" in host and _address_problem(host["address"]):
        problems.append(
            f"config key '{where}.address': {_short(host['address'])!r} {_address_problem(host['address'])}"
        )
    if "jump" in host:
        jump_port = host["jump"].rpartition("@")[2].partition(":")[2]
        if jump_port and port_problem(jump_port):
            problems.append(f"config key '{where}.jump': {port_problem(jump_port)}")
    if "agent_dir" in host:
        _normalised(f"{where}.agent_dir", host["agent_dir"], problems)
    if host.get("container_engine", "none") != "none" and "container" not in host:
        problems.append(f"config key '{where}.container': required with container_engine {host['container_engine']}")
    for name in ("root", "python", "agent_python", "agent_dir", "key_file", "known_hosts"):
        _one_line(f"{where}.{name}", host.get(name), problems)
    if host.get("agent_dir", "").rstrip("/") == "":
        problems.append(f"config key '{where}.agent_dir': not the root directory")
    if "process_pattern" in host:
        _regex(f"{where}.process_pattern", host["process_pattern"], problems)
    if "simulated" in host:
        if "root" not in host:
            problems.append(f"config key '{where}.root': a simulated host needs its node directory")
        else:
            root = host_root(workdir, host["root"])
            if root == workdir or not root.is_relative_to(workdir):
                problems.append(
                    f"config key '{where}.root': a simulated node's directory must lie inside "
                    f"the working directory ({workdir}), not at {_short(str(root))}"
                )
    for which in ("stop", "start"):
        template = host.get("server", {}).get(which)
        if template is None:
            continue
        fields = template_fields(f"{where}.server.{which}", template, SERVER_PLACEHOLDERS, problems)
        if fields and "root" in fields and "root" not in host:
            problems.append(f"config key '{where}.server.{which}': uses {{root}}, but the host has no root")


def _semantic_problems(config: dict, workdir: Path) -> list[str]:
    problems: list[str] = []
    arms = config["arms"]
    unknown = sorted(set(config["order"]) - set(arms))
    if unknown:
        problems.append(
            f"config key 'order': arm(s) {', '.join(unknown)} not defined under 'arms' (defined: {', '.join(arms)})"
        )
    if len(set(config["order"])) != len(config["order"]):
        problems.append(f"config key 'order': '{config['order']}' names an arm twice")
    _setting_problems(config, problems)
    _regex("monitor.process_pattern", config["monitor"]["process_pattern"], problems)
    _one_line("load.model", config["load"]["model"], problems)
    _one_line("analysis.timeline_zone", config["analysis"]["timeline_zone"], problems)
    safety, timings = config["safety"], config["timings"]
    cap = safety["max_load_minutes"]
    if cap is not None and timings["load_s"] > cap * 60:
        problems.append(
            f"config key 'timings.load_s': {timings['load_s']} s is longer than 'safety.max_load_minutes' ({cap} min)"
        )
    thermal_interval = config["monitor"]["intervals"]["thermal"]
    silence = safety["max_sensor_silence_s"]
    if silence is not None and silence < 2 * thermal_interval:
        problems.append(
            f"config key 'safety.max_sensor_silence_s': {silence} s is shorter than two thermal "
            f"sample intervals ('monitor.intervals.thermal' = {thermal_interval} s)"
        )
    _question_problems(config, problems)
    _tune_problems(config, problems)
    _across_keys(config, problems)
    problem = extra_body_problem(config["load"]["extra_body"])
    if problem:
        problems.append(f"config key 'load.extra_body': {problem}")
    for name, cluster in config["clusters"].items():
        hosts = cluster["hosts"]
        if config["setting"]["method"] == "file":
            reached: dict = {}
            for host_name, host in hosts.items():
                first = reached.setdefault(_reaches(host, workdir), host_name)
                if first != host_name:
                    problems.append(
                        f"config key 'clusters.{name}.hosts.{host_name}': reaches the same files as "
                        f"host {first} (same address, container and root): the setting's file "
                        "would be patched twice, and the second copy of its original would be "
                        "the patched one"
                    )
        if cluster["head"] not in hosts:
            problems.append(
                f"config key 'clusters.{name}.head': '{_short(cluster['head'])}' is not one of its "
                f"hosts ({', '.join(hosts)})"
            )
        problem = endpoint_problem(cluster["endpoint"])
        if problem:
            problems.append(
                f"config key 'clusters.{name}.endpoint': {_short(redact_url(cluster['endpoint']))!r} {problem}"
            )
        for host_name, host in hosts.items():
            _host_problems(f"clusters.{name}.hosts.{host_name}", host, workdir, problems)
    return problems


# -- declared questions (issue 24; analysis/questions.py answers them) ---------------------


def default_questions(zone: str = "TSOC") -> list[dict]:
    """The spin-wait study's questions: cooler and less CPU, no real loss of speed or energy."""
    return [
        {"metric": names.zone_mean("head", zone), "kind": "lower"},
        {"metric": names.cpu_median("head"), "kind": "lower"},
        {"metric": names.OUTPUT_THROUGHPUT, "kind": "non_inferior", "better": "higher", "margin_pct": 5},
        {"metric": names.PROBE_DECODE_SPEED, "kind": "non_inferior", "better": "higher", "margin_pct": 6},
        {"metric": names.CLUSTER_ENERGY_PER_TOKEN, "kind": "lower"},
        {"metric": names.STALL_GAPS, "kind": "non_inferior", "better": "lower", "margin": 0.5},
    ]


def question_kinds() -> tuple[str, ...]:
    """The kinds a question may be: the schema's, their one owner."""
    return tuple(_validator().schema["properties"]["questions"]["items"]["properties"]["kind"]["enum"])


def question_hosts(config: dict) -> list[str]:
    return ["head"] + sorted({name for cluster in config["clusters"].values() for name in cluster["hosts"]} - {"head"})


def known_metric(config: dict, metric: str) -> bool:
    """A metric variance.csv can have: a run metric, or a host's CPU or zone mean (any zone
    name: zones are found at preflight; one other than the timeline zone has no data)."""
    return metric in names.RUN_METRICS or names.host_of(metric) in question_hosts(config)


def question_words(question: dict) -> str:
    """A question in words, for its errors and its row of questions.csv."""
    margin = (
        f"{question['margin_pct']:g} %"
        if "margin_pct" in question
        else f"{question['margin']:g}"
        if "margin" in question
        else "?"
    )
    if question["kind"] == "non_inferior":
        return f"{question['metric']} no worse than {margin} ({question.get('better', '?')} is better)"
    if question["kind"] == "equivalent":
        return f"{question['metric']} equivalent within ± {margin}"
    return f"{question['metric']} {question['kind']}" + (
        f" by at least {question['by']:g}" if question.get("by") else ""
    )


def _question_problems(config: dict, problems: list[str]) -> None:
    config.setdefault("questions", default_questions(config["analysis"]["timeline_zone"]))
    for index, question in enumerate(config["questions"]):
        _one_question_problems(config, f"questions.{index}", question, problems)
    if config["until"] == "decided":
        if not config["questions"]:
            problems.append("config key 'until': 'decided' needs at least one question under 'questions'")
        if config["max_repeats"] < max(2, config["repeats"]):
            problems.append(
                f"config key 'max_repeats': {config['max_repeats']} is below 'repeats' "
                f"({config['repeats']}) or one crossover pair (2)"
            )


def extra_body_problem(extra_body) -> str | None:
    """Why ``extra_body`` cannot be merged into every request: not a JSON object, or larger
    than MAX_EXTRA_BODY written as JSON; None when it can."""
    if not isinstance(extra_body, dict):
        return f"must be a JSON object, not {type(extra_body).__name__}"
    try:
        size = len(json.dumps(extra_body, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as error:
        return f"not JSON: {_short(str(error))}"
    return f"{size} bytes as JSON, more than {MAX_EXTRA_BODY}" if size > MAX_EXTRA_BODY else None


def _one_question_problems(config: dict, where: str, question: dict, problems: list[str]) -> None:
    """A question's own checks (``where``: its key, questions.N or tune.constraints.N)."""

    def key(field=None):
        return f"config key '{where}{'.' + field if field else ''}' ({_short(question['metric'])} {question['kind']})"

    margins = [name for name in ("margin", "margin_pct") if name in question]
    if not known_metric(config, question["metric"]):
        problems.append(
            f"{key('metric')}: unknown metric (one of: {', '.join(names.RUN_METRICS)}, 'HOST ZONE mean', "
            f"'HOST vLLM CPU median'; HOST one of {', '.join(map(_short, question_hosts(config)))})"
        )
    if len(margins) > 1:
        problems.append(f"{key('margin_pct')}: give margin or margin_pct, not both")
    for name in margins + ["by"] * ("by" in question):
        if question[name] < 0:
            problems.append(f"{key(name)}: {question[name]} is negative")
    if "margin_pct" in question and question["margin_pct"] >= 100:
        problems.append(f"{key('margin_pct')}: {question['margin_pct']} is 100 % or more, which any answer passes")
    if question["kind"] in ("non_inferior", "equivalent"):
        if not margins:
            problems.append(f"{key()}: needs margin or margin_pct")
        if "by" in question:
            problems.append(f"{key('by')}: 'by' belongs to lower/higher; this kind has a margin")
    else:
        for name in margins:
            problems.append(f"{key(name)}: a margin belongs to non_inferior/equivalent; lower/higher take 'by'")
    outside = [level for level in question.get("users", []) if level not in user_levels(config["load"]["users"])]
    if outside:
        problems.append(
            f"{key('users')}: {', '.join(map(str, outside))} not among the levels of 'load.users' "
            f"({', '.join(map(str, user_levels(config['load']['users'])))})"
        )
    if (question["kind"] == "non_inferior") != ("better" in question):
        problems.append(
            f"{key('better')}: (lower or higher) is "
            + ("required" if question["kind"] == "non_inferior" else "for non_inferior only")
        )


def _tune_problems(config: dict, problems: list[str]) -> None:
    """``tune`` (docs/tune.md): a range that holds values, a metric that exists, one cluster.
    The budget's floor (the phases one decision needs) is checked by thermab.tune.plan, which
    owns the looks' arithmetic with analysis.sequential."""
    tune = config.get("tune")
    if tune is None:
        return
    low, high = tune["min"], tune["max"]
    if high <= low:
        problems.append(
            f"config key 'tune.max': {high:g} is not above 'tune.min' ({low:g}): the range holds no value to try"
        )
    if tune["scale"] == "log" and low <= 0:
        problems.append(
            f"config key 'tune.min': {low:g} with scale log: a log scale needs a range above zero "
            "(min > 0), or scale linear"
        )
    if not known_metric(config, tune["objective"]):
        problems.append(
            f"config key 'tune.objective': {_short(tune['objective'])!r} is no metric of "
            f"tables/variance.csv (one of: {', '.join(names.RUN_METRICS)}, 'HOST ZONE mean', "
            f"'HOST vLLM CPU median')"
        )
    for index, question in enumerate(tune["constraints"]):
        _one_question_problems(config, f"tune.constraints.{index}", question, problems)
    if len(config["clusters"]) != 1:
        problems.append(
            f"config key 'tune': a tune searches one cluster, and the config has "
            f"{len(config['clusters'])} ({', '.join(map(_short, config['clusters']))})"
        )
    if literal_kind(next(iter(config["arms"].values()))["value"]) != "number":
        problems.append(
            "config key 'tune': the reference arm's value is not a number, so no number can be tried against it"
        )


def _across_keys(config: dict, problems: list[str]) -> None:
    """Keys that are each valid but contradict one another."""
    timings, intervals = config["timings"], config["monitor"]["intervals"]
    for kind in ("thermal", "cpu"):  # the phase tables' samples: none would fall inside a load window
        if intervals[kind] >= timings["load_s"]:
            problems.append(
                f"config key 'monitor.intervals.{kind}': {intervals[kind]} s is not shorter than the "
                f"load window ('timings.load_s' = {timings['load_s']} s)"
            )
    abort = config["safety"]["abort_at_c"]
    if abort is not None and timings["cooldown_below_c"] >= abort:
        problems.append(
            f"config key 'timings.cooldown_below_c': {timings['cooldown_below_c']} °C is not below "
            f"the interlock ('safety.abort_at_c' = {abort} °C): a cooldown would wait for a "
            "temperature that stops the run"
        )
    thresholds = config["analysis"]["thresholds_c"]
    for index in range(1, len(thresholds)):
        if thresholds[index] <= thresholds[index - 1]:
            before = thresholds.index(thresholds[index]) if thresholds[index] in thresholds[:index] else index - 1
            problems.append(
                f"config key 'analysis.thresholds_c.{index}': {thresholds[index]} "
                + ("is given twice" if thresholds[before] == thresholds[index] else "is not above")
                + f" ('analysis.thresholds_c.{before}' = {thresholds[before]}); thresholds are listed "
                "once each, ascending"
            )
            break


def sensor_silence_s(config: dict) -> float:
    """How long a host's watched zones may go without a fresh reading during a load before
    the interlock calls it blind and stops the load."""
    configured = config["safety"]["max_sensor_silence_s"]
    return configured if configured is not None else max(5.0, 3 * config["monitor"]["intervals"]["thermal"])


@dataclass(frozen=True)
class HostSpec:
    """One host of a cluster, with every path and command resolved."""

    name: str
    cluster: str
    transport: str
    settings: dict = field(repr=False)
    root: Path | None = None
    simulated: str | None = None

    @property
    def container(self) -> str | None:
        return self.settings.get("container")

    @property
    def container_engine(self) -> str:
        return self.settings.get("container_engine", "none")

    def command(self, which: str, env: dict[str, str] | None = None) -> str | None:
        """The server stop/start command with {root}, {controller_python} (or its old name
        {python}) and {env} filled in, quoted.

        ``{env}`` becomes ``NAME=value`` pairs, for settings the server reads from its
        environment (``setting.method: env``)."""
        template = self.settings.get("server", {}).get(which)
        if template is None:
            return None
        pairs = " ".join(f"{name}={shlex.quote(value)}" for name, value in (env or {}).items())
        controller_python = shlex.quote(sys.executable)
        return template.format(
            root=shlex.quote(str(self.root)) if self.root else "",
            controller_python=controller_python,
            python=controller_python,
            env=pairs,
        )

    def process_pattern(self, default: str) -> str:
        if "process_pattern" in self.settings:
            return self.settings["process_pattern"]
        if self.simulated:
            # simulated nodes share one machine: only this node's processes count
            return f"(?:{default}).*--node {re.escape(str(self.root))}(\\s|$)"
        return default


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    head: str
    endpoint: str
    end_state: str
    hosts: tuple[HostSpec, ...]  # in start order

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)


TRIP_MARGIN_C = 8.0  # default interlock: this far below the lowest trip point
TRIP_MARGIN_MIN_C = 2.0  # a configured interlock closer to the trip point is refused


def abort_threshold(config: dict, trip_points_c: list[float]) -> float | None:
    """The interlock temperature for hosts with these trip points, or None (no zones and
    nothing configured); a setting too close to the trip point is refused."""
    configured = config["safety"]["abort_at_c"]
    if not trip_points_c:
        return configured
    lowest = min(trip_points_c)
    if configured is None:
        return lowest - TRIP_MARGIN_C
    if configured > lowest - TRIP_MARGIN_MIN_C:
        raise ConfigError(
            f"config key 'safety.abort_at_c': {configured} °C is above the lowest trip point "
            f"({lowest} °C) minus {TRIP_MARGIN_MIN_C} °C"
        )
    return configured


def cluster_spec(config: dict, name: str, workdir: Path | None = None) -> ClusterSpec:
    workdir = Path(workdir or Path.cwd())
    raw = config["clusters"][name]
    hosts = []
    for host_name, host in raw["hosts"].items():
        root = host_root(workdir, host["root"]) if "root" in host else None
        hosts.append(HostSpec(host_name, name, host["transport"], host, root, host.get("simulated")))
    return ClusterSpec(name, raw["head"], raw["endpoint"].rstrip("/"), raw["end_state"], tuple(hosts))


def load(path: str | Path, workdir: str | Path | None = None) -> dict:
    """Read and validate a config file (for use outside Snakemake); errors name the file."""
    raw = read_file(path)
    try:
        return validate(raw, workdir)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="thermab check-config", description="validate a thermab config file")
    parser.add_argument("config", help="a YAML config file")
    args = parser.parse_args(argv)
    config = load(args.config)
    print(
        f"{args.config}: valid ({', '.join(config['clusters'])}; order {config['order']}, "
        f"{config['repeats']} repeat(s))"
    )
    return 0
