"""Run the workflow: snakemake with the arguments given, once the mistakes Snakemake itself
would answer with a traceback are answered in one line.

    python -m thermab run [SNAKEMAKE ARGUMENTS ...]
    python -m thermab run --cores 1 --configfile my-cluster.yaml

Snakemake reads --configfile and --config before the workflow's own checks run, and answers
a missing file, a YAML error (without its line) and a --config key that is no plain name
(load.users=4) with a traceback. Here each is one line naming the file and line, or the
key, with exit status 2; then snakemake runs with the same arguments and this checkout's
Snakefile (unless -s or --snakefile names another). Every other argument is Snakemake's
(snakemake --help).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import thermab
from thermab import cli
from thermab.config import read_file
from thermab.errors import UserError

SNAKEFILE = Path(thermab.__file__).resolve().parents[2] / "Snakefile"  # the checkout's (an editable install)
FILE_OPTIONS = ("--configfile", "--configfiles")
CONFIG_OPTION = "--config"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what Snakemake takes as a --config key


def _values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """The values given to ``options`` (each takes the arguments up to the next option)."""
    values, taking = [], False
    for arg in argv:
        name, equals, value = arg.partition("=")
        if arg.startswith("-"):
            taking = arg in options
            if equals and name in options:
                values.append(value)
        elif taking:
            values.append(arg)
    return values


def _config_problem(item: str) -> str | None:
    key, equals, value = item.partition("=")
    if not equals:
        return f"--config {item}: not KEY=VALUE"
    if NAME.fullmatch(key):
        return None
    if "." in key and all(NAME.fullmatch(part) for part in key.split(".")):
        outer, _, inner = key.partition(".")
        nested = inner.replace(".", ": {") + ": " + value + "}" * inner.count(".")
        return f"--config {item}: a nested key is given as a mapping: --config '{outer}={{{nested}}}'"
    return f"--config {item}: {key!r} is not a config key (letters, digits and _)"


CORES_OPTIONS = ("--cores", "-c")  # not --jobs: a cluster's executor may run thousands at once


def _cores_problems(argv: list[str]) -> list[str]:
    """A --cores that is neither ``all`` nor a whole number 1 to cli.MAX_CORES, bounded as
    every command's --cores (on 0 Snakemake waits for ever)."""
    found = []
    for at, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if not equals:
            following = argv[at + 1] if at + 1 < len(argv) else ""
            value = following if arg in CORES_OPTIONS and not following.startswith("-") else ""
        if name in CORES_OPTIONS and value and value != "all":
            try:
                cli.number(1, cli.MAX_CORES, parse=int)(value)
            except argparse.ArgumentTypeError as error:
                found.append(f"argument {name}: {error}")
    return found


def problems(argv: list[str]) -> list[str]:
    """What Snakemake would stop on with a traceback or a wait, each in one line."""
    found = _cores_problems(argv)
    for path in _values(argv, FILE_OPTIONS):
        try:
            read_file(path)
        except UserError as error:  # a ConfigError too
            found.append(str(error))
    found += [p for item in _values(argv, (CONFIG_OPTION,)) if (p := _config_problem(item))]
    return found


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(f"usage: thermab run [SNAKEMAKE ARGUMENTS ...]\n\n{__doc__.strip()}\n\noptions:\n  those of snakemake")
        return 0
    found = problems(argv)
    if found:
        raise UserError(found[0] if len(found) == 1 else f"{len(found)} problems: " + "; ".join(found))
    given = any(arg in ("-s", "--snakefile") or arg.startswith("--snakefile=") for arg in argv)
    if not given and not SNAKEFILE.is_file():  # a non-editable install has no checkout beside it
        raise UserError(f"no Snakefile at {SNAKEFILE}: give the checkout's with --snakefile")
    command = [sys.executable, "-m", "snakemake", *([] if given else ["--snakefile", str(SNAKEFILE)]), *argv]
    os.execv(sys.executable, command)
    return 0  # not reached: the process is snakemake now
