"""The operators' in-doubt command: list a job's prepared transactions with their decisions,
settle them by hand (commit the decided, roll back the rest), refuse while the job runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from epochal_jdbc import JdbcSink

from epochal import JobConfig
from epochal.control.job_requests import submit
from epochal.ops.indoubt import main
from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.state.jobs import JobDirectory
from epochal.testing import prepare_transaction
from epochal_sdk import ConnectorContext, Options, Prepared
from epochal_sdk.ids import transaction_prefix
from epochal_sdk.schema import Field
from integration.harness.plugin import PostgresDatabase

pytestmark = pytest.mark.integration

SCHEMA = (Field("key", "string"), Field("value", "string"))
JOB, SINK_ID = "opsjob", "jdbc-ops"


def _prepare(sink: JdbcSink, batch: int, key: str, incarnation: str = "") -> Prepared:
    task = ConnectorContext(JOB, SINK_ID, batch, 0, 0, SCHEMA, run=1, incarnation=incarnation)
    return prepare_transaction(sink, task, pa.record_batch({"key": [key], "value": [key]}))


def _args(action: str, db: PostgresDatabase, snapshots: Path) -> list[str]:
    """The job's JDBC sink is not in its store (no run recorded it): named by its connector
    and its options, the password among them given on the command line, never recorded."""
    return [action, JOB, "--snapshot-dir", str(snapshots), "--connector", "jdbc",
            "-o", f"url={db.dsn}", "-o", "table=out"]  # fmt: skip


def test_list_and_settle_in_doubt_transactions(
    postgres_db: PostgresDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots = tmp_path / "snapshots"
    sink = JdbcSink(Options("jdbc", {"url": postgres_db.dsn, "table": "out", "createTable": "1"}))
    sink.check(SCHEMA)
    jobdir = submit(JOB, "nowhere:job", JobConfig(snapshot_dir=str(snapshots)))
    incarnation = jobdir.load().incarnation  # the job's transactions carry it
    decided = _prepare(sink, 1, "decided", incarnation)
    undecided = _prepare(sink, 2, "undecided", incarnation)
    prefix = transaction_prefix(JOB, SINK_ID, incarnation)
    TwoPhaseCommit(jobdir.store, sink, SINK_ID, prefix).decide(1, [decided])

    assert main(_args("list", postgres_db, snapshots)) == 0
    listed = capsys.readouterr().out
    assert f"{decided.transaction_id}  batch 1" in listed and "decided: commit" in listed
    assert f"{undecided.transaction_id}  batch 2" in listed and "undecided: roll back" in listed

    JobDirectory(str(snapshots), JOB).lease.acquire("a-live-supervisor")
    assert main(_args("settle", postgres_db, snapshots)) == 2
    assert "settling now would roll back" in capsys.readouterr().err

    assert main([*_args("settle", postgres_db, snapshots), "--force"]) == 0
    assert "finished 1 decided batch(es) [1], rolled back 1" in capsys.readouterr().out
    with postgres_db.connect() as conn:
        assert conn.execute("SELECT key FROM out").fetchall() == [("decided",)]
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
    assert main(_args("list", postgres_db, snapshots)) == 0
    assert "no in-doubt transactions" in capsys.readouterr().out
    sink.close()
