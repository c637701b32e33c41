"""The Kafka connector: a replayable source over topics and a sink into a topic."""

from __future__ import annotations

from epochal_kafka.common import CLIENT_PREFIX, bootstrap_servers
from epochal_kafka.sink import KafkaSink
from epochal_kafka.source import KafkaSource
from epochal_sdk import Connector, Options


class KafkaConnector(Connector):
    """``format("epochal.kafka")``: Apache Kafka (confluent-kafka / librdkafka)."""

    name = "kafka"
    description = (
        "Apache Kafka: replayable source (read_committed) and exactly-once sink "
        "(transactions) or at-least-once sink (idempotent producer)."
    )
    source_class = KafkaSource
    sink_class = KafkaSink
    source_options = frozenset(
        {
            "bootstrapServers",
            "subscribe",
            "subscribePattern",
            "startingOffsets",
            "startingTimestamp",
            "maxOffsetsPerTrigger",
            "minPartitions",
            "failOnDataLoss",
            "readTimeoutMs",
            "metadataTimeoutMs",
        }
    )
    sink_options = frozenset(
        {
            "bootstrapServers",
            "topic",
            "mode",
            "markerTopic",
            "transactionTimeoutMs",
            "snapshotIntervalMs",
            "expectedRecoveryMs",
            "timeoutMs",
        }
    )
    option_prefixes = (CLIENT_PREFIX,)
    target_options = ("kafka.bootstrap.servers", "subscribe", "subscribePattern", "topic")

    def target(self, options: Options, kind: str) -> dict[str, str]:
        """The brokers (``kafka.bootstrap.servers`` or its alias ``bootstrapServers``) and the
        topic (a sink's ``topic``; a source's ``subscribe`` or ``subscribePattern``)."""
        found = {"bootstrap.servers": bootstrap_servers(options)}
        names = ("topic",) if kind == "sink" else ("subscribe", "subscribePattern")
        for name in names:
            value = options.str(name, "").strip()
            if value:
                found[name] = value
        return found
