"""``python -m thermab COMMAND``: the package's entry points outside Snakemake.

    analyze RUN_DIR             tables and summary.md of any run directory
    import-chart JSON OUT_DIR   a run directory from existing wide time-series data
    load ...                    one closed-loop load phase against an endpoint
    check-config FILE           validate a config file, naming any key at fault
    restore [RESULTS_DIR]       restore every host by hand (after a controller crash)
    discover NAME=URL ...       read real nodes (read-only) and write a config that fits them
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "analyze": "thermab.analysis.analyze",
    "import-chart": "thermab.analysis.chart_import",
    "load": "thermab.load.runner",
    "check-config": "thermab.config",
    "restore": "thermab.experiment.restore",
    "discover": "thermab.experiment.discover",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
