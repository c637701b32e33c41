"""The Kafka connector: a replayable source over topics and a sink into a topic."""

from __future__ import annotations

from epochal_kafka.sink import KafkaSink
from epochal_kafka.source import KafkaSource
from epochal_sdk import Connector


class KafkaConnector(Connector):
    """``format("epochal.kafka")``: Apache Kafka (confluent-kafka / librdkafka)."""

    name = "kafka"
    description = (
        "Apache Kafka: replayable source (read_committed) and exactly-once sink "
        "(transactions) or at-least-once sink (idempotent producer)."
    )
    source_class = KafkaSource
    sink_class = KafkaSink
