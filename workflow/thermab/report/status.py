"""Where a run stands, read from its files alone, so it answers from another terminal while
the run goes on, and after it.

    python -m thermab status [RUN_DIR]

RUN_DIR defaults to the run under results/ whose events.jsonl changed last. It prints
whether the run is going (its status.json is rewritten every few seconds of a load), the
phase of how many with the time left for the phase, the look and the run, the latest
thermal readings per host, the phases done, the answers to its questions so far (as the
last analysis wrote them) and where its summary is. It changes nothing and exits 0; a
directory no run has begun in is one line and exit status 2.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd

from thermab import cli, layout
from thermab.analysis.model import read_events, read_plan
from thermab.analysis.questions import UNDECIDED
from thermab.analysis.sequential import read_answers
from thermab.config import read_bounded
from thermab.errors import UserError
from thermab.experiment import events, progress
from thermab.report import plan_words, verdict

STALE_S = 60  # a status.json older than this: no load is running now
ENDS = ("run_end", "abort", "restored")  # the events after which nothing more runs


def newest_run(results: Path) -> Path | None:
    """The run directory under ``results`` (results/{cluster}/{order}) whose events.jsonl
    changed last."""
    found = sorted(results.glob("*/*/events.jsonl"), key=lambda path: path.stat().st_mtime)
    return found[-1].parent if found else None


ANSWER_COLUMNS = ("question", "arm", "reference", "kind", "margin", "verdict", "estimate", "ci_low", "ci_high")


def answers_path(run_dir: Path) -> Path:
    """The questions.csv of the run's last analysis: its own, or while ``until: decided``
    goes on, its latest look's (``layout.RunDir.look``)."""
    files = layout.RunDir(run_dir)
    looks = files.path.glob(str(files.look("*").table("questions").relative_to(files.path)))
    written = [path for path in (files.table("questions"), *looks) if path.is_file()]
    return max(written, key=lambda path: path.stat().st_mtime) if written else files.table("questions")


def read_run_answers(run_dir: Path) -> pd.DataFrame | None:
    """The questions.csv of the run's last analysis (``answers_path``; ``sequential.read_answers``,
    with the columns status shows, ``phases_needed`` a number where it can be read), None
    where the run has not been analysed yet."""
    path = answers_path(run_dir)
    if not path.is_file():
        return None
    answers = read_answers(path, ANSWER_COLUMNS)
    numbers = ["margin", "estimate", "ci_low", "ci_high", "phases_needed"]
    # a column the table lacks (one written before phases_needed) reads as unknown
    return answers.assign(
        **{c: pd.to_numeric(answers[c], errors="coerce") if c in answers else math.nan for c in numbers}
    )


def answer_lines(answers: pd.DataFrame | None, command: str = "") -> list[str]:
    """One verdict line per question (``verdict``), an undecided one followed by ``command``."""
    return [] if answers is None else verdict.verdict_lines(answers, command)


def decide_command(run_dir: Path, answers: pd.DataFrame | None) -> str:
    """Where questions are open: the command that would decide them and its cluster-hours at
    the run's measured phase jobs (``plan_words.decide_call``, as evidence.md gives them); ""
    where none is open or the run has no run.json."""
    files = layout.RunDir(run_dir)
    if answers is None or not files.run_json.is_file() or not (answers["verdict"] == UNDECIDED).any():
        return ""
    plan = read_plan(files.run_json)
    history = read_events(files.events) if files.events.is_file() else None
    return plan_words.decide_call(answers, plan, history)


def closing_lines(run_dir: Path) -> list[str]:
    """The end of a run: its answers, the command that decides what is open, and the paths
    of what to read."""
    files = layout.RunDir(run_dir)
    answers = read_run_answers(run_dir)
    found = answer_lines(answers, decide_command(run_dir, answers))
    lines = [f"{run_dir}: the answers" if found else f"{run_dir}: no questions answered"]
    lines += [f"  {answer}" for answer in found]
    evidence = files.path / "evidence.md"
    for name, path in (("summary", files.summary), ("evidence", evidence), ("report", files.report)):
        if path.is_file():
            lines.append(f"  {name}: {path}")
    return lines


MAX_STATUS_BYTES = 2**20  # status.json holds a phase's position and a reading per zone: a few kB
STATUS_KEYS = {  # status.json's keys (progress.write_status) and what each must hold
    "phase": str,
    "k": int,
    "n": int,
    "t": float,
    "elapsed_s": float,
    "phase_left_s": float,
    "look_left_s": float,
    "run_left_s": float,
    "run_bounded": bool,
    "readings": dict,
}


def _kind_problem(value: object, kind: type) -> str | None:
    """Why ``value`` is not of ``kind`` (float: any finite number; int: a whole one)."""
    shown = str(value)[:40]
    if kind is bool or isinstance(value, bool):
        return None if kind is bool and isinstance(value, bool) else f"{shown!r} is not a {kind.__name__}"
    if kind is int:
        return None if isinstance(value, int) else f"{shown!r} is not a whole number"
    if kind is float:
        number = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        return None if number else f"{shown!r} is not a finite number"
    return None if isinstance(value, kind) else f"{shown!r} is not a {'text' if kind is str else 'mapping'}"


def read_status(path: Path) -> dict[str, Any]:
    """status.json, checked (read bounded, every key of the shape this thermab writes, each
    reading a finite number): a file of another shape (an older thermab's, damaged, huge)
    is a UserError naming the file and the key."""
    try:
        state = json.loads(read_bounded(path, MAX_STATUS_BYTES))
    except (ValueError, RecursionError) as error:
        raise UserError(f"{path}: not JSON: {' '.join(str(error).split())[:120]}") from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: not a JSON object")
    for key, kind in STATUS_KEYS.items():
        problem = "missing" if key not in state else _kind_problem(state[key], kind)
        if problem:
            raise UserError(f"{path}: key '{key}': {problem}")
    for host, readings in state["readings"].items():
        if not isinstance(readings, dict):
            raise UserError(f"{path}: key 'readings.{host[:40]}': not a mapping of zones")
        for zone, value in readings.items():
            problem = _kind_problem(value, float)
            if problem:
                raise UserError(f"{path}: key 'readings.{host[:40]}.{str(zone)[:40]}': {problem}")
    return state


def _position_lines(state: dict[str, Any], now: float) -> list[str]:
    age = now - state["t"]
    going = "now" if age < STALE_S else f"as of {_ago(age)} (no load running since)"
    lines = [
        f"  phase {state['k']} of {state['n']} ({state['phase']}) {going}: "
        f"{progress.duration(state['elapsed_s'])} into its load and cooldown; ETA then: phase "
        f"{progress.duration(state['phase_left_s'])}, look {progress.duration(state['look_left_s'])}, "
        f"run {'≤ ' if state['run_bounded'] else ''}{progress.duration(state['run_left_s'])}"
    ]
    for host, readings in state["readings"].items():
        lines.append(f"  {host}: {progress.hottest(readings)} ({len(readings)} zones)")
    return lines


def _ago(seconds: float) -> str:
    return f"{progress.duration(seconds)} ago"


def status_lines(run_dir: Path, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    files = layout.RunDir(run_dir)
    # by time, as every reader takes them: an event appended late with an earlier time
    # (another writer, a host's clock) does not reopen an ended run
    history = sorted(events.read(run_dir), key=lambda event: event["t"]) if files.events.is_file() else []
    lines = []
    ended = bool(history) and history[-1]["event"] in ENDS
    if not history:
        lines.append(f"{run_dir}: no events yet (preflight not done)")
    elif ended:
        lines.append(f"{run_dir}: ended ({history[-1]['event']}, {_ago(now - history[-1]['t'])})")
    else:
        lines.append(f"{run_dir}: last event {history[-1]['event']}, {_ago(now - history[-1]['t'])}")
    if files.status.is_file() and not ended:
        try:
            lines += _position_lines(read_status(files.status), now)
        except UserError as error:
            lines.append(f"  {error}")
    done = sorted(path.parent.name for path in files.phases.glob("*/phase.json") if path.parent.name != "baseline")
    lines.append(f"  phases done: {len(done)}" + (f" ({', '.join(done)})" if done else ""))
    try:
        answers = read_run_answers(run_dir)
    except UserError as error:
        answers = None
        lines.append(f"  {error}")
    try:
        command = decide_command(run_dir, answers)
    except UserError as error:
        command = ""
        lines.append(f"  {error}")
    found = answer_lines(answers, command)
    lines.append("  questions so far:" if found else "  questions: not analysed yet")
    lines += [f"    {answer}" for answer in found]
    if files.summary.is_file():
        lines.append(f"  summary: {files.summary}")
    return lines


def main(argv: list[str]) -> int:
    parser = cli.parser("status", __doc__)
    parser.add_argument("run_dir", nargs="?", type=Path, help="the run directory (default: the newest under results/)")
    args = parser.parse_args(argv)
    run_dir = args.run_dir or newest_run(Path(layout.RESULTS))
    if run_dir is None:
        print(f"no run under {layout.RESULTS}/ yet")
        return 0
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a directory (a run directory: results/CLUSTER/ORDER)")
    if not layout.RunDir(run_dir).is_run():
        raise UserError(
            f"{run_dir}: not a run directory (no session.json, logs/, events.jsonl or run.json;"
            " a run directory: results/CLUSTER/ORDER)"
        )
    print("\n".join(status_lines(run_dir)))
    return 0
