"""python -m thermab: the package's commands outside Snakemake (USAGE below)."""

from __future__ import annotations

import difflib
import importlib
import sys

import thermab
from thermab.errors import USER_ERROR, ThermabError, exit_status

COMMANDS = {
    "run": "thermab.experiment.launch",
    "analyze": "thermab.report.analyze",
    "plan": "thermab.report.plan_command",
    "import-chart": "thermab.analysis.chart_import",
    "load": "thermab.load.runner",
    "check-config": "thermab.experiment.check_config",
    "status": "thermab.report.status",
    "restore": "thermab.experiment.restore",
    "lease": "thermab.experiment.lease_command",
    "discover": "thermab.experiment.discover",
    "tune": "thermab.tune.run",
    "compare": "thermab.report.compare",
}

USAGE = """\
usage: python -m thermab [--debug] COMMAND [ARGS ...]
       python -m thermab --help | --version

commands:
  run [SNAKEMAKE ARGS ...]    run the workflow (snakemake), its config files checked first
  analyze RUN_DIR             tables and summary.md of any run directory
  plan RUN_DIR [--hours H]    the phases and cluster-hours that would decide its questions
  import-chart SOURCE OUT_DIR a run directory from existing wide time-series data
  load URL --out FILE ...     one closed-loop load phase against an endpoint
  check-config FILE ...       validate config files layered as Snakemake layers them;
                              --hosts also reaches every host, changing nothing
  status [RUN_DIR]            where a run stands, also while it runs (default: the newest)
  restore [RESULTS_DIR]       put every host back by hand (after a controller crash)
  lease RUN_DIR [--break]     who holds the run's hosts; --break breaks a stale lease
  discover NAME=URL ...       read real nodes (read-only) and write a config that fits them
  tune CONFIG ...             search the setting's best value, each trial a run
  compare RUN_A RUN_B ...     any finished runs side by side: arms matched by label, each
                              metric's difference with its interval, environments first

python -m thermab COMMAND --help describes a command.

A mistake in what was given (a config key, a file, an argument) is answered with one line
naming it and exit status 2; a host or stage that failed, with its message and exit
status 1. --debug shows the traceback as well.
"""


def unknown_command(name: str) -> str:
    """One line naming an unknown command and the closest known one."""
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"the commands: {', '.join(COMMANDS)}"
    return f"thermab: unknown command '{name}'; {hint} (python -m thermab --help describes them)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    if not argv:
        print(USAGE, file=sys.stderr, end="")
        return USER_ERROR
    if argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if argv[0] == "--version":
        print(f"thermab {thermab.__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(unknown_command(argv[0]), file=sys.stderr)
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
