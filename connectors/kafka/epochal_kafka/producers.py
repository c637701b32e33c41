"""The transactional producers a Python worker keeps across tasks (the sink's producer pool):
:class:`PooledProducer`, :class:`ProducerPool` and this worker's :data:`WORKER_POOL`, the key
that tells client configurations apart, and ``init_transactions()`` in short retried calls."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer

from epochal_kafka.common import kafka_error

POOL_SIZE = 8
"""How many idle transactional producers one Python worker process keeps (least recently
used ones beyond that are closed)."""
INIT_STEP = 0.05
"""Seconds per ``init_transactions()`` call while it is retried (see
:func:`init_transactions`)."""

ConfigKey = tuple[tuple[str, str], ...]
"""A client configuration as a hashable, comparable key (see :func:`client_config_key`)."""


def client_config_key(config: dict[str, Any]) -> ConfigKey:
    """``config`` as a key: clients kept per configuration are found (and told apart) by it."""
    return tuple(sorted((str(k), str(v)) for k, v in config.items()))


@dataclass(eq=False)
class PooledProducer:
    """A transactional producer that a Python worker keeps across tasks: one per
    ``transactional.id`` (and client configuration). ``instance`` names it in the markers it
    commits; ``committed`` remembers the last batch it committed per query, because the marker
    of a commit that just returned may not be readable yet (the broker writes the transaction
    markers after it answered)."""

    transactional_id: str
    config_key: ConfigKey
    producer: Producer | None = None
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    committed: dict[str, int] = field(default_factory=dict)
    errors: list[Any] = field(default_factory=list)
    """Delivery errors of the task using it now (each task brings its own list)."""
    in_transaction: bool = False
    disrupted: str = ""
    """The first client error librdkafka reported (lost connection, brokers down, ...):
    such a producer is not used again. After a broker restart a kept producer may still
    know the group coordinator of before, and librdkafka's ``send_offsets_to_transaction``
    can then wait forever, ignoring its time-out (librdkafka issues 5456, 5511)."""

    def on_delivery(self, error: Any, message: Any) -> None:
        """Delivery report callback (errors only: ``delivery.report.only.error``)."""
        if error is not None:
            self.errors.append((error, message.topic(), message.partition()))

    def on_error(self, error: Any) -> None:
        """librdkafka's error callback (served by ``poll``)."""
        if not self.disrupted:
            self.disrupted = str(error)

    def usable(self) -> bool:
        """Serve the events queued while it was idle; usable if none was an error."""
        if self.producer is None:
            return False
        self.producer.poll(0)
        return not self.disrupted


class ProducerPool:
    """The idle transactional producers of one Python worker process, by
    ``transactional.id``. Spark reuses Python workers (``spark.python.worker.reuse``), so
    a producer taken by a task and given back when it ends cleanly serves the next task of
    this worker that writes the same Spark partition. Thread-safe; a producer is owned by
    one task between :meth:`take` and :meth:`give_back`."""

    def __init__(self, size: int = POOL_SIZE) -> None:
        self.size = size
        self.created = 0
        """Producers made (and ``init_transactions()`` calls) by tasks using this pool."""
        self._idle: OrderedDict[str, PooledProducer] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, transactional_id: str, config_key: Any) -> PooledProducer | None:
        """The idle producer of this id (removed from the pool), if there is one."""
        with self._lock:
            held = self._idle.pop(transactional_id, None)
        if held is not None and held.config_key != config_key:
            return None  # other client settings: dropped (a new producer fences it anyway)
        return held

    def give_back(self, held: PooledProducer) -> None:
        """Keep ``held`` (no transaction open) for the next task of its id."""
        if held.in_transaction or held.producer is None:
            return
        with self._lock:
            self._idle.pop(held.transactional_id, None)
            self._idle[held.transactional_id] = held
            while len(self._idle) > self.size:
                self._idle.popitem(last=False)

    def drop(self, transactional_ids: Any) -> None:
        """Forget the idle producers of these ids (they were fenced)."""
        with self._lock:
            for transactional_id in transactional_ids:
                self._idle.pop(transactional_id, None)

    def idle(self) -> list[str]:
        """The ids with an idle producer, least recently used first."""
        with self._lock:
            return list(self._idle)


WORKER_POOL = ProducerPool()
"""This Python worker's producers (module state: it lives as long as the worker process)."""


def init_transactions(producer: Producer, timeout: float) -> None:
    """``init_transactions()`` in short calls, retried until ``timeout``. When librdkafka
    finds the transaction coordinator's connection not up yet, it asks again for a producer
    id only after 500 ms, unless something wakes it; each new call does. Measured in Spark
    tasks: a single call took 500+ ms for most new producers, short calls about 60 ms."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            producer.init_transactions(min(INIT_STEP, max(deadline - time.monotonic(), 0.001)))
            return
        except KafkaException as exc:
            if not kafka_error(exc).retriable() or time.monotonic() >= deadline:
                raise
