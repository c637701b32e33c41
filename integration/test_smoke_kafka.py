"""Smoke tests: the Kafka broker is real and transactions behave as connectors need."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from integration.harness.kafka import KafkaCluster, KafkaServer

pytestmark = pytest.mark.integration

DEADLINE = 60.0


def _producer(server: KafkaServer, transactional_id: str) -> Producer:
    producer = Producer(server.client_config(**{"transactional.id": transactional_id}))
    producer.init_transactions(DEADLINE)
    return producer


def _transaction(producer: Producer, topic: str, values: list[str], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode())
    if commit:
        producer.commit_transaction(DEADLINE)
    else:
        producer.flush(DEADLINE)  # make sure the records reach the log before aborting
        producer.abort_transaction(DEADLINE)


def _consume_until(server: KafkaServer, topic: str, isolation: str, last: str) -> list[str]:
    """Read partition 0 from the start until the record ``last`` arrives (with a deadline)."""
    consumer = Consumer(
        server.client_config(
            **{
                "group.id": f"smoke-{uuid.uuid4().hex}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
            }
        )
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[str] = []
    deadline = time.monotonic() + DEADLINE
    try:
        while last not in values:
            assert time.monotonic() < deadline, f"{last!r} not consumed in time; got {values}"
            message: Any = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value().decode())
    finally:
        consumer.close()
    return values


def test_transactions_commit_abort_and_isolation(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    """read_committed sees only committed transactions; read_uncommitted sees aborted ones too."""
    producer = _producer(kafka_server, f"smoke-{uuid.uuid4().hex}")
    _transaction(producer, kafka_topic, ["c1", "c2"], commit=True)
    _transaction(producer, kafka_topic, ["a1"], commit=False)
    _transaction(producer, kafka_topic, ["end"], commit=True)

    assert _consume_until(kafka_server, kafka_topic, "read_committed", "end") == ["c1", "c2", "end"]
    assert _consume_until(kafka_server, kafka_topic, "read_uncommitted", "end") == [
        "c1",
        "c2",
        "a1",
        "end",
    ]


def test_second_producer_with_same_transactional_id_fences_the_first(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    """init_transactions by a new instance fences the old one: its next commit fails fatally."""
    transactional_id = f"fence-{uuid.uuid4().hex}"
    first = _producer(kafka_server, transactional_id)
    first.begin_transaction()
    first.produce(kafka_topic, b"zombie")
    first.flush(DEADLINE)

    second = _producer(kafka_server, transactional_id)
    _transaction(second, kafka_topic, ["fresh"], commit=True)

    with pytest.raises(KafkaException) as raised:
        first.produce(kafka_topic, b"zombie-2")
        first.commit_transaction(DEADLINE)
    error: KafkaError = raised.value.args[0]
    fenced = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    assert error.fatal() or error.code() in fenced, error
    assert _consume_until(kafka_server, kafka_topic, "read_committed", "fresh") == ["fresh"]


def test_committed_record_survives_kill_and_restart(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    """kill -9 of the broker loses no committed (acks=all, transactional) record."""
    kafka_server.require_faults()
    producer = _producer(kafka_server, f"durable-{uuid.uuid4().hex}")
    _transaction(producer, kafka_topic, ["durable"], commit=True)
    # commit_transaction() returns once the commit is decided; the COMMIT markers reach the
    # partition asynchronously. Wait until they did, so the kill hits a fully settled state
    # (see docs/contributing/testing.md: a kill in between can leave the partition's LSO stuck).
    assert _consume_until(kafka_server, kafka_topic, "read_committed", "durable") == ["durable"]
    producer.flush(DEADLINE)

    kafka_server.kill()
    assert not kafka_server.running
    kafka_server.start()

    assert _consume_until(kafka_server, kafka_topic, "read_committed", "durable") == ["durable"]


def test_cluster_keeps_committed_data_when_the_leader_is_killed(
    kafka_cluster: KafkaCluster,
) -> None:
    """3 nodes, RF 3: killing a partition leader loses no committed record; writes go on."""
    topic = kafka_cluster.create_topic(f"it-cluster-{uuid.uuid4().hex[:10]}", replication_factor=3)
    producer = _producer(kafka_cluster, f"cluster-{uuid.uuid4().hex}")
    _transaction(producer, topic, ["before"], commit=True)
    assert _consume_until(kafka_cluster, topic, "read_committed", "before") == ["before"]

    leader_id = (
        kafka_cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    )
    leader = kafka_cluster.node_by_id(leader_id)
    leader.kill()
    _transaction(producer, topic, ["after"], commit=True)
    assert _consume_until(kafka_cluster, topic, "read_committed", "after") == ["before", "after"]

    leader.start()
    kafka_cluster.delete_topic(topic)
