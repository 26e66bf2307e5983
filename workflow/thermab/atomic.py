"""Outputs written whole or not at all: each is written to a temporary file beside it and
moved onto its name (``os.replace``, atomic on one file system), so a reader (another
``analyze``, an ingest, Snakemake) sees the old file or the new one, never a part of one."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; moved onto ``path`` when the block ends
    without an exception, removed in any case."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """``path``'s text, replaced whole (UTF-8)."""
    with replacing(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
