"""The checks of text a run will format or match: ``str.format`` templates, regular
expressions (refused where matching could backtrack exponentially), one-line values."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

from thermab.config.problems import _short

try:  # the regex parser, to judge a user's pattern before it runs (no public API has it)
    # typeshed gives re's private modules no stubs
    from re import _constants as _re_constants, _parser as _re_parser  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as _re_constants
    import sre_parse as _re_parser


# {controller_python} is the controller's Python (the simulated servers run with it), not a
# host's `python` key; {python} is its name in configs written before the two were told apart
SERVER_PLACEHOLDERS = ("root", "controller_python", "env", "python")
VALUE_PLACEHOLDER = "value"


def template_fields(key: str, text: str, allowed: tuple[str, ...], problems: list[str]) -> list[str] | None:
    """The placeholders of a ``str.format`` template, in order, or None (with a problem
    added) when it has another placeholder, an attribute, index, conversion or format
    spec, or an unpaired brace: what ``format`` would raise on, or leak through, at run time."""
    literal_braces = "a literal brace is written {{ or }}"
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as error:
        problems.append(f"config key '{key}': not a valid template: {error} ({literal_braces})")
        return None
    names = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in allowed or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            known = ", ".join("{" + a + "}" for a in allowed)
            problems.append(f"config key '{key}': placeholder {_short(shown)} is not one of {known} ({literal_braces})")
            return None
        names.append(name)
    return names


ANY_CHAR = object()  # a first character that could be anything


def _first_chars(items: Sequence[tuple[Any, Any]]) -> set[object]:
    """What the text matched by a parsed regex sequence can start with: characters,
    ANY_CHAR, and None when it can match the empty string."""
    c = _re_constants
    for at, (op, arg) in enumerate(items):
        if op is c.AT:
            continue
        if op is c.LITERAL:
            return {arg}
        if op is c.SUBPATTERN:
            first = _first_chars(arg[-1])
        elif op is c.BRANCH:
            first = set().union(*(_first_chars(branch) for branch in arg[1]))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            first = _first_chars(arg[2]) | ({None} if arg[0] == 0 else set())
        else:
            return {ANY_CHAR}
        if None not in first:
            return first
        return (first - {None}) | _first_chars(items[at + 1 :])
    return {None}


def _ambiguous_repeat(items: Sequence[tuple[Any, Any]], inside_repeat: bool = False) -> bool:
    """A repeat that can split one text in many ways, so a failing match backtracks
    through exponentially many: a repeat inside a repeat (``(a+)+``, ``(\\w*\\s?)*``), or,
    inside a repeat, an alternation whose branches may start alike or match nothing
    (``(a|aa)*``, ``(\\d|\\w)+``).  Conservative: some harmless patterns are refused too."""
    c = _re_constants
    for op, arg in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) and arg[1] > 1:
            if inside_repeat or _ambiguous_repeat(arg[2], True):
                return True
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            if _ambiguous_repeat(arg[2], inside_repeat and op is not c.POSSESSIVE_REPEAT):
                return True
        elif op is c.SUBPATTERN:
            if _ambiguous_repeat(arg[-1], inside_repeat):
                return True
        elif op is c.BRANCH:
            if inside_repeat:
                firsts = [_first_chars(branch) for branch in arg[1]]
                seen: set[object] = set()
                for first in firsts:
                    if None in first or ANY_CHAR in first or first & seen or (ANY_CHAR in seen):
                        return True
                    seen |= first
            if any(_ambiguous_repeat(branch, inside_repeat) for branch in arg[1]):
                return True
        elif op is c.ATOMIC_GROUP and _ambiguous_repeat(arg, False):
            return True
    return False


def _regex(key: str, pattern: str, problems: list[str]) -> re.Pattern[str] | None:
    try:
        compiled = re.compile(pattern)
        ambiguous = _ambiguous_repeat(_re_parser.parse(pattern))
    except (re.error, RecursionError, OverflowError) as error:
        problems.append(f"config key '{key}': not a regular expression: {error}")
        return None
    if ambiguous:
        problems.append(
            f"config key '{key}': a repeat inside a repeat, or a repeated alternation whose branches "
            "can match alike: matching it can take exponential time (catastrophic backtracking); "
            "rewrite it with one repeat, e.g. [0-9.]+ for ([0-9]+\\.?)+"
        )
        return None
    if compiled.search("") is not None:
        problems.append(f"config key '{key}': matches the empty string, so it matches everywhere")
        return None
    return compiled


def _one_line(key: str, text: str | None, problems: list[str]) -> bool:
    if isinstance(text, str) and ("\n" in text or "\r" in text):
        problems.append(f"config key '{key}': must be one line")
        return False
    return True
