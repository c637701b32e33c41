"""The map connector under epochal's conformance kit, and pytest fixtures that let any
connector's suite use the map as the other side (``epochal_map_source``, ``epochal_map_sink``).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from epochal.testing import SinkUnderTest, SourceUnderTest
from epochal.testing.contract_checks.typed import ALL_TYPES
from epochal_map.store import MapStore
from epochal_sdk.schema import Field


class MapSourceUnderTest(SourceUnderTest):
    """The map's journal as a replayable source: record IDs are the keys."""

    connector = "map"
    id_expr = "CAST(key AS BIGINT)"

    def __init__(self, path: str | Path, map_name: str = "input") -> None:
        self.path, self.map_name = str(path), map_name

    def options(self) -> dict[str, str]:
        return {"path": self.path, "map": self.map_name}

    def produce(self, ids: Sequence[int]) -> None:
        with MapStore(self.path) as store:
            store.append_events(self.map_name, [(str(i), str(i)) for i in ids])


class MapSinkUnderTest(SinkUnderTest):
    """The map as a sink. Transactional mode is read through the journal (every committed
    write appears there once); idempotent mode through the entries."""

    connector = "map"
    types = ALL_TYPES  # every kit type

    def __init__(self, path: str | Path, map_name: str = "output") -> None:
        self.path, self.map_name = str(path), map_name

    def options(self, mode: str) -> dict[str, str]:
        return {"path": self.path, "map": self.map_name, "mode": mode}

    def committed(self, mode: str) -> list[tuple[str, str]]:
        with MapStore(self.path) as store:
            if mode == "idempotent":
                return sorted(store.entries(self.map_name).items())
            out = []
            for partition in store.journal_partitions(self.map_name):
                end = store.journal_end(self.map_name, partition)
                out += [
                    (k, v) for _, k, v, _ in store.journal_read(self.map_name, partition, 0, end)
                ]
            return out

    def in_doubt(self) -> list[str]:
        with MapStore(self.path) as store:
            return store.in_doubt("ep.")

    def committed_typed(self, mode: str, schema: tuple[Field, ...]) -> list[dict[str, Any]]:
        """The typed records: each entry's value is the JSON object of the record's columns
        but its key (the map sink's value when the records have no ``value`` column)."""
        return _typed_rows(self.committed(mode), schema)


@pytest.fixture
def epochal_map_source(tmp_path: Any) -> MapSourceUnderTest:
    """A fresh map journal to read from."""
    return MapSourceUnderTest(tmp_path / "source.sqlite")


@pytest.fixture
def epochal_map_sink(tmp_path: Any) -> MapSinkUnderTest:
    """A fresh map to write to."""
    return MapSinkUnderTest(tmp_path / "sink.sqlite")


def from_map_text(spark_type: str, value: Any) -> Any:
    """A column's value as the map sink keeps it in a record's JSON object (JSON where JSON
    has the type; ``str()`` of a decimal, a date, a timestamp or bytes), back as Python's
    value of ``spark_type``."""
    if not isinstance(value, str | list):
        return value
    kind = spark_type.lower()
    try:
        if kind.startswith("decimal") and isinstance(value, str):
            return Decimal(value)
        if kind.startswith("timestamp") and isinstance(value, str):
            return dt.datetime.fromisoformat(value)
        if kind == "date" and isinstance(value, str):
            return dt.date.fromisoformat(value)
        if kind == "binary" and isinstance(value, str) and value.startswith(("b'", 'b"')):
            return ast.literal_eval(value)
        if kind.startswith("map<") and isinstance(value, list):
            return {k: v for k, v in value}
    except (ArithmeticError, ValueError, SyntaxError, TypeError):
        pass  # not what the sink writes for this type: returned as read, the check shows it
    return value


def _typed_rows(
    items: Sequence[tuple[str, str]], schema: tuple[Field, ...]
) -> list[dict[str, Any]]:
    rows = []
    for key, text in items:
        record = json.loads(text)
        rows.append(
            {"key": key} | {f.name: from_map_text(f.type, record.get(f.name)) for f in schema[1:]}
        )
    return rows
