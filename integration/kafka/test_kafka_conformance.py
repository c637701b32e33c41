"""The conformance kit on the Kafka connector with the real broker: every crash point of the
replayable source (with the map sink) and of the Kafka sink (with the map source), under
exactly-once and at-least-once. Each case kills the driver or an executor with SIGKILL,
restarts, and counts lost/duplicated records by ID through an independent reader
(``read_committed`` for the sink; the source topic holds aborted transactions repeating IDs)."""

from __future__ import annotations

import pytest
from epochal_kafka.testing import KafkaSinkUnderTest, KafkaSourceUnderTest

from epochal.testing import ConformanceSuite, Scenario
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest
from epochal_sdk import Guarantee
from tests.lane import FULL

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class TestKafkaSourceConformance(ConformanceSuite):
    """Kafka topic (3 partitions) → Spark → map sink (transactional)."""

    source_contract = "replayable"
    sink_modes = ("transactional",)
    scope = "source"
    # The replayable-source protocol is the same at both guarantees; the map suite runs it at
    # both, here every source crash point runs exactly-once.
    guarantees = (Guarantee.EXACTLY_ONCE,)
    records = 150
    records_per_batch = 50
    aggregate = False  # Kafka → aggregation → Kafka runs in test_kafka_jobs.py
    real_failures = False  # they run once per connector: in the sink suite
    source_connector = "kafka"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, kafka_source: KafkaSourceUnderTest) -> KafkaSourceUnderTest:
        return kafka_source

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink


class TestKafkaSinkConformance(ConformanceSuite):
    """Map journal → Spark → Kafka topic (2 partitions), in transactional mode (exactly-once
    and at-least-once jobs) and idempotent mode (at-least-once only: the idempotent producer
    cannot keep exactly-once, and an exactly-once job refuses it with a GuaranteeError)."""

    sink_modes = ("transactional", "idempotent")
    scope = "sink"
    records = 150
    records_per_batch = 50
    aggregate = False  # Kafka → aggregation → Kafka runs in test_kafka_jobs.py
    session_failures = False  # per contract: the map suite's transactional sink runs them
    graceful_stop = FULL  # CI's lane: the map suite's real- and session-failures stop gracefully
    source_connector = "map"
    sink_connector = "kafka"

    @classmethod
    def cases(cls) -> list[Scenario]:
        return [
            c
            for c in super().cases()
            if not (c.mode == "idempotent" and c.guarantee == Guarantee.EXACTLY_ONCE)
        ]

    @pytest.fixture
    def epochal_source(self, epochal_map_source: MapSourceUnderTest) -> MapSourceUnderTest:
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, kafka_sink: KafkaSinkUnderTest) -> KafkaSinkUnderTest:
        return kafka_sink
