"""Spark jobs with the PostgreSQL sink: the server stopped in the middle of an exactly-once
run, a server without prepared transactions refused at submit, a bad record failing the job
with its table and batch."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest

from epochal import Job, JobConfig, JobStatus
from epochal.pipelines import SPEC_ENV
from epochal.state.locks import JobError
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_map.testing import MapSourceUnderTest
from integration.harness.plugin import PostgresDatabase
from integration.harness.postgres import LocalPostgres, PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _spec(monkeypatch: pytest.MonkeyPatch, source: MapSourceUnderTest, sink: dict) -> None:
    spec = {
        "source": "map",
        "source_options": {**source.options(), "maxRecordsPerBatch": "100"},
        "sink": "jdbc",
        "sink_options": sink,
        "id_expr": source.id_expr,
    }
    monkeypatch.setenv(SPEC_ENV, json.dumps(spec))


def _config(tmp_path: Path, **changes: object) -> JobConfig:
    settings: dict[str, object] = {
        "snapshot_dir": str(tmp_path / "snapshots"),
        "available_now": True,
        "restart_backoff": 0.2,
        "max_restart_backoff": 1.0,
        "master": LOCAL,
        "spark_conf": dict(TEST_SPARK_CONF),
    }
    settings.update(changes)
    return JobConfig(**settings)  # type: ignore[arg-type]


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def _count(db: PostgresDatabase) -> int:
    with db.connect() as conn:
        if conn.execute("SELECT to_regclass('output')").fetchone()[0] is None:
            return 0
        return int(conn.execute("SELECT count(*) FROM output").fetchone()[0])


def _copy_job_under_way(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: PostgresDatabase
) -> tuple[Job, JdbcSinkUnderTest]:
    """A map → PostgreSQL exactly-once copy of 3 000 records, submitted and seen committing."""
    source = MapSourceUnderTest(tmp_path / "source.sqlite")
    source.produce(range(3000))
    sink = JdbcSinkUnderTest(db.dsn)
    _spec(monkeypatch, source, sink.options("transactional"))
    job = Job.submit(name, "epochal.pipelines:copy", _config(tmp_path))
    _wait(lambda: _count(db) >= 200, 600, "the first batches to commit")
    return job, sink


def _each_record_once(sink: JdbcSinkUnderTest) -> None:
    """Every one of the 3 000 records committed once, nothing left prepared."""
    counts = Counter(int(key) for key, _ in sink.committed("transactional"))
    assert sorted(counts) == list(range(3000)), "lost records"
    assert [k for k, n in counts.items() if n > 1] == [], "duplicated records"
    assert sink.in_doubt() == []


FROZEN_SECONDS = 20.0
"""How long the frozen server stays frozen (the fault's length)."""


def test_postgres_frozen_mid_run_loses_and_doubles_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: PostgresServer,
    postgres_db: PostgresDatabase,
) -> None:
    """The server frozen while the job writes (its container paused, a local server
    SIGSTOPped: every connection open and silent, transactions prepared or half-written in
    it) for :data:`FROZEN_SECONDS`, then let go: the job finishes, nothing lost or doubled,
    nothing left prepared."""
    postgres_server.require_faults()
    job, sink = _copy_job_under_way("pg-frozen", tmp_path, monkeypatch, postgres_db)
    postgres_server.pause()
    try:
        time.sleep(FROZEN_SECONDS)  # the fault's length, not a wait for something
    finally:
        postgres_server.unpause()
    record = job.join(900)
    assert record.status == JobStatus.COMPLETED, record.failure
    _each_record_once(sink)


def test_postgres_stopped_mid_run_restarts_the_job_with_nothing_lost_or_doubled(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: PostgresServer,
    postgres_db: PostgresDatabase,
) -> None:
    postgres_server.require_faults()
    job, sink = _copy_job_under_way("pg-restart", tmp_path, monkeypatch, postgres_db)
    postgres_server.stop()
    try:
        # Two restarts: the run that lost the server, then a restart that met it still down
        # at its start (that must restart again, not fail the job as a bad address).
        _wait(
            lambda: job.status().restarts >= 2 or job.status().status.finished,
            600,
            "the job to notice the lost server and to restart without it",
        )
    finally:
        postgres_server.start()
    record = job.join(900)
    assert record.status == JobStatus.COMPLETED, record.failure
    assert record.restarts >= 2, "the job never lost the server"
    _each_record_once(sink)


@pytest.fixture
def no_prepared_server() -> Iterator[str]:
    """A second private PostgreSQL with ``max_prepared_transactions = 0``."""
    local = LocalPostgres("postgres-no-2pc", max_prepared_transactions=0)
    try:
        local.start()
        yield local.dsn
    finally:
        local.close()


def test_exactly_once_without_prepared_transactions_is_refused_unless_downgraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prepared_server: str
) -> None:
    source = MapSourceUnderTest(tmp_path / "source.sqlite")
    source.produce(range(100))
    sink = JdbcSinkUnderTest(no_prepared_server)
    _spec(monkeypatch, source, sink.options("transactional"))
    refused = Job.submit("no-2pc", "epochal.pipelines:copy", _config(tmp_path)).join(600)
    assert refused.status == JobStatus.FAILED
    assert refused.restarts == 0
    assert "GuaranteeError" in refused.failure and "connector 'jdbc'" in refused.failure
    assert "at-least-once" in refused.failure and "allow the downgrade" in refused.failure
    assert sink.committed("transactional") == []

    allowed = Job.submit(
        "no-2pc-allowed",
        "epochal.pipelines:copy",
        _config(tmp_path, allow_downgrade=True),
    ).join(600)
    assert allowed.status == JobStatus.COMPLETED, allowed.failure
    assert sorted(int(k) for k, _ in sink.committed("transactional")) == list(range(100))


def test_a_bad_record_fails_the_job_naming_table_and_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_db: PostgresDatabase
) -> None:
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE output (key text, value text CHECK (value <> '150'))")
    source = MapSourceUnderTest(tmp_path / "source.sqlite")
    source.produce(range(300))
    sink = JdbcSinkUnderTest(postgres_db.dsn)
    _spec(monkeypatch, source, sink.options("transactional"))
    record = Job.submit("poison", "epochal.pipelines:copy", _config(tmp_path)).join(600)
    assert record.status == JobStatus.FAILED
    assert record.restarts == 0
    assert "PoisonRecordError" in record.failure
    assert "table output (batch 1" in record.failure and "output_value_check" in record.failure
    written = [int(k) for k, _ in sink.committed("transactional")]
    assert len(set(written)) == len(written) == 100 and 150 not in written  # batch 0 only
    assert sink.in_doubt() == []


def test_a_killed_job_cancelled_leaves_nothing_prepared_and_its_name_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_db: PostgresDatabase
) -> None:
    """Killed before batch 1's decision (its transactions PREPAREd in PostgreSQL, holding
    locks), then cancelled: the cancel rolls them back before it deletes the snapshots. The
    same name then runs again from scratch: its transaction ids (of a new incarnation) are
    not the first job's, so batch 0, committed by the first job, commits again."""
    source = MapSourceUnderTest(tmp_path / "source.sqlite")
    source.produce(range(300))
    sink = JdbcSinkUnderTest(postgres_db.dsn)
    # the secret stays out of records, and reaches a warm driver started before this test
    secret = tmp_path / "pg-url"
    secret.write_text(postgres_db.dsn)
    secret.chmod(0o600)
    _spec(monkeypatch, source, {**sink.options("transactional"), "url": f"${{file:{secret}}}"})
    killed = _config(tmp_path, faults="sink.before_decision@1", max_restarts=0)
    job = Job.submit("reusepg", "epochal.pipelines:copy", killed)
    assert job.join(600).status == JobStatus.FAILED
    first = Counter(int(key) for key, _ in sink.committed("transactional"))
    assert sum(first.values()) == len(first) == 100  # batch 0
    assert sink.in_doubt() != []  # batch 1, prepared

    hidden = tmp_path / "pg-url.away"
    secret.rename(hidden)  # PostgreSQL cannot be reached: refused
    with pytest.raises(JobError, match="in-doubt settle reusepg") as refused:
        job.cancel()
    hidden.rename(secret)
    prefix = sink.in_doubt()[0].rsplit(".", 4)[0]  # the job's, still prepared
    assert f"its prepared transactions {prefix}.* could not be settled" in str(refused.value)
    assert job.cancel().status == JobStatus.CANCELLED
    assert sink.in_doubt() == []

    again = Job.submit("reusepg", "epochal.pipelines:copy", _config(tmp_path)).join(600)
    assert again.status == JobStatus.COMPLETED, again.failure
    counts = Counter(int(key) for key, _ in sink.committed("transactional"))
    assert sorted(counts) == list(range(300)), "lost records"
    # the second job wrote every record once; the first job's batch 0 stays as it committed
    assert {k: n - first[k] for k, n in counts.items()} == dict.fromkeys(range(300), 1)
    assert sink.in_doubt() == []
