"""epochal-kafka: Apache Kafka as a replayable source and a transactional or idempotent sink.

* :class:`KafkaSource`: offsets per ``topic:partition`` live in Spark's offset log; a batch
  re-reads exactly its offset range (``read_committed`` by default).
* :class:`KafkaSink`: ``mode=transactional`` (exactly-once, one Kafka transaction per Spark
  partition per batch, with a batch marker committed in the same transaction) or
  ``mode=idempotent`` (at-least-once, idempotent producer).
"""

from epochal_kafka.connector import KafkaConnector
from epochal_kafka.sink import KafkaSink
from epochal_kafka.source import KafkaSource

__all__ = ["KafkaConnector", "KafkaSink", "KafkaSource"]
