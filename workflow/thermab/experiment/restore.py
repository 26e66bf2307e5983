"""Put every host back by hand, e.g. after the controller itself crashed (power loss, OOM)
and no guardian was left to do it.

    python -m thermab restore [RESULTS_DIR]

Every run directory with a session is visited. One that was not shut down (its guardian's
file is left: the guardian never released, or was killed with the controller) or that holds
its cluster's patch (the newest unrestored patch_applied event) is put back: the hosts'
original files from the kept copies (verified by sha256), servers, agents and simulated
nodes stopped, logs pulled, and the abort and restored events written into that run's own
events.jsonl. A run that ended cleanly is left as it is."""

from __future__ import annotations

import sys
from pathlib import Path

from thermab import cli, layout
from thermab.errors import UserError
from thermab.experiment import events, guardian
from thermab.experiment.cluster import ClusterRun, exit_status
from thermab.layout import SESSION_FILE


def patch_holder(run_dirs: list[Path]) -> Path | None:
    """Of one cluster's runs, the one whose newest ``patch_applied`` no ``restored`` followed
    (the newest such, if several): the run that left the cluster's files patched."""

    def unrestored(run_dir: Path) -> float | None:
        latest = None
        for event in events.read(run_dir):
            if event["event"] == "patch_applied":
                latest = event["t"]
            elif event["event"] in ("restored", "run_end"):
                latest = None
        return latest

    held = [(t, run_dir) for run_dir in run_dirs if (t := unrestored(run_dir)) is not None]
    return max(held)[1] if held else None


def interrupted_runs(cluster_dir: Path) -> list[Path]:
    """The runs of ``results/{cluster}`` to put back, the one holding the patch first (its
    events say the files were restored); the others ended cleanly."""
    run_dirs = sorted(session.parent for session in Path(cluster_dir).glob(f"*/{SESSION_FILE}"))
    patched = any(layout.patch_state(Path(cluster_dir), "*").parent.glob("*/state.json"))
    holder = patch_holder(run_dirs) if patched else None
    if patched and holder is None and run_dirs:  # patched outside a phase's events: the newest session
        holder = max(run_dirs, key=lambda r: (r / SESSION_FILE).stat().st_mtime)
    unfinished = [r for r in run_dirs if (r / guardian.PID_FILE).exists() and r != holder]
    return ([holder] if holder else []) + unfinished


def restore_all(results: Path, progress=print) -> tuple[list[str], list[str]]:
    """Put back every interrupted run with a session under ``results``; returns the problems
    met and the hosts still patched (``cluster/host``)."""
    problems: list[str] = []
    patched: list[str] = []
    clusters = sorted({session.parent.parent for session in Path(results).glob(f"*/*/{SESSION_FILE}")})
    for cluster_dir in clusters:
        interrupted = interrupted_runs(cluster_dir)
        for run_dir in sorted(r.parent for r in cluster_dir.glob(f"*/{SESSION_FILE}")):
            if run_dir not in interrupted:
                progress(f"{run_dir}: ended cleanly, nothing to put back")
        for run_dir in interrupted:
            try:
                guardian.release(run_dir)  # we are doing its work now
                run = ClusterRun.from_session(run_dir, progress)
            except Exception as error:  # one unreadable run must not keep the others patched
                problems.append(
                    f"{run_dir}: cannot rebuild the run from {SESSION_FILE}: {type(error).__name__}: {error}"
                )
                patched += [
                    f"{cluster_dir.name}/{p.parent.name}"
                    for p in sorted(layout.patch_state(cluster_dir, "*").parent.glob("*/state.json"))
                ]
                continue
            progress(f"{run_dir}: hosts patched: {', '.join(run.still_patched()) or 'none'}")
            problems += run.shutdown("manual restore")
            patched += [f"{run.cluster.name}/{host}" for host in run.still_patched()]
    if not clusters:
        progress(f"no run with a session under {results}: nothing to restore")
    return problems, sorted(set(patched))


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(
        "restore",
        __doc__,
        epilog="exit status: 0 all put back; 1 every file restored but another step failed; 3 a host is still patched",
    )
    parser.add_argument(
        "results", nargs="?", default="results", type=Path, help="the results directory whose runs to visit"
    )
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        raise UserError(f"{args.results}: not a directory (the results directory of a run)")
    problems, patched = restore_all(args.results)
    for problem in problems:
        print(f"PROBLEM {problem}", file=sys.stderr)
    if patched:
        print(f"STILL PATCHED {', '.join(patched)} (originals kept under patch-state/)", file=sys.stderr)
    return exit_status(problems, patched)
