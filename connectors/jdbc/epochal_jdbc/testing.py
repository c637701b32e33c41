"""The jdbc connector under epochal's conformance kit, and pytest fixtures that let any suite
use a PostgreSQL table as the source or the sink (``epochal_jdbc_source``,
``epochal_jdbc_sink``). The fixtures need a ``postgres_db`` fixture (the integration harness
provides one: a fresh database per test, with ``dsn`` and ``connect()``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from epochal.testing import SinkUnderTest, SourceUnderTest
from epochal.testing.contract_checks.typed import ALL_TYPES
from epochal_sdk.schema import Field


def _connect(dsn: str) -> Any:
    return psycopg.connect(dsn, autocommit=True)


class JdbcSourceUnderTest(SourceUnderTest):
    """A table ``(id bigint primary key, payload text)`` read by ``id``."""

    connector = "jdbc"
    id_expr = "id"

    def __init__(self, dsn: str, table: str = "input") -> None:
        self.dsn, self.table = dsn, table

    def options(self) -> dict[str, str]:
        return {"url": self.dsn, "table": self.table, "offsetColumns": "id"}

    def produce(self, ids: Sequence[int]) -> None:
        with _connect(self.dsn) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id bigint PRIMARY KEY, payload text)"
                ).format(sql.Identifier(self.table))
            )
            with conn.cursor() as cursor:
                statement = sql.SQL("COPY {} (id, payload) FROM STDIN").format(
                    sql.Identifier(self.table)
                )
                with cursor.copy(statement) as copy:
                    for i in ids:
                        copy.write_row((i, f"payload-{i}"))


class JdbcSinkUnderTest(SinkUnderTest):
    """A table ``output``, created by the sink (``createTable``): no key in transactional
    mode (every committed row is visible, duplicates included), primary key ``key`` in
    idempotent mode."""

    connector = "jdbc"
    types = ALL_TYPES  # every kit type

    def __init__(self, dsn: str, table: str = "output") -> None:
        self.dsn, self.table = dsn, table

    def options(self, mode: str) -> dict[str, str]:
        out = {"url": self.dsn, "table": self.table, "mode": mode, "createTable": "true"}
        if mode == "idempotent":
            out["keyColumns"] = "key"
        return out

    def committed(self, mode: str) -> list[tuple[str, str]]:
        """Rows an independent reader sees, in commit order (transaction id order: a batch's
        transactions start after the previous batch committed)."""
        order = "key" if mode == "idempotent" else "xmin::text::bigint, ctid"
        with _connect(self.dsn) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0]
            if exists is None:
                return []
            rows = conn.execute(
                sql.SQL("SELECT key, value FROM {} ORDER BY " + order).format(
                    sql.Identifier(self.table)
                )
            ).fetchall()
        return [(k, v) for k, v in rows]

    def committed_typed(self, mode: str, schema: tuple[Field, ...]) -> list[dict[str, Any]]:
        """The typed records as psycopg reads the table's columns (``numeric`` as Decimal,
        ``timestamptz`` with its zone, ``bytea`` as bytes, ``jsonb`` parsed), a map's
        ``jsonb`` of entry pairs as a dict."""
        order = "key" if mode == "idempotent" else "xmin::text::bigint, ctid"
        columns = sql.SQL(", ").join(sql.Identifier(f.name) for f in schema)
        with _connect(self.dsn) as conn:
            if conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0] is None:
                return []  # nothing written yet: the sink creates the table at its first batch
            rows = conn.execute(
                sql.SQL("SELECT {} FROM {} ORDER BY " + order).format(
                    columns, sql.Identifier(self.table)
                )
            ).fetchall()
        out = []
        for row in rows:
            record = dict(zip((f.name for f in schema), row, strict=True))
            for f in schema:
                value = record[f.name]
                if f.type.startswith("map<") and isinstance(value, list):
                    record[f.name] = {k: v for k, v in value}
            out.append(record)
        return out

    def in_doubt(self) -> list[str]:
        with _connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                " AND gid LIKE 'ep.%' ORDER BY gid"
            ).fetchall()
        return [gid for (gid,) in rows]


@pytest.fixture
def epochal_jdbc_source(postgres_db: Any) -> JdbcSourceUnderTest:
    """A table in a fresh database to read from."""
    return JdbcSourceUnderTest(postgres_db.dsn)


@pytest.fixture
def epochal_jdbc_sink(postgres_db: Any) -> JdbcSinkUnderTest:
    """A table in a fresh database to write to."""
    return JdbcSinkUnderTest(postgres_db.dsn)
