"""The PostgreSQL sink against the real server, without Spark: two-phase commit, upserts,
checks at submit, bad records, a lost server, and a server without prepared transactions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from epochal_jdbc import JdbcError, JdbcSink, TableName

from epochal.testing import prepare_transaction
from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Guarantee,
    Options,
    PoisonRecordError,
    Prepared,
    RecoveryScope,
    RestartableError,
    SchemaMismatchError,
)
from epochal_sdk.schema import Field
from integration.harness.plugin import PostgresDatabase
from integration.harness.postgres import LocalPostgres, PostgresServer

pytestmark = pytest.mark.integration

SCHEMA = (Field("key", "string"), Field("value", "string"))


def _sink(db: PostgresDatabase, **options: str) -> JdbcSink:
    values = {"url": db.dsn, "table": "out", "createTable": "true", **options}
    return JdbcSink(Options("jdbc", values))


def _task(batch: int, partition: int = 0, attempt: int = 0, job: str = "j") -> ConnectorContext:
    return ConnectorContext(job, "jdbc-1", batch, partition, attempt, SCHEMA, run=1)


def _batch(*pairs: tuple[str | None, str | None]) -> pa.RecordBatch:
    keys, values = zip(*pairs, strict=True)
    return pa.record_batch({"key": pa.array(keys, pa.string()), "value": pa.array(values)})


def _rows(db: PostgresDatabase, table: str = "out") -> list[tuple[Any, ...]]:
    with db.connect() as conn:
        return conn.execute(f"SELECT key, value FROM {table} ORDER BY key, value").fetchall()


def _prepared(db: PostgresDatabase) -> list[str]:
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY gid"
        ).fetchall()
    return [gid for (gid,) in rows]


def _prepare(sink: JdbcSink, task: ConnectorContext, batch: pa.RecordBatch) -> Prepared:
    return prepare_transaction(sink, task, batch)


def test_two_phase_commit_is_invisible_until_committed_and_commit_is_idempotent(
    postgres_db: PostgresDatabase,
) -> None:
    sink = _sink(postgres_db)
    sink.check(SCHEMA)
    assert sink.max_guarantee() == Guarantee.EXACTLY_ONCE
    task = _task(3)
    prepared = _prepare(sink, task, _batch(("a", "1"), ("b", "2")))
    assert _rows(postgres_db) == []
    assert _prepared(postgres_db) == [str(task.txn)]
    assert [p.transaction_id for p in sink.in_doubt(RecoveryScope(task.transaction_prefix))] == [
        str(task.txn)
    ]
    assert sink.in_doubt(RecoveryScope("ep.other")) == []
    sink.commit(prepared)
    sink.commit(prepared)  # already committed: its marker says so
    assert _rows(postgres_db) == [("a", "1"), ("b", "2")]
    assert _prepared(postgres_db) == []
    sink.rollback(prepared)  # settled: nothing happens
    sink.rollback(Prepared("ep.j.jdbc-1.9.0.1.0"))  # unknown: nothing happens
    assert _rows(postgres_db) == [("a", "1"), ("b", "2")]
    sink.close()


def test_rollback_drops_a_prepared_transaction_and_an_empty_task_prepares_nothing(
    postgres_db: PostgresDatabase,
) -> None:
    sink = _sink(postgres_db)
    sink.check(SCHEMA)
    prepared = _prepare(sink, _task(1), _batch(("a", "1")))
    sink.rollback(prepared)
    empty = _prepare(sink, _task(1, partition=1), pa.record_batch({"key": [], "value": []}))
    assert empty.data == {"rows": 0}
    sink.commit(empty)
    assert _rows(postgres_db) == [] and _prepared(postgres_db) == []
    sink.close()


def test_committing_a_decided_transaction_rolled_back_by_hand_fails_loudly(
    postgres_db: PostgresDatabase,
) -> None:
    sink = _sink(postgres_db)
    sink.check(SCHEMA)
    prepared = _prepare(sink, _task(5), _batch(("a", "1")))
    with postgres_db.connect() as conn:
        conn.execute(f"ROLLBACK PREPARED '{prepared.transaction_id}'")
    with pytest.raises(JdbcError, match=r"neither prepared nor committed.*NOT in the table"):
        sink.commit(prepared)
    sink.close()


def test_upsert_replayed_twice_changes_nothing_and_the_last_record_of_a_key_wins(
    postgres_db: PostgresDatabase,
) -> None:
    sink = _sink(postgres_db, mode="idempotent", keyColumns="key")
    sink.check(SCHEMA)
    assert sink.sink_mode() == "idempotent"
    batch = _batch(("a", "1"), ("b", "2"), ("a", "3"))
    versions = []
    for _ in range(2):
        writer = sink.open(_task(1))
        writer.write(batch)
        writer.flush()
        writer.close()
        assert _rows(postgres_db) == [("a", "3"), ("b", "2")]
        with postgres_db.connect() as conn:
            versions.append(conn.execute("SELECT xmin::text FROM out ORDER BY key").fetchall())
    assert versions[0] == versions[1], "a replay rewrote rows whose values did not change"


def test_upsert_without_a_unique_index_on_the_key_is_refused_at_submit(
    postgres_db: PostgresDatabase,
) -> None:
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE out (key text, value text)")
    with pytest.raises(SchemaMismatchError, match=r"table out has no unique index.*\['key'\]"):
        _sink(postgres_db, mode="idempotent", keyColumns="key").check(SCHEMA)
    with pytest.raises(ConfigError, match="keyColumns"):
        _sink(postgres_db, mode="idempotent")


def test_missing_table_and_mismatched_columns_are_refused_at_submit(
    postgres_db: PostgresDatabase,
) -> None:
    with pytest.raises(SchemaMismatchError, match=r"table out does not exist.*createTable"):
        _sink(postgres_db, createTable="false").check(SCHEMA)
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE out (key text, value integer, extra text NOT NULL)")
    wide = (*SCHEMA, Field("flag", "boolean"))
    with pytest.raises(SchemaMismatchError) as error:
        _sink(postgres_db).check((Field("key", "string"), Field("value", "boolean"), wide[2]))
    message = str(error.value)
    assert "column 'value' is int4 but the records hold boolean" in message
    assert "column 'flag' (boolean) is missing" in message
    assert "column 'extra' (text) is NOT NULL without a default" in message


def test_create_table_maps_spark_types(postgres_db: PostgresDatabase) -> None:
    schema = tuple(
        Field(n, t)
        for n, t in [
            ("s", "string"),
            ("b", "bigint"),
            ("i", "int"),
            ("d", "double"),
            ("f", "boolean"),
            ("t", "timestamp"),
            ("y", "binary"),
            ("n", "decimal(10,2)"),
        ]
    )
    sink = JdbcSink(Options("jdbc", {"url": postgres_db.dsn, "table": "typed", "createTable": "1"}))
    sink.check(schema)
    with postgres_db.connect() as conn:
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'typed'"
            ).fetchall()
        )
    assert types == {
        "s": "text",
        "b": "bigint",
        "i": "integer",
        "d": "double precision",
        "f": "boolean",
        "t": "timestamp with time zone",
        "y": "bytea",
        "n": "numeric",
    }


def test_quoted_schema_qualified_table_names(postgres_db: PostgresDatabase) -> None:
    assert TableName.parse('"My Schema"."Out"') == TableName("My Schema", "Out")
    assert TableName.parse("Public.OUT") == TableName("public", "out")
    with pytest.raises(ConfigError, match="table"):
        TableName.parse("a.b.c")
    with postgres_db.connect() as conn:
        conn.execute('CREATE SCHEMA "My Schema"')
    sink = JdbcSink(
        Options(
            "jdbc", {"url": postgres_db.dsn, "table": '"My Schema"."Out"', "createTable": "true"}
        )
    )
    sink.check(SCHEMA)
    sink.commit(_prepare(sink, _task(1), _batch(("k", "v"))))
    with postgres_db.connect() as conn:
        assert conn.execute('SELECT key, value FROM "My Schema"."Out"').fetchall() == [("k", "v")]
        marker = conn.execute('SELECT count(*) FROM "My Schema".epochal_commits').fetchone()
    assert marker == (1,)
    sink.close()


@pytest.mark.parametrize("mode", ["transactional", "idempotent"])
def test_a_bad_record_names_table_and_batch_and_nothing_is_committed(
    postgres_db: PostgresDatabase, mode: str
) -> None:
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE out (key text PRIMARY KEY, value text CHECK (value <> 'bad'))")
    sink = _sink(postgres_db, mode=mode, keyColumns="key")
    sink.check(SCHEMA)
    writer = sink.begin(_task(7)) if mode == "transactional" else sink.open(_task(7))
    with pytest.raises(PoisonRecordError) as error:
        writer.write(_batch(("a", "1"), ("b", "bad"), ("c", "3")))
        writer.prepare() if mode == "transactional" else writer.flush()  # type: ignore[attr-defined]
    if mode == "transactional":
        writer.abort()  # type: ignore[attr-defined]
    writer.close()
    message = str(error.value)
    assert "table out" in message and "batch 7" in message and "check constraint" in message
    assert _rows(postgres_db) == [] and _prepared(postgres_db) == []


def test_a_lost_server_is_restartable_and_leaves_nothing_half_committed(
    postgres_server: PostgresServer, postgres_db: PostgresDatabase
) -> None:
    postgres_server.require_faults()
    sink = _sink(postgres_db)
    sink.check(SCHEMA)
    txn = sink.begin(_task(2))
    txn.write(_batch(("a", "1")))
    postgres_server.restart(hard=True)
    with pytest.raises(RestartableError, match=r"table out \(batch 2.*lost the connection"):
        txn.write(_batch(("b", "2")))
        txn.prepare()
    txn.abort()
    txn.close()
    assert _rows(postgres_db) == [] and _prepared(postgres_db) == []


def test_an_unreachable_server_at_start_is_a_config_error(postgres_db: PostgresDatabase) -> None:
    url = "postgresql://epochal:epochal@127.0.0.1:1/postgres"
    sink = JdbcSink(Options("jdbc", {"url": url, "table": "out"}))
    with pytest.raises(ConfigError, match=r"option 'url': cannot connect to PostgreSQL"):
        sink.check(SCHEMA)
    wrong = postgres_db.dsn.replace("epochal:epochal@", "epochal:wrong@")
    with pytest.raises(ConfigError, match="password authentication failed"):
        JdbcSink(Options("jdbc", {"url": wrong, "table": "out"})).check(SCHEMA)
    with pytest.raises(ConfigError, match="option 'url': is required"):
        JdbcSink(Options("jdbc", {"table": "out"})).check(SCHEMA)


@pytest.fixture(scope="module")
def no_prepared_server() -> Iterator[str]:
    """A second private PostgreSQL with ``max_prepared_transactions = 0``."""

    local = LocalPostgres("postgres-no-2pc", max_prepared_transactions=0)
    try:
        local.start()
        yield local.dsn
    finally:
        local.close()


def test_no_prepared_transactions_caps_the_sink_at_at_least_once(no_prepared_server: str) -> None:
    sink = JdbcSink(Options("jdbc", {"url": no_prepared_server, "table": "out2pc"}))
    assert sink.max_guarantee() == Guarantee.AT_LEAST_ONCE
    assert "max_prepared_transactions = 0" in sink.guarantee_reason()
    idempotent = JdbcSink(
        Options(
            "jdbc",
            {"url": no_prepared_server, "table": "o", "mode": "idempotent", "keyColumns": "key"},
        )
    )
    assert idempotent.max_guarantee() == Guarantee.EXACTLY_ONCE
    # Downgraded (the job allowed it): the task commits instead of preparing.
    create = JdbcSink(
        Options("jdbc", {"url": no_prepared_server, "table": "out2pc", "createTable": "true"})
    )
    create.check(SCHEMA)
    prepared = _prepare(create, _task(1), _batch(("a", "1")))
    assert prepared.data == {"rows": 1, "committed": True}
    create.commit(prepared)
    with contextlib.closing(psycopg.connect(no_prepared_server)) as conn:
        assert conn.execute("SELECT key, value FROM out2pc").fetchall() == [("a", "1")]
    plain = JdbcSink(Options("jdbc", {"url": no_prepared_server, "table": "x", "mode": "plain"}))
    assert plain.max_guarantee() == Guarantee.AT_LEAST_ONCE


def test_plain_mode_commits_in_the_task(postgres_db: PostgresDatabase) -> None:
    sink = _sink(postgres_db, mode="plain")
    assert sink.max_guarantee() == Guarantee.AT_LEAST_ONCE
    assert sink.sink_mode() == "transactional"
    sink.check(SCHEMA)
    prepared = _prepare(sink, _task(1), _batch(("a", "1")))
    assert prepared.data == {"rows": 1, "committed": True}
    assert _rows(postgres_db) == [("a", "1")] and _prepared(postgres_db) == []
    sink.commit(prepared)  # nothing left to do
    assert _rows(postgres_db) == [("a", "1")]
    sink.close()


def test_binary_and_nested_columns_take_the_row_by_row_copy(postgres_db: PostgresDatabase) -> None:
    schema = (Field("key", "string"), Field("raw", "binary"), Field("tags", "array<string>"))
    sink = JdbcSink(Options("jdbc", {"url": postgres_db.dsn, "table": "b", "createTable": "1"}))
    sink.check(schema)
    task = ConnectorContext("j", "jdbc-1", 1, 0, 0, schema, run=1)
    txn = sink.begin(task)
    txn.write(
        pa.record_batch(
            {
                "key": ["a", "b"],
                "raw": pa.array([b"\x00\xff", None], pa.binary()),
                "tags": pa.array([["x", "y"], []], pa.list_(pa.string())),
            }
        )
    )
    sink.commit(Prepared(str(task.txn), txn.prepare()))
    txn.close()
    with postgres_db.connect() as conn:
        rows = conn.execute("SELECT key, raw, tags::text FROM b ORDER BY key").fetchall()
    assert rows == [("a", b"\x00\xff", '["x", "y"]'), ("b", None, "[]")]
    sink.close()
