"""The Kafka connector under epochal's conformance kit: a :class:`KafkaSourceUnderTest` and a
:class:`KafkaSinkUnderTest` for any broker address, plus an independent ``read_committed``
reader (:func:`read_to_end`) and a lingering-transaction probe (:func:`unstable_partitions`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from epochal.testing import SinkUnderTest, SourceUnderTest

QUIET = {"log_level": 3}


def read_to_end(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60.0
) -> list[Any]:
    """Every record of ``topic`` an independent consumer sees, reading each partition from
    the start to its high watermark. Under ``read_committed`` a lingering transaction keeps
    the last stable offset below the high watermark: that fails here after ``timeout``."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"epochal-check-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **QUIET,
        }
    )
    out: list[Any] = []
    try:
        for number in sorted(partitions):
            tp = TopicPartition(topic, number)
            high = _latest(admin, tp, IsolationLevel.READ_UNCOMMITTED)
            consumer.assign([TopicPartition(topic, number, 0)])
            deadline = time.monotonic() + timeout
            while True:
                position = consumer.position([tp])[0].offset
                if high == 0 or position >= high:
                    break
                if time.monotonic() > deadline:
                    stable = _latest(admin, tp, IsolationLevel.READ_COMMITTED)
                    raise AssertionError(
                        f"{topic}[{number}]: read_committed reader stuck at {position}, high "
                        f"watermark {high}, last stable offset {stable}: a transaction lingers"
                    )
                message = consumer.poll(0.2)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                out.append(message)
    finally:
        consumer.close()
    return out


def _latest(admin: AdminClient, tp: TopicPartition, isolation: Any) -> int:
    futures = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation)
    return next(iter(futures.values())).result().offset


def unstable_partitions(bootstrap: str, topic: str) -> list[str]:
    """Partitions whose last stable offset is below the high watermark: an open (lingering)
    transaction holds them."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    out = []
    for number in sorted(partitions):
        tp = TopicPartition(topic, number)
        high = _latest(admin, tp, IsolationLevel.READ_UNCOMMITTED)
        stable = _latest(admin, tp, IsolationLevel.READ_COMMITTED)
        if stable < high:
            out.append(f"{topic}[{number}] LSO {stable} < HW {high}")
    return out


def produce_ids(
    bootstrap: str, topic: str, ids: Sequence[int], partitions: int, *, aborted: bool = True
) -> None:
    """Write records ``key = value = str(id)`` round-robin over ``partitions``, in committed
    transactions interleaved with aborted ones that carry the same IDs (a reader that does not
    skip aborted records reports duplicates)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"it-{uuid.uuid4().hex}", **QUIET}
    )
    producer.init_transactions(60)
    chunk = 50
    for low in range(0, len(ids), chunk):
        part = ids[low : low + chunk]
        producer.begin_transaction()
        for i in part:
            producer.produce(topic, str(i).encode(), str(i).encode(), partition=i % partitions)
        producer.commit_transaction(60)
        if aborted:
            producer.begin_transaction()
            for i in part[:5]:
                producer.produce(topic, str(i).encode(), b"aborted", partition=i % partitions)
            producer.flush(60)
            producer.abort_transaction(60)


class KafkaSourceUnderTest(SourceUnderTest):
    """A topic as a replayable source: record IDs are the values (aborted transactions in the
    topic repeat IDs, so reading them would show up as duplicates)."""

    connector = "kafka"
    id_expr = "CAST(CAST(value AS STRING) AS BIGINT)"

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions

    def options(self) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap, "subscribe": self.topic}

    def produce(self, ids: Sequence[int]) -> None:
        produce_ids(self.bootstrap, self.topic, ids, self.partitions)


class KafkaSinkUnderTest(SinkUnderTest):
    """A topic as a sink, read back by an independent ``read_committed`` consumer to the end
    of every partition. ``in_doubt`` lists partitions held by a lingering transaction."""

    connector = "kafka"
    types = ()  # the sink writes only its own columns (key, value, headers ...): none of the kit's

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic

    def options(self, mode: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap, "topic": self.topic, "mode": mode}

    def committed(self, mode: str) -> list[tuple[str, str]]:
        return [
            (m.key().decode() if m.key() is not None else "", m.value().decode())
            for m in read_to_end(self.bootstrap, self.topic)
        ]

    def in_doubt(self) -> list[str]:
        return unstable_partitions(self.bootstrap, self.topic)
