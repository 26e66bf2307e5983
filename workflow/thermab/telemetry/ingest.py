"""Agent CSVs and per-phase request files -> the tidy contract files (docs/design.md).

Host timestamps are moved onto the controller's clock with the mean of the offsets
measured at preflight and at the end.  Rows without a value (the agent records missing
readings with a reason) are dropped and counted by reason in ``tidy/ingest.json``.  Power
files become watts per domain (energy counters turned into Δenergy/Δt: ``power``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from thermab import jsonl
from thermab.telemetry import power
from thermab.telemetry.agent import SOURCES

# each agent file (its stem is the source's name) and the kind its rows take: from the
# agent's own registry, so a source the agent collects is never dropped here
KIND_OF_FILE = {source.name: source.kind for source in SOURCES}
TELEMETRY_COLUMNS = ["t", "host", "kind", "sensor", "value"]


def host_offsets(preflight: dict, stopped: dict) -> dict[str, float]:
    start = preflight.get("clock_offset_s", {})
    end = stopped.get("clock_offset_end_s", {})
    return {host: (start.get(host, 0.0) + end.get(host, start.get(host, 0.0))) / 2
            for host in set(start) | set(end)}


def read_agent_csv(path: Path, host: str, kind: str, offset: float) -> tuple[pd.DataFrame, dict]:
    """One source file of one host -> tidy rows, and the dropped rows counted by reason
    (a row with the wrong number of fields, as a crash mid-write leaves, is one of them)."""
    bad_lines: list[list[str]] = []
    raw = pd.read_csv(path, dtype=str, keep_default_na=False, engine="python",
                      on_bad_lines=lambda line: bad_lines.append(line))
    t = pd.to_numeric(raw["t"], errors="coerce")
    value = pd.to_numeric(raw["value"], errors="coerce")
    keep = t.notna() & value.notna()
    reasons = raw.loc[~keep, "reason"].fillna("").replace("", "malformed row").value_counts().to_dict()
    if bad_lines:
        reasons["wrong number of fields"] = reasons.get("wrong number of fields", 0) + len(bad_lines)
    tidy = pd.DataFrame({"t": (t[keep] - offset).astype("float64"), "host": host, "kind": kind,
                         "sensor": raw.loc[keep, "sensor"].astype(str), "value": value[keep].astype("float64")})
    return tidy, {f"{host}/{kind}: {reason}": int(n) for reason, n in reasons.items()}


def telemetry(monitor_dir: Path, offsets: dict[str, float]) -> tuple[pd.DataFrame, dict]:
    frames, dropped = [], {}
    for host_dir in sorted(p for p in Path(monitor_dir).iterdir() if p.is_dir()):
        for stem, kind in KIND_OF_FILE.items():
            path = host_dir / f"{stem}.csv"
            if path.exists():
                frame, counts = read_agent_csv(path, host_dir.name, kind, offsets.get(host_dir.name, 0.0))
                if kind == "power":
                    frame, notes = power.power_rows(frame)
                    counts.update(notes)
                frames.append(frame)
                dropped.update(counts)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("t", "value") else "string")
                             for c in TELEMETRY_COLUMNS}), dropped
    tidy = pd.concat(frames, ignore_index=True).sort_values(["t", "host", "kind", "sensor"], kind="stable")
    return tidy.astype({"host": "string", "kind": "string", "sensor": "string"}).reset_index(drop=True), dropped


def requests(phase_files: list[Path]) -> pd.DataFrame:
    frames = [pd.read_parquet(p) for p in phase_files if Path(p).exists()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values(["rep", "t_start"], kind="stable").reset_index(drop=True)


def ingest(run_dir: Path, phase_request_files: list[Path], out_telemetry: Path, out_requests: Path) -> dict:
    run_dir = Path(run_dir)
    preflight = json.loads((run_dir / "preflight.json").read_text())
    stopped_path = run_dir / "monitor" / "stopped.json"
    stopped = json.loads(stopped_path.read_text()) if stopped_path.exists() else {}
    offsets = host_offsets(preflight, stopped)
    tidy, dropped = telemetry(run_dir / "monitor", offsets)
    out_telemetry.parent.mkdir(parents=True, exist_ok=True)
    tidy.to_parquet(out_telemetry, index=False)
    requests(phase_request_files).to_parquet(out_requests, index=False)
    _records, event_problems = jsonl.read_checked(run_dir / "events.jsonl", "t", ("event",))
    report = {"telemetry_rows": len(tidy), "dropped": dropped, "events": event_problems,
              "clock_offsets_s": offsets}
    (out_telemetry.parent / "ingest.json").write_text(json.dumps(report, indent=1))
    return report
