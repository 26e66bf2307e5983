"""A run directory as the analysis reads it (docs/design.md's contracts): the plan
(``run.json``), the events, the tidy telemetry and requests, each phase's load validity
(``phases/*/validity.json``); and ``Analysis``, everything the tables, summary and figures
of a run show."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from thermab.experiment import events as events_file
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
    events["rep"] = pd.to_numeric(events["rep"])  # float: run-level events have no rep
    return events.sort_values("t", kind="stable", ignore_index=True)


def load_run(run_dir) -> RunData:
    path = Path(run_dir)
    config = json.loads((path / "run.json").read_text(encoding="utf-8"))
    telemetry = pd.read_parquet(path / "tidy" / "telemetry.parquet", columns=TELEMETRY_COLUMNS)
    requests_path = path / "tidy" / "requests.parquet"
    requests = pd.read_parquet(requests_path) if requests_path.exists() else None
    if requests is not None and requests.empty:
        requests = None
    return RunData(path, config, read_events(path / "events.jsonl"), telemetry, requests, read_validity(path))


def read_validity(path: Path) -> dict:
    """Each phase's validity.json by (order, rep, arm). The load stage writes it even for a
    load that was aborted; tidy/requests.parquet waits for every phase, so when the
    analysis runs they are all there."""
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(path.glob("phases/*/validity.json"))]
    return {(r["order"], int(r["rep"]), r["arm"]): r for r in reports}


def sibling_runs(run_dir) -> list[Path]:
    """Other run directories next to ``run_dir`` with the same cluster in their run.json."""
    path = Path(run_dir).resolve()
    cluster = json.loads((path / "run.json").read_text(encoding="utf-8")).get("cluster")
    return [other for other in sorted(path.parent.iterdir())
            if other != path and (other / "run.json").exists()
            and json.loads((other / "run.json").read_text(encoding="utf-8")).get("cluster") == cluster]


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
