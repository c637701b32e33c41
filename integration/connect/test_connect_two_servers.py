"""Two Spark Connect servers started on the same job: one runs it, the other is refused
until the first is gone, then takes it over; exactly-once Kafka → PostgreSQL throughout.

No supervisor is involved: each server's driver holds the job's lease itself
(:mod:`epochal.control.lease_keeper`). Server A runs the query continuously. The same query started
on server B waits out A's lease (A keeps renewing it) and is refused with a message naming
A. A is then killed (SIGKILL, as a lost machine): B's next start takes the job over at once
(A's JVM is provably gone) and finishes it. An independent reader of the table sees every
Kafka record exactly once, and no transaction is left prepared.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from epochal.state.jobs import JobDirectory
from integration import kafka_to_postgres
from integration.harness.kafka import KafkaServer
from integration.harness.plugin import PostgresDatabase
from integration.harness.spark_connect import SparkConnectServer, start_spark_connect

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RECORDS = 400
PER_BATCH = 50
LEASE_TTL = 4.0


def _start(
    session: Any,
    kafka: KafkaServer,
    topic: str,
    db: PostgresDatabase,
    job: dict,
    *,
    available_now: bool,
) -> Any:
    trigger = {"availableNow": True} if available_now else {"processingTime": "500 milliseconds"}
    return kafka_to_postgres.start(
        session, kafka, topic, db, job, per_batch=PER_BATCH, trigger=trigger
    )


@pytest.mark.kafka_topic(partitions=3)
def test_two_servers_on_one_job_one_runs_it_the_other_takes_over_when_it_is_gone(
    spark_connect_server: SparkConnectServer,
    kafka_server: KafkaServer,
    kafka_topic: str,
    postgres_db: PostgresDatabase,
    tmp_path: Path,
) -> None:
    snapshots = str(tmp_path / "snapshots")
    job = {
        "epochal.job": "two-servers",
        "epochal.snapshotDir": snapshots,
        "epochal.leaseTtl": str(LEASE_TTL),
    }
    kafka_to_postgres.produce(kafka_server, kafka_topic, range(RECORDS // 2))
    first = spark_connect_server.session()
    _start(first, kafka_server, kafka_topic, postgres_db, job, available_now=False)
    deadline = time.monotonic() + 180
    while sum(kafka_to_postgres.table(postgres_db).values()) < RECORDS // 2:
        assert time.monotonic() < deadline, "server A did not commit the first records"
        time.sleep(0.2)
    holder = JobDirectory(snapshots, "two-servers").lease.read()
    assert holder is not None and holder.live

    other = start_spark_connect()
    try:
        with other.sessions() as second:
            started = time.monotonic()
            refused = _start(
                second, kafka_server, kafka_topic, postgres_db, job, available_now=True
            )
            with pytest.raises(Exception, match="is run by another driver") as raised:
                refused.awaitTermination(120)
            waited = time.monotonic() - started
            assert f"pid {holder.pid}" in str(raised.value)
            assert waited >= LEASE_TTL - 1, f"refused after {waited:.1f}s, before A's TTL"
            assert JobDirectory(snapshots, "two-servers").lease.read().pid == holder.pid

            kafka_to_postgres.produce(kafka_server, kafka_topic, range(RECORDS // 2, RECORDS))
            spark_connect_server.kill()  # server A is lost (SIGKILL)
            with contextlib.suppress(Exception):  # its session died with it
                first.stop()
            started = time.monotonic()
            query = _start(second, kafka_server, kafka_topic, postgres_db, job, available_now=True)
            assert query.awaitTermination(300), "B's query did not finish within 300s"
            assert query.exception() is None, query.exception()
            print(f"B took over and finished in {time.monotonic() - started:.1f}s")
    finally:
        other.backend.close()
        spark_connect_server.start()

    lease = JobDirectory(snapshots, "two-servers").lease.read()
    assert lease is not None and lease.epoch == 2 and lease.pid != holder.pid
    kafka_to_postgres.assert_exactly_once(postgres_db, RECORDS)
