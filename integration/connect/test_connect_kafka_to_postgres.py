"""Spark Connect: an exactly-once Kafka → PostgreSQL query started by a Spark Connect client.

The client (``spark_connect_server.session()``) never imports epochal and never registers
anything: ``format("epochal.kafka")`` and ``format("epochal.jdbc")`` resolve on the server,
whose Python finds the installed ``pyspark_epochal_*`` packages (Spark-native discovery).
The query carries its job through options (``epochal.job``, ``epochal.snapshotDir``), as a
query started without ``epochal run`` does; no supervisor is involved (see
docs/how-to/spark-connect.md).

The crash: a driver crash point right after the commit decision of batch 1 kills the whole
Spark Connect server (the server is the driver) with SIGKILL, with the batch's transactions
prepared in PostgreSQL and not yet committed. The server is started again and a new client
session starts the same query on the same checkpoint: the recovery at query start commits
the decided transactions, the replay of batch 1 writes nothing, and an independent reader
of the table sees every Kafka record exactly once, with no prepared transaction left.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from epochal.parts.job_context import JobContext
from integration import kafka_to_postgres
from integration.harness.kafka import KafkaServer
from integration.harness.plugin import PostgresDatabase
from integration.harness.spark_connect import SparkConnectServer

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RECORDS = 300
PER_BATCH = 100
CRASH = "sink.after_decision@1"


def _start(session: Any, kafka: KafkaServer, topic: str, db: PostgresDatabase, job: dict) -> Any:
    """The client's query: plain PySpark over Spark Connect, with the job in options."""
    return kafka_to_postgres.start(
        session, kafka, topic, db, job, per_batch=PER_BATCH, trigger={"availableNow": True}
    )


@pytest.mark.kafka_topic(partitions=3)
def test_exactly_once_kafka_to_postgres_over_spark_connect_across_a_server_kill(
    spark_connect_server: SparkConnectServer,
    kafka_server: KafkaServer,
    kafka_topic: str,
    postgres_db: PostgresDatabase,
    tmp_path: Path,
) -> None:
    spark_connect_server.require_faults()
    kafka_to_postgres.produce(kafka_server, kafka_topic, range(RECORDS))
    job = {
        "epochal.job": "connect-eo",
        "epochal.snapshotDir": str(tmp_path / "snapshots"),
        "epochal.faults": CRASH,
    }

    first = spark_connect_server.session()
    _start(first, kafka_server, kafka_topic, postgres_db, job)
    # The crash point kills the server: wait for that on this machine (no client calls to a
    # server that is going away), with a deadline.
    spark_connect_server.wait_stopped(timeout=300)
    fired = JobContext.current(job).faults.fired()
    assert fired == [CRASH], f"the server died, but not at the crash point (fired: {fired})"
    committed_before = kafka_to_postgres.table(postgres_db)
    assert 0 < sum(committed_before.values()) < RECORDS, committed_before
    assert kafka_to_postgres.prepared(postgres_db), "batch 1 was decided: it must be prepared"

    spark_connect_server.start()
    first.stop()  # its session died with the old server; nothing to release
    with spark_connect_server.sessions() as second:
        started = time.monotonic()
        query = _start(second, kafka_server, kafka_topic, postgres_db, job)
        assert query.awaitTermination(300), "the restarted query did not finish within 300s"
        assert query.exception() is None, query.exception()
        print(f"restarted query finished in {time.monotonic() - started:.1f}s")

    kafka_to_postgres.assert_exactly_once(postgres_db, RECORDS)


def test_register_from_a_connect_client_works_beside_the_discovered_formats(
    spark_connect_server: SparkConnectServer, tmp_path: Path
) -> None:
    """``epochal.register(spark)`` also works over Spark Connect (for a server whose Python
    does not discover the formats itself), and does not clash with the discovered ones."""
    import epochal
    from epochal_map import MapStore

    with MapStore(str(tmp_path / "journal.sqlite")) as store:
        store.append_events("events", [("1", "one")])
    with spark_connect_server.sessions() as session:
        discovered = (
            session.readStream.format("epochal.map")
            .option("path", str(tmp_path / "journal.sqlite"))
            .option("map", "events")
            .load()
        )
        assert "key" in discovered.columns and "value" in discovered.columns
        assert "epochal.map" in epochal.register(session)
        registered = (
            session.readStream.format("epochal.map")
            .option("path", str(tmp_path / "journal.sqlite"))
            .option("map", "events")
            .load()
        )
        assert registered.columns == discovered.columns


def test_a_refusal_at_start_reaches_the_connect_client_with_epochals_message(
    spark_connect_server: SparkConnectServer, postgres_db: PostgresDatabase, tmp_path: Path
) -> None:
    """An at-least-once sink (jdbc ``mode=plain``) in an exactly-once query is refused when
    the query starts on the server; the client sees epochal's ``GuaranteeError``."""
    from epochal_map import MapStore

    journal = str(tmp_path / "journal.sqlite")
    with MapStore(journal) as store:
        store.append_events("events", [("1", "one")])
    job = {"epochal.job": "refused", "epochal.snapshotDir": str(tmp_path / "snapshots")}
    with spark_connect_server.sessions() as session:
        query = (
            session.readStream.format("epochal.map")
            .option("path", journal)
            .option("map", "events")
            .options(**job)
            .load()
            .writeStream.format("epochal.jdbc")
            .option("url", postgres_db.dsn)
            .option("table", "refused")
            .option("createTable", "true")
            .option("mode", "plain")
            .options(**job)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="GuaranteeError") as raised:
            query.awaitTermination(120)
        assert "Refusing to start" in str(raised.value)
    with postgres_db.connect() as conn:
        assert conn.execute("SELECT to_regclass('refused')").fetchone()[0] is None
