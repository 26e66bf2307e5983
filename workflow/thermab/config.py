"""Load and check the workflow config: JSON-schema validation with defaults, then the
checks a schema cannot express.  Every error names the config key at fault."""

from __future__ import annotations

import copy
import re
import shlex
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

# package data, so a non-editable install validates the same way (workflow/schemas/ links here)
SCHEMA = resources.files("thermab") / "config.schema.yaml"


class ConfigError(ValueError):
    """A config value is wrong; the message names the key."""


def _key(path) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def _fill_defaults(validator_class):
    """A validator that also writes each property's schema default into the instance."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


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
    return f"config key '{_key(path)}': {error.message}"


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))


def validate(raw: dict) -> dict:
    """Return a copy of ``raw`` with defaults filled in, or raise ConfigError."""
    config = copy.deepcopy(raw)
    schema = load_schema()
    validator = _fill_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [_describe(e) for e in errors]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))
    _check_semantics(config)
    return config


def _check_semantics(config: dict) -> None:
    arms = config["arms"]
    unknown = sorted(set(config["order"]) - set(arms))
    if unknown:
        raise ConfigError(
            f"config key 'order': arm(s) {', '.join(unknown)} not defined under 'arms' "
            f"(defined: {', '.join(arms)})")
    if len(set(config["order"])) != len(config["order"]):
        raise ConfigError(f"config key 'order': '{config['order']}' names an arm twice")
    setting = config["setting"]
    needed = ["file", "anchor", "replacement"] if setting["method"] == "file" else ["env_var"]
    for name in needed:
        if name not in setting:
            raise ConfigError(f"config key 'setting.{name}': required when method is {setting['method']}")
    if setting["method"] == "file":
        try:
            re.compile(setting["anchor"])
        except re.error as error:
            raise ConfigError(f"config key 'setting.anchor': not a regular expression: {error}") from None
        if "{value}" not in setting["replacement"]:
            raise ConfigError("config key 'setting.replacement': must contain {value}")
    cap = config["safety"]["max_load_minutes"]
    if cap is not None and config["timings"]["load_s"] > cap * 60:
        raise ConfigError(f"config key 'timings.load_s': {config['timings']['load_s']} s is longer than "
                          f"safety.max_load_minutes ({cap} min)")
    for name, cluster in config["clusters"].items():
        hosts = cluster["hosts"]
        if cluster["head"] not in hosts:
            raise ConfigError(
                f"config key 'clusters.{name}.head': '{cluster['head']}' is not one of its hosts "
                f"({', '.join(hosts)})")
        for host_name, host in hosts.items():
            where = f"clusters.{name}.hosts.{host_name}"
            if host["transport"] == "ssh" and "address" not in host:
                raise ConfigError(f"config key '{where}.address': required for transport ssh")
            if "simulated" in host and "root" not in host:
                raise ConfigError(f"config key '{where}.root': a simulated host needs its node directory")
            if host.get("container_engine", "none") != "none" and "container" not in host:
                raise ConfigError(f"config key '{where}.container': required with container_engine "
                                  f"{host['container_engine']}")


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
            return f"{re.escape(default)}.*--node {re.escape(str(self.root))}(\\s|$)"
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


def load(path: str | Path) -> dict:
    """Read and validate a config file (for use outside Snakemake)."""
    with open(path) as handle:
        return validate(yaml.safe_load(handle) or {})


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="thermab check-config", description="validate a thermab config file")
    parser.add_argument("config", help="a YAML config file")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"{args.config}: valid ({', '.join(config['clusters'])}; order {config['order']}, "
          f"{config['repeats']} repeat(s))")
    return 0
