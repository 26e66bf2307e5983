"""The argument parser every ``python -m thermab`` command builds its help with: the
description as written (its own line breaks kept) and each option's default shown after
its help, so no help text has to repeat a default by hand; a mistake in the arguments is
one line (argparse's own answer is the usage and the error over several lines).  And the
argparse types of numeric options: a plain decimal number, bounded as the config key the
option stands for bounds it (``as_key``) or, for an option no key stands for, by
``number``'s own bounds."""

from __future__ import annotations

import argparse
import math
import re

from thermab.errors import USER_ERROR

MAX_CORES = 4096  # any --cores: more processors than one machine has (Snakemake's, a simulated node's)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        # a flag's default (False) and an unset option's (None) say nothing a reader needs
        if action.default is None or action.default is False or action.default == [] or action.help is None:
            return action.help or ""
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose answer to a mistake is one line and exit status 2 (its
    subcommands' parsers are of this class too)."""

    def error(self, message: str):
        message = " ".join(message.split())  # argparse's own messages may span lines
        self.exit(USER_ERROR, f"{self.prog}: {message} (--help describes the options)\n")


def parser(command: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``thermab COMMAND``: ``description`` is plain text, its first line the
    summary the command list shows."""
    return Parser(
        prog=f"thermab {command}", description=description.strip(), epilog=epilog, formatter_class=HelpFormatter
    )


# a plain decimal number as a user types one (1e3 too, which YAML 1.1 would read as text);
# not 1_0, 0x10, nan or inf
DECIMAL = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
WHOLE = re.compile(r"[-+]?[0-9]+")


def decimal(text: str, parse=float):
    """``text`` as a finite plain decimal number; ``parse`` int for a whole number."""
    if (WHOLE if parse is int else DECIMAL).fullmatch(text):
        value = parse(text)
        if math.isfinite(value):
            return value
    raise argparse.ArgumentTypeError(f"{text!r} is not a finite decimal {'whole ' if parse is int else ''}number")


def number(minimum: float, maximum: float = math.inf, *, parse=float, above: bool = False):
    """An argparse type for an option no config key stands for: a plain decimal number from
    ``minimum`` (or ``above`` it) to ``maximum`` (none: any finite one)."""

    def convert(text: str):
        value = decimal(text, parse)
        if value > maximum or value < minimum or (above and value == minimum):
            low = f"above {minimum:g}" if above else f"at least {minimum:g}"
            high = f" and at most {maximum:g}" if math.isfinite(maximum) else ""
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if parse is int else ''}number {low}{high}")
        return value

    return convert


def as_key(*path: str, parse=int):
    """An argparse type: the option's text parsed, and taken only where the config key it
    stands for (``path``) would take it (the schema's bounds, finite)."""

    def convert(text: str):
        from thermab.config import key_problem

        value = text if parse is str else decimal(text, parse)
        problem = key_problem(path, value)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem} (as config key '{'.'.join(path)}')")
        return value

    return convert
