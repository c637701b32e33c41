"""The sink's records: the columns it writes (:data:`COLUMN_TYPES`) and
:class:`RecordProducing`, which turns Arrow record batches into produce calls (topic,
partition, headers) and collects delivery errors, for both the transaction and the
at-least-once writer."""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import length_hint
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import KafkaException, Producer

from epochal_kafka.common import is_transient
from epochal_sdk import PoisonRecordError, RestartableError

if TYPE_CHECKING:
    import pyarrow

    from epochal_kafka.producers import ProducerPool
    from epochal_sdk import ConnectorContext

COLUMN_TYPES = {
    "value": ("string", "binary"),
    "key": ("string", "binary"),
    "topic": ("string",),
    "partition": ("int", "bigint", "smallint", "tinyint"),
    "headers": (
        "array<struct<key:string,value:binary>>",
        "array<struct<key:string,value:string>>",
        "map<string,binary>",
        "map<string,string>",
    ),
}
"""The columns the sink writes and the Spark SQL type names (without spaces) each may have."""


class SinkSettings(Protocol):
    """What a task's transaction and writer read of their sink
    (:class:`~epochal_kafka.sink.KafkaSink`): its client configuration, topics, timeout,
    producer pool and the producer settings and transactional id of a task."""

    config: dict[str, Any]
    topic: str | None
    marker_topic: str | None
    timeout: float
    pool: ProducerPool

    def transactional_id(self, task: ConnectorContext) -> str: ...

    def producer_config(self, transactional_id: str | None) -> dict[str, Any]: ...


class RecordProducing:
    """Turns Arrow batches into produce calls and collects delivery errors (the base of a
    task's :class:`~epochal_kafka.transaction.KafkaTransaction` and
    :class:`~epochal_kafka.writer.KafkaWriter`)."""

    def __init__(self, sink: SinkSettings) -> None:
        self.sink = sink
        self.producer: Producer | None = None
        self.rows = 0
        self.errors: list[Any] = []

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append((error, message.topic(), message.partition()))

    def _raise_delivery_errors(self) -> None:
        if not self.errors:
            return
        error, topic, partition = self.errors[0]
        text = (
            f"kafka sink: {len(self.errors)} record(s) were not delivered; first to "
            f"{topic}[{partition}]: {error}"
        )
        if is_transient(error):
            raise RestartableError(text)
        raise RuntimeError(text)

    def _produce(self, batch: pyarrow.RecordBatch) -> None:
        producer = self.producer
        assert producer is not None
        names = batch.schema.names
        count = batch.num_rows
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in names else None
        topics = batch.column("topic").to_pylist() if "topic" in names else None
        partitions = batch.column("partition").to_pylist() if "partition" in names else None
        headers = batch.column("headers").to_pylist() if "headers" in names else None
        default = self.sink.topic
        produce = producer.produce
        if topics is None and partitions is None and headers is None:  # fast path
            self._produce_plain(producer, default, values, keys)
            self.rows += count
            producer.poll(0)
            return
        for i in range(count):
            topic = topics[i] if topics is not None and topics[i] is not None else default
            kwargs: dict[str, Any] = {}
            if partitions is not None and partitions[i] is not None:
                kwargs["partition"] = partitions[i]
            if headers is not None and headers[i] is not None:
                kwargs["headers"] = _headers(headers[i])
            key = keys[i] if keys is not None else None
            while True:
                try:
                    produce(topic, values[i], key, **kwargs)
                    break
                except BufferError:  # local queue full: serve delivery reports, then retry
                    producer.poll(0.05)
                except (KafkaException, TypeError) as exc:
                    raise self._poison(i, topic, exc) from None
        self.rows += count
        producer.poll(0)

    def _produce_plain(
        self, producer: Producer, topic: Any, values: list[Any], keys: list[Any] | None
    ) -> None:
        """Key and value only, to one topic, in the columns' order. The ``produce`` calls run
        in one C-level loop over the columns' values (``map``), with no Python code per
        record; a record refused for a full local queue is produced again once delivery
        reports made room, and the loop goes on from the next one."""
        produce = producer.produce
        values_left = iter(values)
        keys_left = iter(keys) if keys is not None else repeat(None)
        while True:
            try:
                deque(map(produce, repeat(topic), values_left, keys_left), maxlen=0)
                return
            except BufferError:  # local queue full: serve delivery reports, then retry it
                index = len(values) - length_hint(values_left) - 1
                key = keys[index] if keys is not None else None
                while True:
                    producer.poll(0.05)
                    try:
                        produce(topic, values[index], key)
                        break
                    except BufferError:
                        continue
                    except (KafkaException, TypeError) as exc:
                        raise self._poison(index, topic, exc) from None
            except (KafkaException, TypeError) as exc:
                index = len(values) - length_hint(values_left) - 1
                raise self._poison(index, topic, exc) from None

    def _poison(self, index: int, topic: Any, exc: Exception) -> PoisonRecordError:
        """The error of the task's row ``index`` of this batch that cannot be produced."""
        return PoisonRecordError(
            f"kafka sink: row {self.rows + index} of this task (topic {topic!r}) cannot be "
            f"produced: {exc}. Fix or filter the record (size limits: message.max.bytes / "
            "max.request.size)."
        )


def _headers(value: Any) -> list[tuple[str, Any]]:
    """Headers from a list of ``{"key", "value"}`` structs or a map (list of pairs)."""
    if isinstance(value, dict):
        return list(value.items())
    return [(h["key"], h["value"]) if isinstance(h, dict) else tuple(h) for h in value]
