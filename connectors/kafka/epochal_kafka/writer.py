"""The at-least-once side of the sink (``mode=idempotent``): :class:`KafkaWriter`, one task's
records through the idempotent producer (a replayed batch is written again)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from confluent_kafka import Producer

from epochal_kafka.records import RecordProducing, SinkSettings
from epochal_sdk import IdempotentWriter, RestartableError

if TYPE_CHECKING:
    import pyarrow


class KafkaWriter(RecordProducing, IdempotentWriter):
    """One task's records through the idempotent producer (at-least-once). The producer is
    created at once, so that it connects and gets its producer id while the task reads."""

    def __init__(self, sink: SinkSettings) -> None:
        super().__init__(sink)
        self.producer = Producer({**sink.producer_config(None), "on_delivery": self._on_delivery})

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Produce the rows."""
        if batch.num_rows:
            self._produce(batch)

    def flush(self) -> None:
        """Wait until every record is acknowledged by the brokers (acks=all)."""
        if self.producer is None:
            return
        left = self.producer.flush(self.sink.timeout)
        self._raise_delivery_errors()
        if left:
            raise RestartableError(
                f"kafka sink: {left} record(s) not acknowledged within {self.sink.timeout:g}s"
            )

    def close(self) -> None:
        """Drop the producer."""
        self.producer = None
