"""A config problem: ConfigError, and how a problem is written (the key path on one line,
a value cut short)."""

from __future__ import annotations

from collections.abc import Iterable

from thermab.errors import UserError

MAX_MESSAGE = 300  # characters of a value shown in an error


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message names the key."""


def _key(path: Iterable[object]) -> str:
    text = ".".join(str(part) for part in path) or "(top level)"
    return text.encode("unicode_escape").decode("ascii")  # a newline in a key stays on the line


def _short(text: str) -> str:
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "…"


def _raise(problems: list[str]) -> None:
    """One line for any number of problems."""
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems: " + "; ".join(problems))
