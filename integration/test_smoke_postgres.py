"""Smoke tests: the PostgreSQL server is real and two-phase commit behaves as connectors need."""

from __future__ import annotations

import uuid

import pytest

from integration.harness.plugin import PostgresDatabase
from integration.harness.postgres import PostgresServer

pytestmark = pytest.mark.integration


def _prepare(db: PostgresDatabase, gid: str, value: int) -> None:
    """Insert ``value`` in a transaction, PREPARE it as ``gid`` and close the connection."""
    with db.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t (v) VALUES (%s)", (value,))
        conn.execute(f"PREPARE TRANSACTION '{gid}'")


def _prepared_gids(db: PostgresDatabase) -> set[str]:
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
    return {gid for (gid,) in rows}


def _values(db: PostgresDatabase) -> list[int]:
    with db.connect() as conn:
        return [v for (v,) in conn.execute("SELECT v FROM t ORDER BY v").fetchall()]


def test_prepared_transaction_survives_disconnect_and_restart(
    postgres_server: PostgresServer, postgres_db: PostgresDatabase
) -> None:
    """PREPARE TRANSACTION outlives its connection and a restart; then it can be settled."""
    postgres_server.require_faults()
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE t (v int NOT NULL)")
    keep, drop = f"keep-{uuid.uuid4().hex}", f"drop-{uuid.uuid4().hex}"
    _prepare(postgres_db, keep, 1)
    _prepare(postgres_db, drop, 2)
    assert _prepared_gids(postgres_db) == {keep, drop}
    assert _values(postgres_db) == []

    postgres_server.restart()

    assert _prepared_gids(postgres_db) == {keep, drop}
    with postgres_db.connect() as conn:
        conn.execute(f"COMMIT PREPARED '{keep}'")
        conn.execute(f"ROLLBACK PREPARED '{drop}'")
    assert _prepared_gids(postgres_db) == set()
    assert _values(postgres_db) == [1]


def test_committed_row_and_prepared_transaction_survive_kill(
    postgres_server: PostgresServer, postgres_db: PostgresDatabase
) -> None:
    """kill -9 of the postmaster loses neither a committed row nor a prepared transaction."""
    postgres_server.require_faults()
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE t (v int NOT NULL)")
        conn.execute("INSERT INTO t (v) VALUES (10)")
    gid = f"kill-{uuid.uuid4().hex}"
    _prepare(postgres_db, gid, 20)

    postgres_server.kill()
    assert not postgres_server.running
    postgres_server.start()

    assert _values(postgres_db) == [10]
    assert _prepared_gids(postgres_db) == {gid}
    with postgres_db.connect() as conn:
        conn.execute(f"COMMIT PREPARED '{gid}'")
    assert _values(postgres_db) == [10, 20]
