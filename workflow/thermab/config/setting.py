"""The setting and its arms: what a patch will write (a Python literal, an anchor that
matches the replacement once), or what a server start passes through its environment."""

from __future__ import annotations

import ast
import io
import math
import tokenize
from typing import Any

from thermab.config.addresses import _normalised
from thermab.config.patterns import VALUE_PLACEHOLDER, _one_line, _regex, template_fields
from thermab.config.problems import _short


def literal_number(text: str) -> float | None:
    """The finite number ``text`` is as a Python literal (``literal_kind`` ``number``: also
    ``0x10``, ``(1)``, ``1_000``), or None."""
    if literal_kind(text) != "number":
        return None
    value = float(ast.literal_eval(text.strip()))
    return value if math.isfinite(value) else None


def literal_kind(text: str) -> str | None:
    """The kind of Python literal ``text`` is (``number`` for ints and floats alike,
    ``string``, ``bool``, ``None``, ``tuple``, …), or None when it is not a literal, or
    carries a comment (pasted into a line, a comment would swallow the rest of it)."""
    try:
        value = ast.literal_eval(text.strip())
        if any(token.type == tokenize.COMMENT for token in tokenize.generate_tokens(io.StringIO(text).readline)):
            return None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError):
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", bytes: "bytes", type(None): "None"}.get(type(value), type(value).__name__)


def _setting_problems(config: dict[str, Any], problems: list[str]) -> None:
    setting, arms = config["setting"], config["arms"]
    for letter, arm in arms.items():
        _one_line(f"arms.{letter}.value", arm["value"], problems)
    if setting["method"] == "env":
        if "env_var" not in setting:
            problems.append("config key 'setting.env_var': required when method is env")
        for name, cluster in config["clusters"].items():
            starts = {
                h: host["server"]["start"] for h, host in cluster["hosts"].items() if "start" in host.get("server", {})
            }
            if not starts:
                problems.append(
                    f"config key 'clusters.{name}.hosts': with setting.method env a server.start "
                    "command with {env} must pass the value on; no host has one"
                )
            for host_name, start in starts.items():
                if "{env}" not in start:
                    problems.append(
                        f"config key 'clusters.{name}.hosts.{host_name}.server.start': must contain "
                        "{env} (setting.method env passes the arm's value through it; without it "
                        "every arm runs the same server)"
                    )
        return
    missing = [name for name in ("file", "anchor", "replacement") if name not in setting]
    for name in missing:
        problems.append(f"config key 'setting.{name}': required when method is file")
    if missing:
        return
    _one_line("setting.file", setting["file"], problems)
    _normalised("setting.file", setting["file"], problems)
    anchor = _regex("setting.anchor", setting["anchor"], problems)
    fields = template_fields("setting.replacement", setting["replacement"], (VALUE_PLACEHOLDER,), problems)
    if fields is not None and fields != [VALUE_PLACEHOLDER]:
        problems.append(
            f"config key 'setting.replacement': must contain {{value}} exactly once (it has it {len(fields)} times)"
        )
        fields = None
    if anchor is None or fields is None:
        return
    kinds = {}
    for letter, arm in arms.items():
        rendered = setting["replacement"].format(value=arm["value"])
        count = len(anchor.findall(rendered))
        if count != 1:
            problems.append(
                f"config key 'arms.{letter}.value': setting.replacement with this value "
                f"({_short(rendered)!r}) matches setting.anchor {count} times: it must match once, "
                "so that a patched file can be found, patched again and restored"
            )
        if setting["value_type"] == "literal":
            kinds[letter] = literal_kind(arm["value"])
            if kinds[letter] is None:
                problems.append(
                    f"config key 'arms.{letter}.value': {_short(arm['value'])!r} is not a Python "
                    "literal (a number, a quoted string, True, …); if the file takes code, set "
                    "setting.value_type: expression"
                )
    if len(set(k for k in kinds.values() if k)) > 1:
        problems.append(
            "config key 'arms': the values are literals of different kinds ("
            + ", ".join(f"{letter} {kind}" for letter, kind in kinds.items() if kind)
            + ")"
        )
