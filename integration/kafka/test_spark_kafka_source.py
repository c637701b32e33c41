"""The fast path into epochal's exactly-once sinks, proven by the conformance kit: Spark's own
JVM Kafka source (``format("kafka")``, records never through a Python worker) into the JDBC
two-phase-commit sink and into the Kafka exactly-once sink, with the real broker and the
real PostgreSQL server.

Into the Kafka sink, Spark's source is read in order (``format("kafka-ordered")``, epochal's
provider of Spark's Kafka source that plans every batch's partitions in one order), with no
routing between. For each sink, exactly-once: every crash point of the sink's two-phase
commit (the process that performs the step killed there) and the whole driver killed after a
batch; into the JDBC sink also the real failures, supervised (the supervisor killed and the
job resumed from another process; the driver paused past its lease while another takes over,
then resumed; random kills). 0 lost, 0 duplicated (counted by record ID through an
independent reader), nothing left prepared. The plain-session failures are not run again
here: the JDBC sink's own suite runs them (epochal's Kafka source), and how Spark's source
replays a batch does not depend on who restarts the driver. Spark's source replays a batch
from the offsets in its checkpoint; epochal's sink decides each batch once: together,
exactly-once.

The topic holds aborted transactions that repeat IDs, so the source reads
``read_committed``. What the sinks' own suites check without Spark (their contract checks)
and at-least-once are not run again here.
"""

from __future__ import annotations

from typing import Any

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest
from epochal_kafka.testing import KafkaSinkUnderTest

from epochal.spark import ordered_kafka
from epochal.testing import ConformanceSuite
from epochal_sdk import Guarantee
from integration.harness.kafka import KafkaServer
from integration.kafka.spark_kafka import (
    SparkKafkaSourceUnderTest,
    kafka_jars,  # noqa: F401 - a fixture
    spark_kafka_source,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class _FromSparksKafkaSource(ConformanceSuite):
    """Spark's Kafka source (3 partitions, 50 records a batch) into the sink under test."""

    scope = "sink"
    sink_modes = ("transactional",)
    guarantees = (Guarantee.EXACTLY_ONCE,)
    records = 150
    records_per_batch = 50
    aggregate = False  # Spark state between the two does not change either protocol
    contract_checks = False  # the sinks' own suites run them (no Spark, no source)
    session_failures = (
        False  # the JDBC sink's own suite runs them; the replay is Spark's either way
    )
    source_connector = "spark:kafka"
    ordered_jar: str | None = None
    """The ordered provider's jar: the source is read with ``format("kafka-ordered")``."""

    @pytest.fixture
    def epochal_source(
        self,
        kafka_server: KafkaServer,
        make_topic: Any,
        kafka_jars: list[str],  # noqa: F811
    ) -> SparkKafkaSourceUnderTest:
        return spark_kafka_source(
            kafka_server,
            make_topic(3),
            kafka_jars,
            self.records_per_batch,
            ordered_jar=self.ordered_jar,
        )


class TestSparkKafkaSourceIntoJdbc(_FromSparksKafkaSource):
    """Spark's Kafka source → Spark → PostgreSQL table, two-phase commit."""

    sink_connector = "jdbc (from spark:kafka)"

    @pytest.fixture
    def epochal_sink(self, epochal_jdbc_sink: JdbcSinkUnderTest) -> JdbcSinkUnderTest:
        return epochal_jdbc_sink


class TestSparkKafkaSourceIntoKafka(_FromSparksKafkaSource):
    """Spark's Kafka source read in order (``format("kafka-ordered")``,
    :mod:`epochal.spark.ordered_kafka`) → Kafka topic (2 partitions), transactional, no
    routing: every crash point of the sink, and the whole driver after a batch.

    The sink commits each Spark partition's Kafka transaction in ``prepare`` and a replay skips
    the partitions whose marker is there, so a replay must give each Spark partition the rows
    it had. Spark's own ``format("kafka")`` plans a replayed batch from its offset log,
    listing the topic's partitions in another order than the live plan did, so straight into
    this sink it is refused; the ordered provider plans both in one order
    (``test_spark_kafka_parts.py`` kills the whole driver after the first task of a batch
    committed with the provider, and with the rows routed by key instead; and the order of a
    replayed batch's partitions with the provider and with Spark's own). Not the real
    failures (random kills of the whole driver): the JDBC class runs
    them."""

    sink_connector = "kafka (from spark:kafka-ordered)"
    source_connector = "spark:kafka-ordered"
    real_failures = False
    ordered_jar = ordered_kafka.jar()

    @pytest.fixture
    def epochal_sink(self, kafka_sink: KafkaSinkUnderTest) -> KafkaSinkUnderTest:
        return kafka_sink
