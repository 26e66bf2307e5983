"""The hosts and clusters of a validated config, every path and command resolved, the
safety settings derived from it (the interlock's temperature, the sensors' allowed silence),
and the config itself as a typed, read-only view (``view``)."""

from __future__ import annotations

import functools
import re
import shlex
import sys
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from thermab.config.addresses import host_root
from thermab.config.problems import ConfigError


def sensor_silence_s(config: Config) -> float:
    """How long a host's watched zones may go without a fresh reading during a load before
    the interlock calls it blind and stops the load."""
    configured = config.safety.max_sensor_silence_s
    return configured if configured is not None else max(5.0, 3 * config.monitor.intervals.thermal)


@dataclass(frozen=True)
class HostSpec:
    """One host of a cluster, with every path and command resolved."""

    name: str
    cluster: str
    transport: str
    settings: Mapping[str, Any] = field(repr=False)  # the config's host (a Host section), or a dict
    root: Path | None = None
    simulated: str | None = None

    @property
    def container(self) -> str | None:
        container: str | None = self.settings.get("container")
        return container

    @property
    def container_engine(self) -> str:
        engine: str = self.settings.get("container_engine", "none")
        return engine

    def command(self, which: str, env: dict[str, str] | None = None) -> str | None:
        """The server stop/start command with {root}, {controller_python} (or its old name
        {python}) and {env} filled in, quoted.

        ``{env}`` becomes ``NAME=value`` pairs, for settings the server reads from its
        environment (``setting.method: env``)."""
        template: str | None = self.settings.get("server", {}).get(which)
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
            pattern: str = self.settings["process_pattern"]
            return pattern
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


def abort_threshold(config: Config, trip_points_c: list[float]) -> float | None:
    """The interlock temperature for hosts with these trip points, or None (no zones and
    nothing configured); a setting too close to the trip point is refused."""
    configured = config.safety.abort_at_c
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


def cluster_spec(config: Config, name: str, workdir: Path | None = None) -> ClusterSpec:
    workdir = Path(workdir or Path.cwd())
    cluster = config.clusters[name]
    hosts = []
    for host_name, host in cluster.hosts.items():
        root = host_root(workdir, host.root) if "root" in host else None
        hosts.append(HostSpec(host_name, name, host.transport, host, root, host.get("simulated")))
    return ClusterSpec(name, cluster.head, cluster.endpoint.rstrip("/"), cluster.end_state, tuple(hosts))


class Section(Mapping[str, Any]):
    """A part of a validated config, read-only: a mapping whose keys are also attributes,
    typed by its class's annotations (one per schema key).  Its mappings are sections and
    its lists tuples, so nothing reached through it changes; ``thaw`` gives the dict back.
    A key the config leaves out (``tune``, ``setting.file`` with method env) is an
    AttributeError naming it, as it is a KeyError in the dict: ``in`` and ``get`` ask first."""

    if typing.TYPE_CHECKING:  # the view's own state, no annotation of a key (``_parts`` reads those)
        _where: str
        _values: MappingProxyType[str, Any]

    def __init__(self, values: Mapping[str, Any], where: str = "", each: type[Section] | None = None) -> None:
        parts = _parts(type(self))
        frozen: dict[str, object] = {}
        for name, value in values.items():
            section, by_name = (each, False) if each else parts.get(name, (Section, False))
            path = f"{where}{name}"
            frozen[name] = Section(value, path + ".", section) if by_name else _frozen(value, section, path)
        object.__setattr__(self, "_where", where)
        object.__setattr__(self, "_values", MappingProxyType(frozen))

    if not typing.TYPE_CHECKING:  # hidden from the type checker, so a key no annotation names is an error there

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):  # no config key: copy and pickle look for these
                raise AttributeError(name)
            try:
                return self._values[name]
            except KeyError:
                raise AttributeError(
                    f"config key '{self._where}{name}': not in the config", name=name, obj=self
                ) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"config key '{self._where}{name}': the config is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"config key '{self._where}{name}': the config is read-only")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._values)!r})"

    def __copy__(self) -> Section:
        return self  # nothing in it changes, so a copy may be itself

    def __deepcopy__(self, memo: dict[int, object]) -> Section:
        return self


@functools.cache
def _parts(cls: type[Section]) -> dict[str, tuple[type[Section], bool]]:
    """The keys of ``cls`` whose values are sections: the section's class, and whether the
    value is a mapping of them by name (``arms``, ``clusters``, ``hosts``); a tuple of them
    (``questions``) or one (``timings``) is neither."""
    parts = {}
    for name, hint in typing.get_type_hints(cls).items():
        found = [arg for arg in (hint, *typing.get_args(hint)) if isinstance(arg, type) and issubclass(arg, Section)]
        if found:
            parts[name] = (found[0], typing.get_origin(hint) is Mapping)
    return parts


def _frozen(value: object, section: type[Section], where: str) -> object:
    if isinstance(value, Mapping):
        return section(value, where + ".")
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item, section, f"{where}.{index}") for index, item in enumerate(value))
    return value


def thaw(value: object) -> Any:
    """A view's value as the validated config holds it: sections as dicts, tuples as lists
    (a config to write out, or to change into another)."""
    if isinstance(value, Section):
        return {name: thaw(item) for name, item in value.items()}
    if isinstance(value, tuple):
        return [thaw(item) for item in value]
    return value


class Arm(Section):
    label: str
    value: str


class Setting(Section):
    name: str
    method: str
    file: str
    anchor: str
    replacement: str
    value_type: str
    env_var: str


class Timings(Section):
    baseline_s: float
    load_s: int
    cooldown_below_c: float
    cooldown_max_s: float
    startup_timeout_s: float
    time_scale: float
    idle_s: float
    min_load_s: int


class Load(Section):
    users: int | tuple[int | Mapping[str, float], ...]  # a level: users, or a mapping of its own shape
    max_tokens: int
    prompt_tokens: int
    model: str | None
    extra_body: Mapping[str, Any]
    probe: bool
    max_failed: int
    probe_at: float
    probe_n: int
    probe_tokens: int
    rate: float | None
    burstiness: float
    think_s: float | None
    shape_seed: int
    wakeup_gaps_s: tuple[float, ...] | None
    wakeup_n: int
    slo: Mapping[str, float] | None  # goodput's bounds in ms (ttft_ms, tpot_ms, e2el_ms)


class Intervals(Section):
    thermal: float
    cpu: float
    freq: float
    system: float
    hwmon: float
    gpu: float
    rapl: float
    hwmon_power: float
    gpu_power: float
    ipmi: float
    server: float


class Monitor(Section):
    process_pattern: str
    intervals: Intervals


class Safety(Section):
    abort_at_c: float | None
    max_load_minutes: float | None
    max_sensor_silence_s: float | None


class Question(Section):
    metric: str
    kind: str
    better: str
    by: float
    margin: float
    margin_pct: float
    users: tuple[int, ...]
    levels: tuple[str | int, ...]


class Tune(Section):
    min: float
    max: float
    scale: str
    budget_phases: int
    objective: str
    better: str
    constraints: tuple[Question, ...]
    sampler: str
    startup_trials: int
    seed: int
    digits: int


class Analysis(Section):
    thresholds_c: tuple[float, ...]
    reference_lines_c: tuple[float, ...]
    stall_gap_s: float
    timeline_zone: str
    start_balance_c: float
    acceptance_margin_pct: float
    covariates: tuple[str, ...]


class Server(Section):
    stop: str
    start: str


class Host(Section):
    transport: str
    address: str
    port: int
    user: str
    key_file: str
    known_hosts: str
    host_key_policy: str
    jump: str
    connect_timeout_s: float
    root: str
    simulated: str
    lost_wakeup: bool
    restart_variance: bool
    container: str
    container_engine: str
    process_pattern: str
    python: str
    agent_python: str
    agent_dir: str
    server: Server
    wall_meters: tuple[Mapping[str, Any], ...]  # each a meter's keys, by its kind (telemetry/wall_meters.py)


class Cluster(Section):
    head: str
    endpoint: str
    end_state: str
    hosts: Mapping[str, Host]


class Config(Section):
    """The whole validated config (``view``); each section's keys are the schema's."""

    order: str
    repeats: int
    phase_retries: int
    setting: Setting
    arms: Mapping[str, Arm]
    timings: Timings
    load: Load
    monitor: Monitor
    safety: Safety
    until: str
    max_repeats: int
    budget_hours: float | None
    questions: tuple[Question, ...]
    tune: Tune
    analysis: Analysis
    clusters: Mapping[str, Cluster]


def view(config: dict[str, Any]) -> Config:
    """The validated ``config`` as a typed, read-only view (``cfg.timings.load_s``), built
    once where a stage is handed the dict; it copies, so the dict may change after."""
    return Config(config)
