"""``events.jsonl``: one JSON object a line, appended by every stage (DESIGN.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

EVENTS = (
    "run_start", "baseline_start", "baseline_end", "patch_applied", "restart_start",
    "server_ready", "load_start", "probe_start", "probe_end", "load_end", "cooldown_end",
    "abort", "run_end", "restored", "note",
)


def append(run_dir: Path, event: str, t: float | None = None, **fields) -> dict:
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    record = {"t": time.time() if t is None else float(t), "event": event}
    record.update({k: v for k, v in fields.items() if v is not None})
    with open(Path(run_dir) / "events.jsonl", "a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
    return record


def read_checked(path: Path) -> tuple[list[dict], dict[str, int]]:
    """The events of an events.jsonl file and what was wrong with it: lines that are not
    an event (a writer killed mid-line leaves one) are dropped and counted; events out of
    time order (several writers, host clocks) are kept and counted, readers sort by ``t``."""
    records, problems = [], {"malformed_lines": 0, "out_of_order": 0}
    if not Path(path).exists():
        return records, problems
    latest = float("-inf")
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            t = float(record["t"])
            record["event"]
        except (ValueError, KeyError, TypeError):
            problems["malformed_lines"] += 1
            continue
        if t < latest:
            problems["out_of_order"] += 1
        latest = max(latest, t)
        records.append(record)
    return records, problems


def read(run_dir: Path) -> list[dict]:
    return read_checked(Path(run_dir) / "events.jsonl")[0]
