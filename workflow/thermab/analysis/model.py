"""A run directory as the analysis reads it (docs/design.md's contracts): the plan
(``run.json``), the events, the tidy telemetry and requests, each phase's load validity
(``phases/*/validity.json``); and ``Analysis``, everything the tables, summary and figures
of a run show."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from thermab.config import UserError
from thermab.experiment import events as events_file
from thermab.experiment import plan
from thermab.telemetry.ingest import TELEMETRY_COLUMNS

@dataclass(frozen=True)
class RunData:
    path: Path
    config: dict
    events: pd.DataFrame
    telemetry: pd.DataFrame
    requests: pd.DataFrame | None  # None when the run has no request data (imported runs)
    validity: dict  # (order, rep, arm) → the phase's validity.json; empty for imported runs


def read_events(path: Path) -> pd.DataFrame:
    """events.jsonl as a frame in time order (malformed lines dropped and counted at ingest)."""
    records, _problems = events_file.read_checked(path)
    events = pd.DataFrame(records, columns=sorted({"t", "event", "order", "rep", "arm"}.union(*records)))
    events["rep"] = pd.to_numeric(events["rep"], errors="coerce")  # float: run-level events have no rep
    return events.sort_values("t", kind="stable", ignore_index=True)


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror}") from None
    except ValueError as error:
        raise UserError(f"{path}: not JSON: {error}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: not a JSON object")
    return value


def _read_parquet(path: Path, **options) -> pd.DataFrame:
    try:
        return pd.read_parquet(path, **options)
    except (OSError, ValueError, KeyError, pa.ArrowException) as error:
        raise UserError(f"{path}: cannot read as parquet: {' '.join(str(error).split())[:200]}") from None


def inferred_plan(path: Path, events: pd.DataFrame, telemetry: pd.DataFrame) -> dict:
    """The plan of a run directory that has no run.json, as docs/design.md allows: the
    arms are the letters of its phases in events.jsonl (each its own label, the first the
    reference), the hosts those of its telemetry (the head the first by name), the
    analysis settings the defaults."""
    phases = events.dropna(subset=["arm"])
    letters = list(dict.fromkeys(str(arm) for arm in phases["arm"]))
    if not letters:
        raise UserError(f"{path}: no run.json, and events.jsonl names no phase: nothing to analyse")
    hosts = sorted(str(host) for host in telemetry["host"].unique())
    orders = [str(order) for order in phases["order"].dropna().unique()]
    return plan.run_plan(cluster=path.resolve().parent.name, order=orders[0] if orders else "".join(letters),
                         repeats=int(phases["rep"].max()) if phases["rep"].notna().any() else 1,
                         arms={letter: {"label": letter, "value": ""} for letter in letters},
                         setting="setting", head=hosts[0] if hosts else "", hosts=hosts, inferred=True)


def _check_plan(path: Path, config: dict) -> dict:
    """What the analysis needs of a run.json, with the defaults for what an older one lacks."""
    arms = config.get("arms")
    if not isinstance(arms, dict) or not arms or not all(isinstance(a, dict) and "label" in a for a in arms.values()):
        raise UserError(f"{path}: key 'arms' must map each arm letter to its label and value")
    if config.get("reference_arm", next(iter(arms))) not in arms:
        raise UserError(f"{path}: key 'reference_arm' is not one of the arms")
    for key, kind in (("head", str), ("hosts", list), ("thresholds_c", list), ("timeline_zone", str)):
        if key in config and not isinstance(config[key], kind):
            raise UserError(f"{path}: key '{key}' must be a {kind.__name__}")
    return plan.run_plan(**{"cluster": "", "order": "".join(arms), "repeats": 1, "setting": "setting", "head": "",
                            "hosts": [], **{key: value for key, value in config.items()
                                            if key not in plan.DEFAULT_ANALYSIS}},
                         analysis={key: config[key] for key in plan.DEFAULT_ANALYSIS if key in config})


def load_run(run_dir) -> RunData:
    """A run directory as the analysis reads it; what is wrong with it is a UserError
    naming the file.  Without run.json the plan is inferred (``inferred_plan``)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"{path}: not a run directory")
    telemetry_path = path / "tidy" / "telemetry.parquet"
    if not telemetry_path.exists():
        raise UserError(f"{telemetry_path}: missing (not a run directory, or ingest has not run)")
    telemetry = _read_parquet(telemetry_path, columns=TELEMETRY_COLUMNS)
    requests_path = path / "tidy" / "requests.parquet"
    requests = _read_parquet(requests_path) if requests_path.exists() else None
    if requests is not None and requests.empty:
        requests = None
    events = read_events(path / "events.jsonl")
    run_json = path / plan.RUN_FILE
    config = (_check_plan(run_json, _read_json(run_json)) if run_json.exists()
              else inferred_plan(path, events, telemetry))
    return RunData(path, config, events, telemetry, requests, read_validity(path))


def read_validity(path: Path) -> dict:
    """Each phase's validity.json by (order, rep, arm). The load stage writes it even for a
    load that was aborted; tidy/requests.parquet waits for every phase, so when the
    analysis runs they are all there."""
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(path.glob("phases/*/validity.json"))]
    return {(r["order"], int(r["rep"]), r["arm"]): r for r in reports}


def sibling_runs(run_dir) -> list[Path]:
    """Other run directories next to ``run_dir`` with the same cluster in their run.json."""
    path = Path(run_dir).resolve()
    cluster = _read_json(path / plan.RUN_FILE).get("cluster") if (path / plan.RUN_FILE).exists() else path.parent.name
    return [other for other in sorted(path.parent.iterdir())
            if other != path and (other / plan.RUN_FILE).exists()
            and _read_json(other / plan.RUN_FILE).get("cluster") == cluster]


def ordered_hosts(config: dict) -> list[str]:
    """Hosts with the head first, so that its metrics lead every table."""
    return [config["head"]] + [h for h in config.get("hosts", []) if h != config["head"]]


@dataclass(frozen=True)
class Analysis:
    run: RunData  # the run the tables describe
    sources: list[str]  # every run directory pooled for the comparison
    tables: dict[str, pd.DataFrame]  # windows, the four phase tables, variance
    pooled: pd.DataFrame  # per-phase metrics of all pooled runs (metrics.phase_metrics)
    best: dict | None  # stats.best_setting for sweeps of more than two arms
