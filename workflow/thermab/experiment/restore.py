"""``python -m thermab restore [RESULTS_DIR]``: put every host back by hand, e.g. after
the controller itself crashed (power loss, OOM) and no guardian was left to do it.

Every run directory with a session is visited; each cluster's hosts get their original
files back from the kept copies (verified by sha256), their servers, agents and
simulated nodes stopped, and their logs pulled."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from thermab.experiment import guardian
from thermab.experiment.cluster import SESSION_FILE, ClusterRun


def restore_all(results: Path, progress=print) -> list[str]:
    problems: list[str] = []
    done_clusters: set[Path] = set()
    for session in sorted(Path(results).glob(f"*/*/{SESSION_FILE}")):
        run_dir = session.parent
        guardian.release(run_dir)  # we are doing its work now
        if run_dir.parent in done_clusters:
            continue
        done_clusters.add(run_dir.parent)
        patched = sorted(p.parent.name for p in (run_dir.parent / "patch-state").glob("*/state.json"))
        progress(f"{run_dir}: hosts patched: {', '.join(patched) or 'none'}")
        problems += ClusterRun.from_session(run_dir, progress).shutdown("manual restore")
    if not done_clusters:
        progress(f"no run with a session under {results}: nothing to restore")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thermab restore", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results", type=Path)
    args = parser.parse_args(argv)
    problems = restore_all(args.results)
    for problem in problems:
        print(f"PROBLEM {problem}", file=sys.stderr)
    return 1 if problems else 0
