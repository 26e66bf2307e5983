"""Load and check the workflow config: a strict YAML reader, JSON-schema validation with
defaults, then the checks a schema cannot express (templates, regexes, URLs, paths, what a
patch will write).  Everything is checked before any job runs; every error is one line
naming the config key (or the file) at fault."""

from __future__ import annotations

import ast
import copy
import functools
import io
import math
import re
import shlex
import string
import sys
import tokenize
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import yaml

from thermab.errors import UserError  # noqa: F401 (imported from here by much of the package)

# package data, so a non-editable install validates the same way (workflow/schemas/ links here)
SCHEMA = resources.files("thermab") / "config.schema.yaml"
MAX_VALUES = 100_000  # values in one config, counted through YAML aliases (a billion laughs stops here)
MAX_MESSAGE = 300  # characters of a value shown in an error


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

class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last
    one silently, so an arm or host written twice would vanish without a word."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *defaults`: keys written beside it override it, as YAML says
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:
            continue  # an unhashable key: the constructor below reports it
        if first != key_node.start_mark.line + 1:
            raise ConfigError(f"{loader.name}: line {key_node.start_mark.line + 1}: key {_short(repr(key))} "
                              f"given twice in one mapping (first on line {first})")
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_file(path: str | Path) -> dict:
    """A config file (YAML or JSON) as a mapping; anything else is a ConfigError naming the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    loader = StrictLoader(text)
    loader.name = str(path)
    try:
        raw = loader.get_single_data()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}: not valid YAML: {where}{_short(' '.join(problem.split()))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    finally:
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

    validator = jsonschema.validators.extend(base, {"properties": set_defaults},
                                             type_checker=base.TYPE_CHECKER.redefine("integer", _is_integer))
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


def _value_problems(value, path: list, problems: list[str], budget: list[int]) -> None:
    """What no schema keyword catches, anywhere in the config: numbers that are not
    finite (every comparison with NaN is false, so an interlock at NaN never fires), keys
    that are not strings (YAML reads `on:` as True and `1:` as 1), NUL in strings, and a
    config too large once its aliases are expanded."""
    budget[0] -= 1
    if budget[0] < 0:
        if budget[0] == -1:
            problems.append(f"config key '{_key(path)}': the config has more than {MAX_VALUES} values "
                            "once YAML aliases are expanded")
        return
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"config key '{_key(path)}': {value} is not a finite number")
    elif isinstance(value, str) and "\0" in value:
        problems.append(f"config key '{_key(path)}': contains a NUL character")
    elif isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                problems.append(f"config key '{_key(path + [name])}': the key {name!r} is of type "
                                f"{type(name).__name__}, not a string (quote it)")
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
    except yaml.YAMLError:
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

SERVER_PLACEHOLDERS = ("root", "python", "env")
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
            problems.append(f"config key '{key}': placeholder {_short(shown)} is not one of {known} "
                            f"({literal_braces})")
            return None
        names.append(name)
    return names


def _regex(key: str, pattern: str, problems: list[str]) -> re.Pattern | None:
    try:
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as error:
        problems.append(f"config key '{key}': not a regular expression: {error}")
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


def _endpoint_problem(url: str) -> str | None:
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
    if port == 0:
        return "port 0"
    if parts.username is not None or parts.query or parts.fragment:
        return "must be http(s)://host:port[/path], without user, query or fragment"
    return None


def literal_kind(text: str) -> str | None:
    """The kind of Python literal ``text`` is (``number`` for ints and floats alike,
    ``string``, ``bool``, ``None``, ``tuple``, …), or None when it is not a literal, or
    carries a comment (pasted into a line, a comment would swallow the rest of it)."""
    try:
        value = ast.literal_eval(text.strip())
        if any(token.type == tokenize.COMMENT
               for token in tokenize.generate_tokens(io.StringIO(text).readline)):
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
            starts = {h: host["server"]["start"] for h, host in cluster["hosts"].items()
                      if "start" in host.get("server", {})}
            if not starts:
                problems.append(f"config key 'clusters.{name}.hosts': with setting.method env a server.start "
                                "command with {env} must pass the value on; no host has one")
            for host_name, start in starts.items():
                if "{env}" not in start:
                    problems.append(f"config key 'clusters.{name}.hosts.{host_name}.server.start': must contain "
                                    "{env} (setting.method env passes the arm's value through it; without it "
                                    "every arm runs the same server)")
        return
    missing = [name for name in ("file", "anchor", "replacement") if name not in setting]
    for name in missing:
        problems.append(f"config key 'setting.{name}': required when method is file")
    if missing:
        return
    _one_line("setting.file", setting["file"], problems)
    anchor = _regex("setting.anchor", setting["anchor"], problems)
    fields = template_fields("setting.replacement", setting["replacement"], (VALUE_PLACEHOLDER,), problems)
    if fields is not None and fields != [VALUE_PLACEHOLDER]:
        problems.append("config key 'setting.replacement': must contain {value} exactly once "
                        f"(it has it {len(fields)} times)")
        fields = None
    if anchor is None or fields is None:
        return
    kinds = {}
    for letter, arm in arms.items():
        rendered = setting["replacement"].format(value=arm["value"])
        count = len(anchor.findall(rendered))
        if count != 1:
            problems.append(f"config key 'arms.{letter}.value': setting.replacement with this value "
                            f"({_short(rendered)!r}) matches setting.anchor {count} times: it must match once, "
                            "so that a patched file can be found, patched again and restored")
        if setting["value_type"] == "literal":
            kinds[letter] = literal_kind(arm["value"])
            if kinds[letter] is None:
                problems.append(f"config key 'arms.{letter}.value': {_short(arm['value'])!r} is not a Python "
                                "literal (a number, a quoted string, True, …); if the file takes code, set "
                                "setting.value_type: expression")
    if len(set(k for k in kinds.values() if k)) > 1:
        problems.append("config key 'arms': the values are literals of different kinds ("
                        + ", ".join(f"{letter} {kind}" for letter, kind in kinds.items() if kind) + ")")


def _host_problems(where: str, host: dict, workdir: Path, problems: list[str]) -> None:
    if host["transport"] == "ssh" and "address" not in host:
        problems.append(f"config key '{where}.address': required for transport ssh")
    if host.get("container_engine", "none") != "none" and "container" not in host:
        problems.append(f"config key '{where}.container': required with container_engine "
                        f"{host['container_engine']}")
    for name in ("root", "python", "agent_dir", "key_file", "known_hosts"):
        _one_line(f"{where}.{name}", host.get(name), problems)
    if host.get("agent_dir", "").rstrip("/") == "":
        problems.append(f"config key '{where}.agent_dir': not the root directory")
    if "process_pattern" in host:
        _regex(f"{where}.process_pattern", host["process_pattern"], problems)
    if "simulated" in host:
        if "root" not in host:
            problems.append(f"config key '{where}.root': a simulated host needs its node directory")
        else:
            root = (workdir / host["root"]).resolve()
            if root == workdir or not root.is_relative_to(workdir):
                problems.append(f"config key '{where}.root': a simulated node's directory must lie inside "
                                f"the working directory ({workdir}), not at {_short(str(root))}")
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
        problems.append(f"config key 'order': arm(s) {', '.join(unknown)} not defined under 'arms' "
                        f"(defined: {', '.join(arms)})")
    if len(set(config["order"])) != len(config["order"]):
        problems.append(f"config key 'order': '{config['order']}' names an arm twice")
    _setting_problems(config, problems)
    _regex("monitor.process_pattern", config["monitor"]["process_pattern"], problems)
    _one_line("load.model", config["load"]["model"], problems)
    _one_line("analysis.timeline_zone", config["analysis"]["timeline_zone"], problems)
    safety, timings = config["safety"], config["timings"]
    cap = safety["max_load_minutes"]
    if cap is not None and timings["load_s"] > cap * 60:
        problems.append(f"config key 'timings.load_s': {timings['load_s']} s is longer than "
                        f"'safety.max_load_minutes' ({cap} min)")
    thermal_interval = config["monitor"]["intervals"]["thermal"]
    silence = safety["max_sensor_silence_s"]
    if silence is not None and silence < 2 * thermal_interval:
        problems.append(f"config key 'safety.max_sensor_silence_s': {silence} s is shorter than two thermal "
                        f"sample intervals ('monitor.intervals.thermal' = {thermal_interval} s)")
    _question_problems(config, problems)
    for name, cluster in config["clusters"].items():
        hosts = cluster["hosts"]
        if cluster["head"] not in hosts:
            problems.append(f"config key 'clusters.{name}.head': '{_short(cluster['head'])}' is not one of its "
                            f"hosts ({', '.join(hosts)})")
        problem = _endpoint_problem(cluster["endpoint"])
        if problem:
            problems.append(f"config key 'clusters.{name}.endpoint': {_short(cluster['endpoint'])!r} {problem}")
        for host_name, host in hosts.items():
            _host_problems(f"clusters.{name}.hosts.{host_name}", host, workdir, problems)
    return problems


# -- declared questions (issue 24; analysis/questions.py answers them) ---------------------

# variance.csv's metrics a question may name: these, and per host (or `head`, each cluster's
# head) "{host} {zone} mean" of the timeline zone and "{host} vLLM CPU median"
RUN_METRICS = ("output throughput", "probe decode speed", "stall gaps", "cluster energy per token")


def default_questions(zone: str = "TSOC") -> list[dict]:
    """The spin-wait study's questions: cooler and less CPU, no real loss of speed or energy."""
    return [{"metric": f"head {zone} mean", "kind": "lower"},
            {"metric": "head vLLM CPU median", "kind": "lower"},
            {"metric": "output throughput", "kind": "non_inferior", "better": "higher", "margin_pct": 5},
            {"metric": "probe decode speed", "kind": "non_inferior", "better": "higher", "margin_pct": 6},
            {"metric": "cluster energy per token", "kind": "lower"},
            {"metric": "stall gaps", "kind": "non_inferior", "better": "lower", "margin": 0.5}]


def question_hosts(config: dict) -> list[str]:
    return ["head"] + sorted({name for cluster in config["clusters"].values() for name in cluster["hosts"]} - {"head"})


def known_metric(config: dict, metric: str) -> bool:
    """A metric variance.csv can have: a run metric, or a host's CPU or zone mean (any zone
    name: zones are found at preflight; one other than the timeline zone has no data)."""
    if metric in RUN_METRICS:
        return True
    host, _, rest = metric.partition(" ")
    zone, _, mean = rest.rpartition(" ")
    return host in question_hosts(config) and (rest == "vLLM CPU median" or (
        mean == "mean" and bool(re.fullmatch(r"\S+", zone))))


def question_words(question: dict) -> str:
    """A question in words, for its errors and its row of questions.csv."""
    margin = (f"{question['margin_pct']:g} %" if "margin_pct" in question
              else f"{question['margin']:g}" if "margin" in question else "?")
    if question["kind"] == "non_inferior":
        return f"{question['metric']} no worse than {margin} ({question.get('better', '?')} is better)"
    if question["kind"] == "equivalent":
        return f"{question['metric']} equivalent within ± {margin}"
    return f"{question['metric']} {question['kind']}" + (f" by at least {question['by']:g}" if question.get("by") else "")


def _question_problems(config: dict, problems: list[str]) -> None:
    config.setdefault("questions", default_questions(config["analysis"]["timeline_zone"]))
    for index, question in enumerate(config["questions"]):
        def key(field=None):
            return (f"config key 'questions.{index}{'.' + field if field else ''}' "
                    f"({_short(question['metric'])} {question['kind']})")
        margins = [name for name in ("margin", "margin_pct") if name in question]
        if not known_metric(config, question["metric"]):
            problems.append(f"{key('metric')}: unknown metric (one of: {', '.join(RUN_METRICS)}, 'HOST ZONE mean', "
                            f"'HOST vLLM CPU median'; HOST one of {', '.join(map(_short, question_hosts(config)))})")
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
        if (question["kind"] == "non_inferior") != ("better" in question):
            problems.append(f"{key('better')}: (lower or higher) is " +
                            ("required" if question["kind"] == "non_inferior" else "for non_inferior only"))
    if config["until"] == "decided":
        if not config["questions"]:
            problems.append("config key 'until': 'decided' needs at least one question under 'questions'")
        if config["max_repeats"] < max(2, config["repeats"]):
            problems.append(f"config key 'max_repeats': {config['max_repeats']} is below 'repeats' "
                            f"({config['repeats']}) or one crossover pair (2)")


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
        """The server stop/start command with {root}, {python} and {env} filled in, quoted.

        ``{env}`` becomes ``NAME=value`` pairs, for settings the server reads from its
        environment (``setting.method: env``)."""
        template = self.settings.get("server", {}).get(which)
        if template is None:
            return None
        pairs = " ".join(f"{name}={shlex.quote(value)}" for name, value in (env or {}).items())
        return template.format(root=shlex.quote(str(self.root)) if self.root else "",
                               python=shlex.quote(sys.executable), env=pairs)

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
        raise ConfigError(f"config key 'safety.abort_at_c': {configured} °C is above the lowest trip point "
                          f"({lowest} °C) minus {TRIP_MARGIN_MIN_C} °C")
    return configured


def cluster_spec(config: dict, name: str, workdir: Path | None = None) -> ClusterSpec:
    workdir = Path(workdir or Path.cwd())
    raw = config["clusters"][name]
    hosts = []
    for host_name, host in raw["hosts"].items():
        root = (workdir / host["root"]).resolve() if "root" in host else None
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
    print(f"{args.config}: valid ({', '.join(config['clusters'])}; order {config['order']}, "
          f"{config['repeats']} repeat(s))")
    return 0
