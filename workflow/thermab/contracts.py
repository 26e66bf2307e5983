"""The files the stages hand each other, one typed definition each (docs/design.md,
"Contracts"): ``preflight.json`` (preflight writes it; the interlock, the phase's clock check
and ingest read it), ``validity.json`` (the load writes it; the phase and the analysis read
it), ``phase.json`` (the phase and the baseline write it) and the columns of ``requests.parquet`` (the load
writes them; ingest joins them, the analysis checks them), and what analyze hands the report
rules in ``analysis/`` (the frames' columns, ``analysis.json``).

The lowest room, as the files cross rooms: a reader and the writer can never disagree on a
key. The keys are the files' own, so the run directories of earlier versions still read
(an older file lacks a key: its default below stands in)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeGuard

from thermab import atomic
from thermab.config import key_problem, read_bounded
from thermab.errors import UserError

MAX_RECORD_BYTES = 2**20  # a phase.json is a few kB: more is no record of a phase

# --- requests.parquet ------------------------------------------------------------------

REQUEST_COLUMNS = {  # docs/design.md's tidy/requests.parquet, then the stream diagnostics
    "order": "string",
    "rep": "int64",
    "arm": "string",
    "users": "Int64",  # the loop's users, or the open loop's cap
    "load_level": "string",  # the level's label (load_levels.Level.label): a run of levels may mix shapes
    "kind": "string",
    "user": "int64",
    "tag": "string",
    "t_start": "float64",
    "t_first_token": "float64",
    "t_end": "float64",
    "prompt_tokens": "Int64",
    "completion_tokens": "Int64",
    "cached_tokens": "Int64",
    "ok": "bool",
    "error": "string",
    "max_gap_s": "float64",
    "stall_gaps": "int64",
    "usage_source": "string",
    "token_arrivals": "Int64",
    "token_chunks": "Int64",  # the events that carried text: one an engine step (null in records without it)
    "token_span_s": "float64",
    "first_step_s": "float64",  # the first decode step: second token chunk − first
    # a shape's timing (load/shapes.py): when the request was due, the think time drawn
    # before it, the time it waited for a slot of the cap; NaN in a closed loop; and a
    # wake-up probe's idle gap before it (kind "wakeup", docs/design.md "Wake-up probes")
    "t_due": "float64",
    "think_s": "float64",
    "slot_wait_s": "float64",
    "gap_s": "float64",
}
# what an analysis cannot do without (a file another tool wrote may lack the rest)
REQUIRED_REQUEST_COLUMNS = ("order", "rep", "arm", "kind", "t_start", "t_end", "ok", "completion_tokens")


# --- validity.json ---------------------------------------------------------------------


class Window(TypedDict):
    start: float | None
    end: float | None
    s: float | None


class RequestCounts(TypedDict):
    load: int
    load_ok: int
    probe: int
    probe_ok: int
    started_after_end: int
    ended_after_end: int


class Errors(TypedDict):
    n: int
    by_category: dict[str, int]
    first: str | None
    last_ok_end_s: float | None


class FullLength(TypedDict):
    max_tokens: int
    share_of_ok_load: float | None


class Cached(TypedDict):
    load_with_cached_tokens: int
    load_reporting_cached_tokens: int


class Concurrency(TypedDict):
    users: int
    inflight_mean: float | None
    share_of_window_at_users: float | None


class Gaps(TypedDict):
    stall_gap_s: float
    max_gap_s: float | None
    stall_gaps: int
    requests_with_stalls: int


class PromptTokens(TypedDict):
    target: int
    n: int
    median: float | None
    min: float | None
    max: float | None
    median_over_target: float | None


class Throughput(TypedDict):
    requests_completed: int
    output_tokens: int
    output_tok_s: float | None


class Probe(TypedDict):
    n: int
    ok: int
    measurable: int
    token_arrivals: list[int]
    decode_tok_s_median: float | None


class Validity(TypedDict):
    """The facts of a load window with their n (``load.validity.validity_report``), and
    ``warnings`` in words: what the analysis derives for a run another tool wrote, too."""

    window: Window
    requests: RequestCounts
    errors: Errors
    full_length: FullLength
    cached: Cached
    concurrency: Concurrency
    gaps: Gaps
    prompt_tokens: PromptTokens
    usage_source: dict[str, int]
    throughput: Throughput
    probe: Probe
    warnings: list[str]
    shape: dict[str, Any]  # load.shapes.shape_report; a report written without it was a closed loop
    wakeup: dict[str, Any]  # the wake-up probes after the load: n and ok (after a gap), gaps_s, first_error


class _PhaseValidity(Validity):
    order: str
    rep: int
    arm: str
    url: str
    users: int  # the loop's users, or the open loop's cap
    load_level: str  # the level's label (load_levels.Level.label)
    duration_s: float
    locust_exit_code: int
    events: list[dict[str, Any]]  # the load's marks


class PhaseValidity(_PhaseValidity, total=False):
    """``phases/*/validity.json``: a phase's ``Validity`` with the phase and the load run."""

    aborted: str  # only where the interlock stopped the load: why


def write_validity(path: Path, report: PhaseValidity) -> None:
    atomic.write_text(path, json.dumps(report, indent=2) + "\n")


# a load window's (order, rep, arm, users, load_level): users and load_level None where a report predates levels
WindowKey = tuple[str, int, str, int | None, str | None]


def validity_key(report: dict[str, Any], path: Path) -> WindowKey:
    """The window a read ``validity.json`` belongs to, (order, rep, arm, users, load_level);
    users None where the report has none (written before levels), load_level None where it
    has none (written before levels of mixed shapes).  A report without the first three is a
    UserError naming the file."""
    order, rep, arm, users, level = (report.get(key) for key in ("order", "rep", "arm", "users", "load_level"))
    if not (isinstance(order, str) and isinstance(arm, str) and _whole(rep)):
        raise UserError(f"{path}: keys 'order' and 'arm' (text) and 'rep' (a whole number) are required")
    if not (users is None or _whole(users)):
        raise UserError(f"{path}: key 'users' must be a whole number")
    if not (level is None or isinstance(level, str)):
        raise UserError(f"{path}: key 'load_level' must be text")
    return order, rep, arm, users, level


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# --- preflight.json --------------------------------------------------------------------


class ZoneFacts(TypedDict):
    name: str
    trip_point_c: float | None


class MeterRecord(TypedDict):
    """A wall meter as a host's facts keep it (telemetry/wall_meters.py): no credential, only where it is."""

    host: str
    domain: str  # its power rows' sensor: wall-N
    kind: str
    where: str
    feeds: list[str]  # the hosts whose power it reads
    interval_s: float
    update_s: float | None
    simulated: bool


@dataclass
class Safety:
    abort_at_c: float | None = None  # the interlock's threshold; None: off
    lowest_trip_point_c: float | None = None
    lowest_trip_point: str | None = None  # in words: host, zone and trip point


@dataclass
class Preflight:
    """``preflight.json``: each host's facts (``hosts``: name → reachability, file and its
    sha256, anchor count, zones, agent Python, …), the interlock's settings and the clock
    offsets measured at the start (host → seconds the host's clock is ahead)."""

    cluster: str | None = None
    order: str | None = None
    t: float | None = None  # when, on the controller's clock (None in files written before it)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    restored_leftovers: list[str] = field(default_factory=list)
    endpoint: dict[str, Any] = field(default_factory=dict)  # url, and the model it served then
    clock_offset_s: dict[str, float] = field(default_factory=dict)
    clock_offset_uncertainty_s: dict[str, float] = field(default_factory=dict)
    safety: Safety = field(default_factory=Safety)

    def zones(self, host: str) -> list[ZoneFacts]:
        """The zones found on ``host`` ([] where none, or the host is not in the file)."""
        return self.hosts.get(host, {}).get("zones") or []

    @property
    def watched(self) -> set[str]:
        """The hosts with zones: the interlock watches them, a phase expects their readings."""
        return {name for name in self.hosts if self.zones(name)}

    def to_json(self, **extra: object) -> str:
        """The file's text; ``extra`` adds keys (the failed record's ``problems``)."""
        return json.dumps({**dataclasses.asdict(self), **extra}, indent=1)

    def write(self, path: Path, **extra: object) -> None:
        atomic.write_text(path, self.to_json(**extra))

    @classmethod
    def read(cls, path: Path) -> Preflight:
        raw = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in raw.items() if key in known}
        values["safety"] = Safety(
            **{
                key: value
                for key, value in raw.get("safety", {}).items()
                if key in {f.name for f in dataclasses.fields(Safety)}
            }
        )
        return cls(**values)


# --- phase.json ------------------------------------------------------------------------


@dataclass
class BaselineRecord:
    """``phases/baseline/phase.json``: the idle window before the first phase."""

    t_start: float
    t_end: float
    phase: str = "baseline"

    def write(self, path: Path) -> None:
        atomic.write_text(
            path, json.dumps({"phase": self.phase, "t_start": self.t_start, "t_end": self.t_end}, indent=1)
        )


@dataclass
class PhaseRecord:
    """``phases/*/phase.json``: one load window as the phase ran it.  ``sequential`` counts a
    repeat done by the file's presence; its ``idle_w_before`` is the head's power before the
    job's one restart (analysis/washout.py reads the same from the restart mark); ``load_s``
    the window it was asked for (``timings.load_s``, or the shorter one of
    analysis/phase_length.py; None in a file written before the key, whose
    ``validity.duration_s`` holds it)."""

    phase: str
    order: str
    rep: int
    arm: str
    users: int
    load_level: str | None  # the level's label (None in files written before it)
    label: str
    value: Any  # the setting's value in this arm
    model: str
    load_start: float | None
    load_end: float | None
    validity: PhaseValidity
    cooldown: dict[str, Any]  # reason, seconds
    start_zones_c: dict[str, Any]  # host → zone → °C as the load began
    idle_w_before: float | None
    load_s: int | None = None

    def write(self, path: Path) -> None:
        atomic.write_text(path, json.dumps(dataclasses.asdict(self), indent=1, default=str))

    @property
    def window_asked_s(self) -> int | None:
        """The load window the phase was asked for, from a file of any age; None where the
        file holds none (``read`` has refused one no config could ask for)."""
        length = self._window()[1]
        return math.ceil(length) if length is not None and math.isfinite(length) and length > 0 else None

    def _window(self) -> tuple[str, float | None]:
        """(the key that holds the window, its number or None)."""
        validity = self.validity if isinstance(self.validity, dict) else {}
        key, length = (
            ("load_s", self.load_s) if self.load_s is not None else ("validity.duration_s", validity.get("duration_s"))
        )
        number = isinstance(length, (int, float)) and not isinstance(length, bool)
        return key, float(length) if number else None

    @classmethod
    def read(cls, path: Path) -> PhaseRecord:
        """The record, or a UserError naming the file (and the key) where it is none: read
        bounded, and its window one ``timings.load_s`` could have asked for."""
        raw = json.loads(read_bounded(path, MAX_RECORD_BYTES))
        if not isinstance(raw, dict):
            raise UserError(f"{path}: not a JSON object")
        values: dict[str, Any] = {f.name: raw.get(f.name) for f in dataclasses.fields(cls)}
        record = cls(**values)
        key, length = record._window()
        if length is not None:
            problem = key_problem(("timings", "load_s"), math.ceil(length)) if math.isfinite(length) else "not finite"
            if problem:
                raise UserError(f"{path}: {key} {length:g} is no window the config can ask for: {problem}")
        return record


# --- look.json ------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """``looks/{repeats}/look.json``: what the look of ``until: decided`` at ``repeats``
    decided (the checkpoint ``look`` writes it; the workflow's input functions read it).
    ``next_repeats`` the look the study goes on to, None where it stops here (every
    question decided, ``max_repeats`` reached, or the next look beyond ``budget_hours``);
    ``load_s`` the next block's load window (analysis/phase_length.py); ``why`` in words;
    ``settings`` what it was decided with (the look's params: the analysis settings,
    ``max_repeats``, ``budget_hours``, the configfiles), which a look that went on keeps."""

    repeats: int
    next_repeats: int | None
    load_s: int | None
    why: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def goes_on(self) -> bool:
        return self.next_repeats is not None

    def write(self, path: Path) -> None:
        atomic.write_text(path, json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> Decision:
        """The decision, or a UserError naming the file where it is none: a study must never
        go on to, or stop at, a look it did not decide."""
        try:
            raw = json.loads(read_bounded(path, MAX_RECORD_BYTES))
            decision = cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name != "settings"})
            decision = dataclasses.replace(decision, settings=raw.get("settings", {}))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError) as error:
            raise UserError(f"{path}: not a look's decision: {' '.join(str(error).split())[:160]}") from None

        def counted(value: object) -> bool:
            return _whole(value) and value > 0

        later = decision.next_repeats is None or (
            counted(decision.next_repeats) and decision.next_repeats > decision.repeats
        )
        if not (
            counted(decision.repeats)
            and later
            and (decision.load_s is None or counted(decision.load_s))
            and isinstance(decision.why, str)
            and isinstance(decision.settings, dict)
        ):
            raise UserError(f"{path}: not a look's decision: repeats, next_repeats or load_s is no count in order")
        return decision


# --- analysis/: the numbers analyze hands the report rules -----------------------------
# Beside tables/*.csv, the frames the words and figures are made from; the report rules read
# them and never analyse again. Each frame has these columns first; a run of levels adds
# ``users`` and ``load_level`` to every row.

POOLED_COLUMNS = ("order", "rep", "arm", "metric", "unit", "value", "load_valid")  # one phase's metric
WINDOW_COLUMNS = ("order", "rep", "arm", "load_start", "load_end", "window_s", "load_valid")
ACCEPTANCE_COLUMNS = ["arm", "reference", "state", "low_pct", "high_pct", "margin_pct", "n"]
# per host and source: the samples expected in the load windows, got, and the largest gap
COMPLETENESS_COLUMNS = ["host", "source", "interval_s", "expected", "got", "largest_gap_s"]
PLAN_COLUMNS = [  # per open question and arm: what would decide it (analysis/planning.py)
    "question",
    "metric",
    "arm",
    "kind",
    "verdict",
    "phases_per_arm",
    "estimate",
    "between_sd",
    "within_sd",
    "restart_sd",
    "planned_sd",
    "sd_from",
    "distance",
    "phases_needed",
    "repeats_needed",
    "hours_needed",
    "budget_repeats",
    "budget_distance",
    "smallest_margin",
    "smallest_margin_pct",
    "reach",
    "unit",
]


@dataclass(frozen=True)
class AnalysisRecord:
    """``analysis/analysis.json``: the run directories pooled (``sources``), a sweep's best
    setting (``stats.best_setting``, None for two arms or a run of levels) and the measured
    timings the open questions' plan rests on (``planning.Timings`` as a mapping, None
    where no phase job was timed or no plan was made), and how often each source of the head
    was sampled (``sample_intervals_s``: source → median spacing in s)."""

    sources: list[str]
    best: dict[str, Any] | None
    timings: dict[str, Any] | None
    sample_intervals_s: dict[str, float]

    def write(self, path: Path) -> None:
        atomic.write_text(path, json.dumps(dataclasses.asdict(self), indent=1, default=_plain))

    @classmethod
    def read(cls, path: Path) -> AnalysisRecord:
        try:
            raw = json.loads(read_bounded(path, MAX_RECORD_BYTES))
            return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls)})
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError) as error:
            raise UserError(f"{path}: not an analysis record: {' '.join(str(error).split())[:160]}") from None


def _plain(value: object) -> object:
    """numpy's scalars as the Python numbers they hold (a best setting's means)."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON")
