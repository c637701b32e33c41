"""Fixtures of the Kafka connector's integration tests: topics and the kit's adapters."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from epochal_kafka.marker import MARKERS
from epochal_kafka.testing import KafkaSinkUnderTest, KafkaSourceUnderTest

from integration.harness.kafka import KafkaServer


@pytest.fixture(scope="session", autouse=True)
def _marker_readers_closed_before_the_broker_stops(kafka_server: KafkaServer) -> Iterator[None]:
    """The sink's marker consumers that the tests of this process made are closed before
    the session's broker stops (they would log failed reconnections until the process ends)."""
    yield
    MARKERS.close()


@pytest.fixture
def make_topic(kafka_server: KafkaServer) -> Iterator[Any]:
    """A factory of fresh topics (``make_topic(partitions=1, config=None)``), deleted after."""
    made: list[str] = []

    def make(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"it-kafka-{uuid.uuid4().hex[:12]}"
        kafka_server.create_topic(name, partitions=partitions, config=config)
        made.append(name)
        return name

    yield make
    if kafka_server.running:
        for name in made:
            kafka_server.delete_topic(name, timeout=10)


@pytest.fixture
def kafka_source(kafka_server: KafkaServer, make_topic: Any) -> KafkaSourceUnderTest:
    """A 3-partition topic as the kit's source (with aborted transactions in it)."""
    return KafkaSourceUnderTest(kafka_server.bootstrap_servers, make_topic(3), 3)


@pytest.fixture
def kafka_sink(kafka_server: KafkaServer, make_topic: Any) -> KafkaSinkUnderTest:
    """A 2-partition topic as the kit's sink."""
    return KafkaSinkUnderTest(kafka_server.bootstrap_servers, make_topic(2))
