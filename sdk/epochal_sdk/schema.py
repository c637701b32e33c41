"""Column descriptions shared by sources and sinks, free of any Spark type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """One column: its name, its Spark SQL type name (``string``, ``bigint``, ``binary`` ...)
    and whether it may hold nulls."""

    name: str
    type: str
    nullable: bool = True


Schema = tuple[Field, ...]
"""The columns a sink receives, in order."""


def ddl(schema: Schema) -> str:
    """The schema as a Spark DDL string, e.g. ``"id bigint, payload string"``."""
    return ", ".join(f"`{f.name}` {f.type}" + ("" if f.nullable else " NOT NULL") for f in schema)
