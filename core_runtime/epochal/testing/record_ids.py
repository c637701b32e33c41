"""Record IDs of rows read without Spark: a source's ``id_expr`` evaluated by SQLite."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any


def sql_record_ids(id_expr: str, rows: Sequence[dict[str, Any]]) -> list[int]:
    """The record ID of each row: ``id_expr`` (a Spark SQL expression such as
    ``CAST(key AS BIGINT)``) evaluated by SQLite over the rows' columns. Casts, arithmetic and
    string functions SQLite shares with Spark work; for anything else, override
    :meth:`~epochal.testing.SourceUnderTest.record_ids`."""
    if not rows:
        return []
    names = list(rows[0])
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE TABLE t ({', '.join(_quoted(n) for n in names)})")
        db.executemany(
            f"INSERT INTO t VALUES ({', '.join('?' for _ in names)})",
            [tuple(_sql_value(row.get(n)) for n in names) for row in rows],
        )
        try:
            values = [v for (v,) in db.execute(f"SELECT ({id_expr}) FROM t ORDER BY rowid")]
        except sqlite3.Error as exc:
            raise ValueError(
                f"id_expr {id_expr!r} cannot be evaluated outside Spark ({exc}); override "
                "SourceUnderTest.record_ids(rows) to give each row's record ID"
            ) from None
    finally:
        db.close()
    out = []
    for row, value in zip(rows, values, strict=True):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(
                f"id_expr {id_expr!r} gives {value!r} for the row {row!r}, not an integer "
                "record ID; override SourceUnderTest.record_ids(rows)"
            )
        out.append(value)
    return out


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_value(value: Any) -> Any:
    if value is None or isinstance(value, str | bytes | float):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)
