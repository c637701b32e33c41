"""Fast loading of Arrow record batches with ``COPY ... FROM STDIN``.

Batches whose columns are all scalars go through Arrow's C++ CSV writer (nulls unquoted and
empty, strings always quoted: exactly PostgreSQL's CSV rules); anything else (binary, nested)
row by row through psycopg's COPY writer.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

_CSV_OPTIONS = pacsv.WriteOptions(include_header=False, quoting_style="needed")


def _csv_safe(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def _plain(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def copy_batch(cursor: Any, target: sql.Composable, batch: pa.RecordBatch) -> None:
    """COPY the rows of ``batch`` into ``target`` (columns matched by name, in order)."""
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in batch.schema.names)
    if all(_csv_safe(f.type) for f in batch.schema):
        out = io.BytesIO()
        pacsv.write_csv(batch, out, _CSV_OPTIONS)
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(target, columns)
        with cursor.copy(statement) as copy:
            copy.write(out.getbuffer())
        return
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(target, columns)
    arrays = [c.to_pylist() for c in batch.columns]
    with cursor.copy(statement) as copy:
        for row in zip(*arrays, strict=True):
            copy.write_row([_plain(v) for v in row])
