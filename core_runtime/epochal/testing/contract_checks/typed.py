"""The kit's typed record: one column of each type a sink may map, values chosen to show the
bugs a type invites, and how a record read back is compared with the one written.

Each kit type (:data:`KIT_TYPES`) is a column ``c_<type>`` of a record keyed by ``key`` (the
record ID as text). Its values break what careless mappings break: a string that is empty,
or holds quotes, a comma, a newline, a tab, a backslash and non-ASCII letters; integers
beyond 32 bits; doubles that need all 17 digits; a decimal with 16 digits and a scale of 4;
timestamps at microseconds, in the session time zone :data:`SESSION_TIME_ZONE` (an offset of
+05:45, so a sink that drops the zone or takes the machine's shifts them); a date and a
timestamp without zone before 1970; bytes that are NUL, 0xff, a newline and a backslash;
an array holding an empty string and a null, a map, a struct with a null field. Every record
whose ID ends in 4 or 9 has a null in every column but its key. Values that grow with the ID
repeat after a while (a double's exponent every 100 IDs, a date every 1 000), so records of
any ID stay within their types' range.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from epochal_sdk.schema import Field

SESSION_TIME_ZONE = "Asia/Kathmandu"
"""The time zone the kit's timestamps come in (Spark gives a ``timestamp`` column's Arrow type
the session's time zone): +05:45, so a sink that loses the zone or applies another is seen."""
_UTC = dt.UTC
_TEXT = 'quote " comma , newline \n tab \t backslash \\ ü €'


@dataclass(frozen=True)
class KitType:
    """One type of the kit's typed record.

    Attributes:
        name: the kit's name of the type (``decimal``); the column is ``c_<name>``.
        spark_type: its Spark SQL type as DDL writes it (``decimal(20,4)``).
        arrow: the Arrow type Spark hands a sink for it.
        value: the column's value in the record of ID ``i`` (never None: the kit's null rows
            are made apart).
    """

    name: str
    spark_type: str
    arrow: pa.DataType
    value: Callable[[int], Any]

    @property
    def column(self) -> str:
        """The column's name in the typed record."""
        return f"c_{self.name}"


def _string(i: int) -> str:
    return "" if i % 10 == 0 else f"{i}: {_TEXT}"


KIT_TYPES: tuple[KitType, ...] = (
    KitType("string", "string", pa.string(), _string),
    KitType("bigint", "bigint", pa.int64(), lambda i: (-1) ** i * (2**62 + i)),
    KitType(
        "double",
        "double",
        pa.float64(),
        lambda i: (-1) ** i * (i + 1 / 3) * 10.0 ** (3 * (i % 100)),
    ),
    KitType(
        "decimal",
        "decimal(20,4)",
        pa.decimal128(20, 4),
        lambda i: Decimal(f"{'-' if i % 2 else ''}{10**15 + i}.{i % 10}{i % 7}0{i % 3}"),
    ),
    KitType(
        "timestamp",
        "timestamp",
        pa.timestamp("us", tz=SESSION_TIME_ZONE),
        lambda i: (
            dt.datetime(2026, 3, 29, 1, 30, tzinfo=_UTC)
            + dt.timedelta(hours=7 * (i % 10_000), microseconds=i % 10_000 + 1)
        ),
    ),
    KitType(
        "timestamp_ntz",
        "timestamp_ntz",
        pa.timestamp("us"),
        lambda i: (
            dt.datetime(1969, 12, 31, 23, 59, 59, 999999) + dt.timedelta(days=31 * (i % 10_000))
        ),
    ),
    KitType(
        "date",
        "date",
        pa.date32(),
        lambda i: dt.date(1969, 12, 31) + dt.timedelta(days=400 * (i % 1_000)),
    ),
    KitType("boolean", "boolean", pa.bool_(), lambda i: i % 2 == 0),
    KitType("binary", "binary", pa.binary(), lambda i: bytes([i % 256, 0, 255, 10, 92])),
    KitType("array", "array<string>", pa.list_(pa.string()), lambda i: [f"a{i}", "", None]),
    KitType(
        "map",
        "map<string,bigint>",
        pa.map_(pa.string(), pa.int64()),
        lambda i: {"k": i, "ü": -(2**40) - i},
    ),
    KitType(
        "struct",
        "struct<a:bigint,b:string>",
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
        lambda i: {"a": i, "b": None if i % 2 else f"b{i}"},
    ),
)
"""Every type of the kit's typed record, in column order."""

BY_NAME = {t.name: t for t in KIT_TYPES}
ALL_TYPES = tuple(BY_NAME)
"""Every kit type's name: ``SinkUnderTest.types`` of a sink that maps them all."""


def kit_types(names: Iterable[str]) -> list[KitType]:
    """The kit types of these names, in the record's column order; an unknown name is an
    error that lists the known ones."""
    wanted = list(names)
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(
            f"SinkUnderTest.types names {unknown}, which are not kit types; the kit's types "
            f"are {', '.join(BY_NAME)}"
        )
    return [t for t in KIT_TYPES if t.name in wanted]


def typed_schema(types: Sequence[KitType]) -> tuple[Field, ...]:
    """The typed record's columns: ``key`` (not null), then one nullable column per type."""
    return (Field("key", "string", nullable=False), *(Field(t.column, t.spark_type) for t in types))


def typed_arrow(types: Sequence[KitType]) -> pa.Schema:
    """The typed record's columns as Spark hands them to a sink in Arrow."""
    return pa.schema(
        [pa.field("key", pa.string(), nullable=False)]
        + [pa.field(t.column, t.arrow) for t in types]
    )


def is_null_row(i: int) -> bool:
    """Whether the record of ID ``i`` has a null in every column but its key."""
    return i % 5 == 4


def typed_records(ids: Iterable[int], types: Sequence[KitType]) -> list[dict[str, Any]]:
    """The typed records of these IDs, as dicts by column."""
    return [
        {"key": str(i), **{t.column: None if is_null_row(i) else t.value(i) for t in types}}
        for i in ids
    ]


def normalized(kit_type: KitType, value: Any) -> Any:
    """A value of ``kit_type`` in the one form the comparison uses: timestamps with a zone as
    UTC instants, a map as a dict (Arrow gives its entries as pairs), bytes as ``bytes``.
    Anything that is not of the type's form is left as it is (it then differs)."""
    if value is None:
        return None
    if kit_type.name == "timestamp" and isinstance(value, dt.datetime) and value.tzinfo:
        return value.astimezone(_UTC)
    if kit_type.name == "map" and isinstance(value, list):
        try:
            return {k: v for k, v in value}
        except (TypeError, ValueError):
            return value
    if kit_type.name == "binary" and isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _same(kit_type: KitType, wrote: Any, read: Any) -> bool:
    a, b = normalized(kit_type, wrote), normalized(kit_type, read)
    if a is not None and b is not None and type(a) is not type(b):
        return False  # True equals 1, 1 equals 1.0: a value read back as another type differs
    return bool(a == b)


def differences(
    written: Sequence[dict[str, Any]], read: Sequence[dict[str, Any]], types: Sequence[KitType]
) -> list[str]:
    """How the records read back (by ``key``; each written key once) differ from those
    written, one line per wrong value, missing record or unknown record."""
    out: list[str] = []
    seen: dict[str, list[dict[str, Any]]] = {}
    for row in read:
        seen.setdefault(str(row.get("key")), []).append(row)
    for record in written:
        rows = seen.pop(record["key"], [])
        if not rows:
            out.append(f"record {record['key']} is not visible")
            continue
        if len(rows) > 1:
            out.append(f"record {record['key']} is visible {len(rows)} times")
        for t in types:
            got = rows[0].get(t.column, "<no such column>")
            if not _same(t, record[t.column], got):
                out.append(
                    f"record {record['key']}, {t.column} ({t.spark_type}): wrote "
                    f"{record[t.column]!r}, read {got!r}"
                )
    out += [f"record {key} was never written" for key in seen]
    return out


def with_typed_columns(rows: Any, names: Sequence[str]) -> Any:
    """The kit's typed record of each row of the Spark frame ``rows`` (by its ``key``, the
    record ID): ``key`` and the column of each kit type in ``names``, made from the record ID
    by a Python task (``mapInArrow``) and handed back to Spark in Arrow, so the values reach
    the sink through Spark's own conversions (its session time zone, decimal precision,
    nested types). The kit's copy pipeline applies it (the spec's ``transform``)."""
    types = kit_types(names)
    schema = typed_arrow(types)

    def typed(batches: Any) -> Any:
        for batch in batches:
            ids = [int(k) for k in batch.column("key").to_pylist()]
            yield pa.RecordBatch.from_pylist(typed_records(ids, types), schema=schema)

    ddl = ", ".join(["key string", *(f"{t.column} {t.spark_type}" for t in types)])
    return rows.mapInArrow(typed, ddl)
