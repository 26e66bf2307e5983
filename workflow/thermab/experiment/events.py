"""``events.jsonl``: one JSON object a line, appended by every stage (docs/design.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from thermab import jsonl
from thermab.layout import RunDir

EVENTS = (
    "run_start",
    "baseline_start",
    "baseline_end",
    "patch_applied",
    "restart_start",
    "server_ready",
    "idle_start",
    "idle_end",
    "load_start",
    "probe_start",
    "probe_end",
    "load_end",
    "cooldown_end",
    "abort",
    "run_end",
    "restored",
    "note",
)


def append(run_dir: Path, event: str, t: float | None = None, **fields) -> dict:
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    record = {"t": time.time() if t is None else float(t), "event": event}
    record.update({k: v for k, v in fields.items() if v is not None})
    with open(RunDir(run_dir).events, "a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
    return record


def read_checked(path: Path) -> tuple[list[dict], dict[str, int]]:
    """The events of an events.jsonl file and what was wrong with it (see
    :func:`thermab.jsonl.read_checked`)."""
    return jsonl.read_checked(path, "t", ("event",))


def read(run_dir: Path) -> list[dict]:
    return read_checked(RunDir(run_dir).events)[0]
