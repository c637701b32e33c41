"""Bad input the PostgreSQL connector meets in the data, not in its options: a key column
that may hold NULL under an idempotent sink, a NULL in a source's offset column. Each is
refused with a clear error instead of costing data (rows of the bad-input table in
docs/explanation/guarantees.md)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from epochal_jdbc import JdbcSink, JdbcSource

from epochal_sdk import ConfigError, ConnectorContext, Options, SchemaMismatchError
from epochal_sdk.schema import Field
from integration.harness.plugin import PostgresDatabase

pytestmark = pytest.mark.integration

SCHEMA = (Field("id", "string"), Field("value", "string"))


def _upsert_sink(db: PostgresDatabase, table: str) -> JdbcSink:
    options = {"url": db.dsn, "table": table, "mode": "idempotent", "keyColumns": "id"}
    return JdbcSink(Options("jdbc", options))


def _upsert(sink: JdbcSink, batch: int, rows: list[tuple[str | None, str]]) -> None:
    task = ConnectorContext("j", "jdbc-1", batch, 0, 0, SCHEMA, run=1)
    writer = sink.open(task)
    ids, values = zip(*rows, strict=True)
    writer.write(pa.record_batch({"id": pa.array(ids, pa.string()), "value": pa.array(values)}))
    writer.flush()
    writer.close()


def test_an_upsert_key_that_may_hold_null_is_refused_at_check(
    postgres_db: PostgresDatabase,
) -> None:
    """A unique index never matches a NULL key: the replay of a record with a NULL key
    inserts it again (shown first), so the sink refuses such a key column before it writes;
    a NOT NULL key, or a NULLS NOT DISTINCT index, is accepted."""
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE nullable (id text UNIQUE, value text)")
        conn.execute("CREATE TABLE strict (id text NOT NULL UNIQUE, value text)")
        conn.execute("CREATE TABLE nulls_equal (id text UNIQUE NULLS NOT DISTINCT, value text)")
    unchecked = _upsert_sink(postgres_db, "nullable")
    for _ in range(2):  # what the check prevents: a replayed batch doubles its NULL key
        _upsert(unchecked, 1, [("a", "1"), (None, "2")])
    with postgres_db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM nullable WHERE id IS NULL").fetchone()[0] == 2
    with pytest.raises(SchemaMismatchError) as refused:
        _upsert_sink(postgres_db, "nullable").check(SCHEMA)
    message = str(refused.value)
    assert "table nullable" in message and "['id'] may hold NULL" in message, message
    assert "SET NOT NULL" in message and "NULLS NOT DISTINCT" in message
    _upsert_sink(postgres_db, "strict").check(SCHEMA)
    _upsert_sink(postgres_db, "nulls_equal").check(SCHEMA)


def test_a_null_offset_is_a_clear_error_not_a_silent_stall(postgres_db: PostgresDatabase) -> None:
    """A NULL sorts as the newest offset and compares as unknown with every other: without
    the check the source plans an end it can never pass and reads nothing, for ever."""
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE events (id bigint, payload text)")
        conn.execute("INSERT INTO events SELECT i, 'p' || i FROM generate_series(1, 5) i")
    source = JdbcSource(
        Options("jdbc", {"url": postgres_db.dsn, "table": "events", "offsetColumns": "id"})
    )
    source.check()
    assert source.latest_offsets(["0"]) == {"0": [5]}
    with postgres_db.connect() as conn:
        conn.execute("INSERT INTO events VALUES (NULL, 'no offset')")
    with pytest.raises(ConfigError) as refused:
        source.latest_offsets(["0"])
    message = str(refused.value)
    assert "option 'offsetColumns'" in message and "NULL in the offset column(s) id" in message
    assert "NOT NULL" in message and "WHERE NOT (id IS NULL)" in message, message
    source.close()
