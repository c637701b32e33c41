"""The Kafka sink's produce loop over an Arrow batch (``RecordProducing._produce``), on a real
librdkafka producer with no broker behind it: the records stay in its local queue until their
delivery times out, which is all these checks need (what was queued, in which order)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from epochal_kafka.records import RecordProducing

from epochal_sdk import PoisonRecordError

NOWHERE = "127.0.0.1:9"
"""The discard port: nothing listens, so nothing is ever delivered."""


def producing(queue: int, delivered: list[Any], **config: Any) -> RecordProducing:
    """A task's record producing to topic ``t`` whose local queue holds ``queue`` records;
    each record's delivery report (a time-out, 50 ms after it was queued) adds it to
    ``delivered``."""
    records = RecordProducing(SimpleNamespace(topic="t"))  # type: ignore[arg-type]
    records.producer = Producer(
        {
            "bootstrap.servers": NOWHERE,
            "queue.buffering.max.messages": queue,
            "message.timeout.ms": 50,
            "log_level": 0,
            "on_delivery": lambda error, message: delivered.append(
                (message.key(), message.value())
            ),
            **config,
        }
    )
    return records


def test_a_full_local_queue_loses_no_record_and_repeats_none() -> None:
    """25 records through a queue of 7: the loop waits for room three times and goes on from
    the record that was refused; every record is queued once, in the batch's order."""
    delivered: list[Any] = []
    records = producing(7, delivered)
    keys = [b"%d" % i for i in range(25)]
    values = [b"value-%d" % i for i in range(25)]
    records._produce(pa.record_batch({"key": pa.array(keys), "value": pa.array(values)}))
    assert records.producer is not None
    assert records.producer.flush(30) == 0
    assert delivered == list(zip(keys, values, strict=True))
    assert records.rows == 25


def test_a_batch_without_keys_is_produced_keyless() -> None:
    delivered: list[Any] = []
    records = producing(100, delivered)
    records._produce(pa.record_batch({"value": pa.array(["a", "b", "c"])}))
    assert records.producer is not None
    assert records.producer.flush(30) == 0
    assert delivered == [(None, b"a"), (None, b"b"), (None, b"c")]


def test_a_record_too_large_is_a_poison_record_named_by_its_row() -> None:
    """The fourth record is over ``message.max.bytes``: the error names row 3 of the task
    (counted over its batches: one batch of two went before)."""
    delivered: list[Any] = []
    records = producing(100, delivered, **{"message.max.bytes": 1000})
    records._produce(pa.record_batch({"value": pa.array([b"a", b"b"])}))
    batch = pa.record_batch({"value": pa.array([b"c", b"x" * 2000, b"d"])})
    with pytest.raises(PoisonRecordError, match=r"row 3 of this task \(topic 't'\)"):
        records._produce(batch)
