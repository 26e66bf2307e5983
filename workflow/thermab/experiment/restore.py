"""``python -m thermab restore [RESULTS_DIR]``: put every host back by hand, e.g. after
the controller itself crashed (power loss, OOM) and no guardian was left to do it.

Every run directory with a session is visited; each cluster's hosts get their original
files back from the kept copies (verified by sha256), their servers, agents and
simulated nodes stopped, and their logs pulled."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from thermab.config import UserError
from thermab.experiment import guardian
from thermab.experiment.cluster import SESSION_FILE, ClusterRun, exit_status
from thermab.layout import RunDir


def restore_all(results: Path, progress=print) -> tuple[list[str], list[str]]:
    """Shut down every run with a session under ``results``; returns the problems met and
    the hosts still patched (``cluster/host``)."""
    problems: list[str] = []
    patched: list[str] = []
    done_clusters: set[Path] = set()
    for session in sorted(Path(results).glob(f"*/*/{SESSION_FILE}")):
        run_dir = session.parent
        if run_dir.parent in done_clusters:
            guardian.release(run_dir)
            continue
        done_clusters.add(run_dir.parent)
        try:
            guardian.release(run_dir)  # we are doing its work now
            run = ClusterRun.from_session(run_dir, progress)
        except Exception as error:  # one unreadable run must not keep the others patched
            problems.append(f"{run_dir}: cannot rebuild the run from {SESSION_FILE}: {type(error).__name__}: {error}")
            patched += [f"{run_dir.parent.name}/{p.parent.name}"
                        for p in sorted(RunDir(run_dir).patch_state("*").parent.glob("*/state.json"))]
            continue
        progress(f"{run_dir}: hosts patched: {', '.join(run.still_patched()) or 'none'}")
        problems += run.shutdown("manual restore")
        patched += [f"{run.cluster.name}/{host}" for host in run.still_patched()]
    if not done_clusters:
        progress(f"no run with a session under {results}: nothing to restore")
    return problems, patched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thermab restore", description=__doc__.splitlines()[0],
                                     epilog="exit status: 0 all put back; 1 every file restored but another "
                                            "step failed; 3 a host is still patched")
    parser.add_argument("results", nargs="?", default="results", type=Path)
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        raise UserError(f"{args.results}: not a directory (the results directory of a run)")
    problems, patched = restore_all(args.results)
    for problem in problems:
        print(f"PROBLEM {problem}", file=sys.stderr)
    if patched:
        print(f"STILL PATCHED {', '.join(patched)} (originals kept under patch-state/)", file=sys.stderr)
    return exit_status(problems, patched)
