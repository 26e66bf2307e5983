"""A table's rows read by attribute, typed by the table's reader.

pandas' stubs give every field of a row as any scalar, so each table the report reads row by
row declares the columns it reads as a Protocol and binds ``tuple_rows`` to it:
``answer_rows: Callable[[pd.DataFrame], Iterator[AnswerRow]] = tuple_rows``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd


def tuple_rows(frame: pd.DataFrame) -> Iterator[Any]:
    """``frame``'s rows as named tuples (no index), typed by whoever binds this function."""
    return iter(frame.itertuples(index=False))
