"""The argument parser every ``python -m thermab`` command builds its help with: the
description as written (its own line breaks kept) and each option's default shown after
its help, so no help text has to repeat a default by hand."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        # a flag's default (False) and an unset option's (None) say nothing a reader needs
        if action.default is None or action.default is False or action.default == [] or action.help is None:
            return action.help or ""
        return super()._get_help_string(action)


def parser(command: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``thermab COMMAND``: ``description`` is plain text, its first line the
    summary the command list shows."""
    return argparse.ArgumentParser(
        prog=f"thermab {command}", description=description.strip(), epilog=epilog, formatter_class=HelpFormatter
    )
