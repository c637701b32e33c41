"""Column descriptions shared by sources and sinks, free of any Spark type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """One column: its name, its Spark SQL type name (``string``, ``bigint``, ``binary`` ...)
    and whether it may hold nulls.

    Attributes:
        name: the column's name.
        type: its Spark SQL type as DDL writes it (``bigint``, ``array<string>``,
            ``decimal(10,2)``).
        nullable: whether it may hold nulls.
    """

    name: str
    type: str
    nullable: bool = True


Schema = tuple[Field, ...]
"""The columns a sink receives, in order: what :meth:`Sink.check <epochal_sdk.sinks.Sink.check>`
gets and :attr:`ConnectorContext.schema <epochal_sdk.ConnectorContext.schema>` holds."""


def ddl(schema: Schema) -> str:
    """The schema as a Spark DDL string, e.g. ``"id bigint, payload string"``."""
    return ", ".join(f"`{f.name}` {f.type}" + ("" if f.nullable else " NOT NULL") for f in schema)


def parse_ddl(text: str) -> Schema:
    """A Spark DDL string as fields, in order: ``"id bigint, tags array<string> NOT NULL"``
    gives ``(Field("id", "bigint"), Field("tags", "array<string>", nullable=False))``.
    Names may be quoted with backticks; nested types (``map<string,int>``,
    ``struct<a:int,b:string>``, ``decimal(10,2)``) stay whole; a ``COMMENT '...'`` is
    dropped."""
    fields = []
    for column in _top_level(text, ","):
        column = column.strip()
        if not column:
            continue
        if column.startswith("`"):
            end = column.index("`", 1)
            name, rest = column[1:end], column[end + 1 :]
        else:
            name, _, rest = column.partition(" ")
        rest = rest.strip()
        comment = _find_word(rest, "COMMENT")
        if comment >= 0:
            rest = rest[:comment].strip()
        nullable = True
        if rest.upper().endswith("NOT NULL"):
            rest, nullable = rest[: -len("NOT NULL")].strip(), False
        if not name or not rest:
            raise ValueError(f"{column!r} in schema {text!r} is not '<name> <type>'")
        fields.append(Field(name, rest.replace(" ", "") if "<" in rest else rest, nullable))
    return tuple(fields)


def column_names(text: str) -> tuple[str, ...]:
    """The column names of a Spark DDL string, in order (the order of a tuple row)."""
    return tuple(f.name for f in parse_ddl(text))


def row_of(values: dict[str, object], columns: tuple[str, ...]) -> tuple[object, ...]:
    """A dict row as a tuple in ``columns`` order (missing columns are None). ``read`` may
    also yield dicts as they are: the runtime does this for you.

    Args:
        values: a row by column name.
        columns: the column names in order (``self.columns()`` of a source).

    Returns:
        The row as a tuple.
    """
    return tuple(values.get(c) for c in columns)


def _top_level(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside ``<>``, ``()`` and quotes."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'`\"":
            quote = char
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts


def _find_word(text: str, word: str) -> int:
    """Where ``word`` starts in ``text`` as a whole word outside ``<>``/``()``, else -1."""
    depth = 0
    upper = text.upper()
    for index, char in enumerate(text):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif depth == 0 and upper.startswith(word, index):
            before = text[index - 1] if index else " "
            after = text[index + len(word) : index + len(word) + 1] or " "
            if before.isspace() and after.isspace():
                return index
    return -1
