"""Untrusted text in the report's outputs, escaped where it is written: one function per
output format.  Arm labels and values, cluster, setting, host, zone and metric names, the
question's words, and what hosts and servers said (uname, vLLM version, model name, paths)
are text thermab did not write; in ``summary.md``, ``evidence.md`` and ``report.html`` they
must read as written and never make structure: a line break that starts a heading or a
table row, a ``|`` that adds a column, ``</details>`` that closes the collapsed section,
``<script>``, a link or an image.

- ``md_cell``: a Markdown table cell (``summary.markdown_table`` applies it to every cell and
  header).
- ``md_text``: text inside a Markdown line or heading (a bullet, a sentence, a title).
- ``html_text``: text inside HTML (``report.html``'s own elements).

The Markdown escapes are HTML character references, which GitHub's Markdown and
Python-Markdown both render as the character and never as markup, and which contain none of
the characters escaped, so escaping twice changes nothing (a label escaped for a sentence
may reach a table cell too)."""

from __future__ import annotations

import html
import re

# every character Markdown or HTML could read as structure inside a line, as a reference
INLINE = {
    "<": "&lt;",
    ">": "&gt;",
    "|": "&#124;",
    "\\": "&#92;",
    "`": "&#96;",
    "*": "&#42;",
    "[": "&#91;",
    "]": "&#93;",
    "~": "&#126;",
}
INLINE_PATTERN = re.compile("|".join(map(re.escape, INLINE)))
# an underscore that could open or close emphasis: not between two letters or digits
# (busy_loop_s stays as written)
EMPHASIS_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
# every line break str.splitlines knows, and the other C0 and C1 controls
BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# what opens a block at a line's start: a heading, a quote, a list item, a setext underline
BLOCK_START = re.compile(r"^(\s*)([#>+\-=*]+|\d{1,9}[.)])(?=\s|$)")


class Markdown:
    """Text thermab wrote as Markdown (``**short**``, a hash in backticks), which the escapes
    pass as it is; whatever untrusted text it holds was escaped as it was put in.  Not a
    str, so that a table's column keeps it as it is (pandas keeps no subclass of str)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Markdown) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def md_cell(value) -> str:
    """``value`` as the text of one Markdown table cell: one line, no ``|`` that splits
    it, no markup or HTML of its own."""
    if isinstance(value, Markdown):
        return value.text
    text = BREAKS.sub(" ", str(value))
    text = INLINE_PATTERN.sub(lambda match: INLINE[match.group()], text)
    return EMPHASIS_UNDERSCORE.sub("&#95;", text)


def md_text(value) -> str:
    """``value`` as text inside a Markdown line or heading: as ``md_cell``, and where it
    would stand at a line's start, nothing that opens a block there."""
    if isinstance(value, Markdown):
        return value.text
    return BLOCK_START.sub(lambda m: m.group(1) + "".join(f"&#{ord(c)};" for c in m.group(2)), md_cell(value))


def html_text(value) -> str:
    """``value`` as text inside an HTML element or a quoted attribute."""
    return html.escape(str(value), quote=True)
