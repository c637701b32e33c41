"""Spark's own JVM Kafka source as the conformance kit drives it: a topic read with
``format("kafka")`` (``spark-sql-kafka-0-10``, from the harness cache:
``integration/bench/kafka_bench.py: spark_kafka_jars()``) instead of ``epochal.kafka``.

The kit's drivers keep their usual session profile (so the kit's warm drivers serve them):
the kit's pipelines add the connector's jars to the running session (``ADD JAR``) from the
source option :data:`epochal.pipelines.SOURCE_JARS_OPTION`.
"""

from __future__ import annotations

from typing import Any

import pytest
from epochal_kafka.testing import KafkaSourceUnderTest

from epochal.pipelines import SOURCE_JARS_OPTION
from epochal.spark import ordered_kafka
from integration.bench.kafka_bench import spark_kafka_jars
from integration.harness.kafka import KafkaServer


class SparkKafkaSourceUnderTest(KafkaSourceUnderTest):
    """A topic read by Spark's Kafka source: from the earliest offsets, ``read_committed``
    (the topic holds aborted transactions that repeat IDs), at most ``per_batch`` records a
    batch (``maxOffsetsPerTrigger``; Spark ignores the kit's ``maxRecordsPerBatch``)."""

    format = "kafka"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        per_batch: int,
        jars: list[str],
        route_by_key: bool = False,
        ordered_jar: str | None = None,
    ) -> None:
        super().__init__(bootstrap, topic, partitions)
        self.per_batch, self.route_by_key = per_batch, route_by_key
        self.jars = [*jars, ordered_jar] if ordered_jar else jars
        if ordered_jar:
            self.format = ordered_kafka.FORMAT

    def options(self) -> dict[str, str]:
        return {
            **super().options(),
            "startingOffsets": "earliest",
            "kafka.isolation.level": "read_committed",
            "maxOffsetsPerTrigger": str(self.per_batch),
            SOURCE_JARS_OPTION: ",".join(self.jars),
        }


@pytest.fixture(scope="session")
def kafka_jars() -> list[str]:
    """Spark's Kafka connector jars (fetched into the harness cache once, by Maven)."""
    return spark_kafka_jars()


def spark_kafka_source(
    server: KafkaServer,
    topic: str,
    jars: list[str],
    per_batch: int = 50,
    route_by_key: bool = False,
    ordered_jar: str | None = None,
    partitions: int = 3,
) -> SparkKafkaSourceUnderTest:
    """``topic`` of ``server`` (3 partitions unless said) as Spark's Kafka source under test
    (its rows routed by key before the sink when ``route_by_key``; read as ``kafka-ordered``,
    from the provider in ``ordered_jar``, when one is given)."""
    return SparkKafkaSourceUnderTest(
        server.bootstrap_servers, topic, partitions, per_batch, jars, route_by_key, ordered_jar
    )


def kafka_source_spec(source: SparkKafkaSourceUnderTest) -> dict[str, Any]:
    """The source half of a kit pipeline spec (:mod:`epochal.pipelines`) for ``source``."""
    return {
        "source": "kafka",
        "source_format": source.format,
        "source_options": source.options(),
        "id_expr": source.id_expr,
    }
