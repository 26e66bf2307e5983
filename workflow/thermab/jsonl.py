"""JSONL files that other processes append to: the locustfile's records and marks, and
``events.jsonl`` (docs/design.md).  One reader for all of them, so a line still being
written, or cut short by a crash, is handled the same way everywhere."""

from __future__ import annotations

import json
import math
from pathlib import Path

from thermab.config import read_bounded

MAX_JSONL_BYTES = 2**30  # an events.jsonl or records file of a run: a larger one is not thermab's


class JsonlTail:
    """The complete lines so far of a JSONL file another process is appending to. A line
    still being written (or cut short by a crash) waits for its newline; ``poll`` returns
    every row read so far and ``new`` the rows the last poll added."""

    def __init__(self, path):
        self.path = Path(path)
        self.offset = 0
        self.rows: list[dict] = []
        self.new: list[dict] = []

    def poll(self) -> list[dict]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            self.new = []
            return self.rows
        # one read: judging completeness from a second read could pass a half-written line
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.rows.extend(self.new)
        return self.rows


def read_checked(path: Path, time_key: str = "t", required: tuple[str, ...] = ()) -> tuple[list[dict], dict[str, int]]:
    """The records of a JSONL file and what was wrong with it: lines that are not a record
    with a numeric ``time_key`` and the ``required`` keys (a writer killed mid-line leaves
    one) are dropped and counted; records out of time order (several writers, host clocks)
    are kept and counted, readers sort by time."""
    records, problems = [], {"malformed_lines": 0, "out_of_order": 0}
    if not Path(path).exists():
        return records, problems
    latest = float("-inf")
    for line in read_bounded(path, MAX_JSONL_BYTES).decode(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            t = record[time_key]
            # a time is a finite number: text, true, NaN or Infinity (JSON as Python writes it) is no time
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise ValueError(t)
            for key in required:
                record[key]
        except (ValueError, KeyError, TypeError, RecursionError):
            problems["malformed_lines"] += 1
            continue
        if t < latest:
            problems["out_of_order"] += 1
        latest = max(latest, t)
        records.append(record)
    return records, problems
