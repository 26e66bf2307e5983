"""``python -m thermab [--debug] COMMAND``: the package's entry points outside Snakemake.

    analyze RUN_DIR             tables and summary.md of any run directory
    import-chart JSON OUT_DIR   a run directory from existing wide time-series data
    load ...                    one closed-loop load phase against an endpoint
    check-config FILE           validate a config file, naming any key at fault
    restore [RESULTS_DIR]       restore every host by hand (after a controller crash)
    discover NAME=URL ...       read real nodes (read-only) and write a config that fits them
    tune CONFIG ...             search the setting's best value, each trial a run (docs/tune.md)

A mistake in what was given (a config key, a file, an argument) is answered with one line
naming it and exit status 2, a host or stage that failed (``thermab.errors``) with its
message and exit status 1; ``--debug`` shows the traceback as well.
"""

from __future__ import annotations

import importlib
import sys

from thermab.errors import USER_ERROR, ThermabError, exit_status

COMMANDS = {
    "analyze": "thermab.analysis.analyze",
    "import-chart": "thermab.analysis.chart_import",
    "load": "thermab.load.runner",
    "check-config": "thermab.config",
    "restore": "thermab.experiment.restore",
    "discover": "thermab.experiment.discover",
    "tune": "thermab.tune.run",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return USER_ERROR
    module = importlib.import_module(COMMANDS[argv[0]])
    try:
        return module.main(argv[1:]) or 0
    except ThermabError as error:  # a user's mistake (2), or a host or stage that failed (1)
        if debug:
            raise
        print(f"thermab {argv[0]}: {error}", file=sys.stderr)
        return exit_status(error)
    except OSError as error:
        if debug or error.filename is None:
            raise
        # a file the user named cannot be read or written
        print(f"thermab {argv[0]}: {error.filename}: {error.strerror}", file=sys.stderr)
    return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
