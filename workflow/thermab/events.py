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


def read(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
