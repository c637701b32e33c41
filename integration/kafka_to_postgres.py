"""The Kafka → PostgreSQL exactly-once query that the Spark Connect and YARN tests run
without a supervisor, and the independent reader that counts what it wrote.

Records are ``id-<nnnnn>`` keys; the sink's table ``events`` has one row per committed
record, so a lost record is a missing id and a duplicate an id seen twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from integration.harness.kafka import KafkaServer
from integration.harness.plugin import PostgresDatabase

TABLE = "events"


def record_id(i: int) -> str:
    """The key of the ``i``-th record."""
    return f"id-{i:05d}"


def produce(kafka: KafkaServer, topic: str, ids: Iterable[int], partitions: int = 3) -> None:
    """Write records ``ids`` (idempotent producer, all acknowledged) over ``partitions``."""
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config(acks="all", **{"enable.idempotence": True}))
    failures: list[Any] = []
    for i in ids:
        producer.produce(
            topic,
            key=record_id(i),
            value=f"event {i}",
            partition=i % partitions,
            on_delivery=lambda err, _msg: failures.append(err) if err else None,
        )
    assert producer.flush(30) == 0, "records still unsent after 30s"
    assert not failures, failures


def start(
    session: Any,
    kafka: KafkaServer,
    topic: str,
    db: PostgresDatabase,
    job: dict[str, str],
    *,
    per_batch: int,
    trigger: dict[str, Any],
    checkpoint: str | None = None,
) -> Any:
    """Start the query in ``session`` (classic or Spark Connect) with the job in ``job``
    (the ``epochal.*`` options); the checkpoint defaults to ``<snapshot dir>/checkpoint``."""
    events = (
        session.readStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("maxRecordsPerBatch", str(per_batch))
        .options(**job)
        .load()
    )
    rows = events.selectExpr("CAST(key AS STRING) AS id", "CAST(value AS STRING) AS payload")
    return (
        rows.writeStream.format("epochal.jdbc")
        .option("url", db.dsn)
        .option("table", TABLE)
        .option("createTable", "true")
        .option("mode", "transactional")
        .options(**job)
        .option("checkpointLocation", checkpoint or job["epochal.snapshotDir"] + "/checkpoint")
        .trigger(**trigger)
        .start()
    )


def table(db: PostgresDatabase) -> Counter[str]:
    """How often each id is in the table (an independent reader)."""
    with db.connect() as conn:
        if conn.execute(f"SELECT to_regclass('{TABLE}')").fetchone()[0] is None:
            return Counter()
        return Counter(row[0] for row in conn.execute(f"SELECT id FROM {TABLE}"))


def prepared(db: PostgresDatabase) -> list[str]:
    """The transactions left prepared in the database."""
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
    return [row[0] for row in rows]


def assert_exactly_once(db: PostgresDatabase, records: int) -> None:
    """Every record ``0 .. records-1`` in the table once, nothing left prepared."""
    found = table(db)
    expected = {record_id(i) for i in range(records)}
    assert set(found) == expected, f"lost: {sorted(expected - set(found))[:10]}"
    assert [key for key, n in found.items() if n > 1] == [], "duplicates in the table"
    assert prepared(db) == [], "transactions left prepared"
