"""A password rotated between a commit decision and phase 2: the job's driver is killed right
after it recorded batch 2's commit decision (``sink.after_decision``), before any of the
batch's prepared transactions was committed; while the job is down, the sink's role gets a
new password (``ALTER ROLE``); the job is resumed with the new password in its ``url``.

A part's id leaves its secrets out, so the resumed sink has the same id: its recovery finds
batch 2's decision and the transactions prepared under it, and commits them with the new
password; the replayed batch 2 writes nothing again. 0 lost, 0 duplicated, nothing left
prepared. (With the password in the id, the resumed sink would be a new part: the old
prepared transactions would stay prepared, holding their rows and locks, for good.)
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest

from epochal import Job, JobConfig, JobStatus
from epochal.base.fault_plan import FaultPlan
from epochal.pipelines import SPEC_ENV
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_map.testing import MapSourceUnderTest
from integration.harness.plugin import PostgresDatabase

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RECORDS = 500
PER_BATCH = 100
KILL = "sink.after_decision@2:driver"


def _role_url(db: PostgresDatabase, role: str, password: str) -> str:
    """``db``'s URL for ``role`` logging in with ``password``."""
    info = psycopg.conninfo.conninfo_to_dict(db.dsn)
    return (
        f"postgresql://{quote(role)}:{quote(password)}@{info['host']}:{info['port']}/"
        f"{quote(str(info['dbname']))}"
    )


def _spec(monkeypatch: pytest.MonkeyPatch, source: MapSourceUnderTest, url: str) -> None:
    sink = {"url": url, "table": "output", "mode": "transactional", "createTable": "true"}
    spec = {
        "source": "map",
        "source_options": {**source.options(), "maxRecordsPerBatch": str(PER_BATCH)},
        "sink": "jdbc",
        "sink_options": sink,
        "id_expr": source.id_expr,
    }
    monkeypatch.setenv(SPEC_ENV, json.dumps(spec))


def test_a_password_rotated_between_a_decision_and_phase_2_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_db: PostgresDatabase
) -> None:
    role = f"rotated_{uuid.uuid4().hex[:8]}"
    before, after = f"pw-{uuid.uuid4().hex}", f"pw-{uuid.uuid4().hex}"
    with postgres_db.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{before}'")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {role}")
    try:
        _rotate(tmp_path, monkeypatch, postgres_db, role, before, after)
    finally:  # roles outlive the test's database: drop it (best effort, on failure too)
        with contextlib.suppress(psycopg.Error), postgres_db.connect() as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchall():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
            conn.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def _rotate(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_db: PostgresDatabase,
    role: str,
    before: str,
    after: str,
) -> None:
    source = MapSourceUnderTest(tmp_path / "source.sqlite")
    source.produce(range(RECORDS))
    sink = JdbcSinkUnderTest(postgres_db.dsn)  # the superuser's independent reader
    _spec(monkeypatch, source, _role_url(postgres_db, role, before))
    config = JobConfig(
        snapshot_dir=str(tmp_path / "snapshots"),
        available_now=True,
        auto_restart=False,  # the job stays down after the kill, until it is resumed
        master=LOCAL,
        spark_conf=dict(TEST_SPARK_CONF),
        faults=KILL,
    )
    job = Job.submit("rotation", "epochal.pipelines:copy", config)
    killed = job.join(600)
    assert killed.status == JobStatus.FAILED and "killed by signal" in str(killed.failure)
    fired = FaultPlan.parse(KILL, job.jobdir.layout.faults).fired()
    assert fired == [KILL], fired
    assert sink.in_doubt(), "the kill left no transaction of batch 2 prepared"

    with postgres_db.connect() as conn:
        conn.execute(f"ALTER ROLE {role} PASSWORD '{after}'")
    with pytest.raises(psycopg.OperationalError):  # the old password is gone
        psycopg.connect(_role_url(postgres_db, role, before), connect_timeout=5).close()
    _spec(monkeypatch, source, _role_url(postgres_db, role, after))
    started = time.monotonic()
    record = job.resume().join(600)
    assert record.status == JobStatus.COMPLETED, record.failure

    protocol = (Path(job.jobdir.logs) / "protocol.log").read_text()
    assert "finished 1 decided batch(es) [2]" in protocol, protocol
    counts = Counter(int(key) for key, _ in sink.committed("transactional"))
    assert sorted(counts) == list(range(RECORDS)), "lost records"
    assert [k for k, n in counts.items() if n > 1] == [], "duplicated records"
    assert sink.in_doubt() == [], "transactions left prepared"
    for path in Path(tmp_path / "snapshots").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert before.encode() not in data and after.encode() not in data, path
    print(f"resumed and finished in {time.monotonic() - started:.1f}s")
