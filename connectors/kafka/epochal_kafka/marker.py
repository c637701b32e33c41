"""The batch marker of the exactly-once sink: its format (the committed offset of consumer
group ``<transactional.id>`` on ``(markerTopic, 0)``: ``batch + 1``, metadata
``<query id>;<producer instance>``), what it tells (:func:`last_written`,
:func:`superseded`), and the consumers a Python worker keeps to read, register and commit
it (:class:`MarkerReaders`, :data:`MARKERS`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from epochal_kafka.common import is_transient, kafka_error
from epochal_kafka.producers import PooledProducer, client_config_key
from epochal_sdk import RestartableError

REGISTERED = 0
"""Marker offset of a ``transactional.id`` that is known (so recovery fences it) but has not
committed a batch yet. A committed batch ``b`` is stored as ``b + 1``."""
MARKER_READERS = 16
"""How many marker consumers (one per ``transactional.id``) a Python worker keeps."""


@dataclass(frozen=True)
class Marker:
    """What a marker (the committed offset of group ``<transactional.id>``) says."""

    offset: int
    """``batch + 1`` of the last committed batch, ``REGISTERED`` or negative (none)."""
    query: str = ""
    """The Spark query id of the commit."""
    instance: str = ""
    """The producer instance that made the commit (see :class:`PooledProducer`)."""

    @classmethod
    def parse(cls, offset: int, metadata: str | None) -> Marker:
        """From an offset and its metadata ``<query id>;<instance>`` (older markers carry the
        query id only)."""
        query, _, instance = (metadata or "").partition(";")
        return cls(offset, query, instance)

    def written(self, query: str) -> int:
        """The last batch query ``query`` committed under this id (-1: none)."""
        return self.offset - 1 if self.offset > REGISTERED and self.query == query else -1


def batch_marker(marker_topic: str, batch_id: int, query: str, instance: str) -> TopicPartition:
    """The marker a transaction commits for batch ``batch_id`` (the offset ``batch + 1`` on
    ``(marker_topic, 0)``, metadata ``<query>;<instance>``: what :meth:`Marker.parse` reads)."""
    return TopicPartition(marker_topic, 0, batch_id + 1, metadata=f"{query};{instance}")


def last_written(marker: Marker, held: PooledProducer | None, query: str) -> int:
    """The last batch of ``query`` committed under an id (-1: none): the marker's, or the
    last commit of ``held`` if later (its marker may not be readable yet)."""
    written = marker.written(query)
    if held is not None:
        written = max(written, held.committed.get(query, -1))
    return written


def superseded(marker: Marker, held: PooledProducer, query: str) -> bool:
    """Whether another producer of ``held``'s id committed after ``held`` last did (so its
    ``init_transactions()`` fenced ``held``): the marker names another instance and a later
    batch of this query than ``held`` committed. A marker that is merely not readable yet,
    or one of another query, does not tell: the kept producer is tried, and
    ``send_offsets_to_transaction`` refuses it if it was fenced."""
    return (
        marker.instance != held.instance
        and marker.query == query
        and marker.written(query) > held.committed.get(query, -1)
    )


class MarkerReaders:
    """The marker consumers of one Python worker: one ``Consumer`` per marker group (=
    ``transactional.id``) and client configuration, kept like the producers. It never
    subscribes (never joins its group): it reads the group's committed offset (the marker),
    commits ``REGISTERED`` for a new id, and hands out the group metadata that
    ``send_offsets_to_transaction`` needs (that of a member-less consumer). A consumer
    rather than the admin client: librdkafka's admin ``ListConsumerGroupOffsets`` crashes
    the process (SIGSEGV in ``rd_kafka_cgrp_op``, observed with librdkafka 2.16.0) when the
    group coordinator answers with a coordinator error, as a new cluster's does at first."""

    def __init__(self, size: int = MARKER_READERS) -> None:
        self.size = size
        self._consumers: OrderedDict[tuple[Any, str], Consumer] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, config: dict[str, Any], group: str) -> Consumer:
        """The consumer of ``group`` (made on first use)."""
        key = (client_config_key(config), group)
        evicted = []
        with self._lock:
            consumer = self._consumers.pop(key, None)
            if consumer is None:
                consumer = Consumer(
                    {
                        **config,
                        "group.id": group,
                        "enable.auto.commit": False,
                        # committed offsets only: no wait for offsets pending in an open
                        # transaction (OffsetFetch without require_stable)
                        "isolation.level": "read_uncommitted",
                    }
                )
            self._consumers[key] = consumer
            while len(self._consumers) > self.size:
                evicted.append(self._consumers.popitem(last=False)[1])
        for old in evicted:
            old.close()
        return consumer

    def drop(self, config: dict[str, Any], group: str) -> None:
        """Close the consumer of ``group`` (it met an error; the next ``get`` makes another)."""
        with self._lock:
            consumer = self._consumers.pop((client_config_key(config), group), None)
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()

    def close(self) -> None:
        """Close every consumer (a process that outlives its brokers, such as a test session,
        would otherwise log their reconnection attempts until it exits)."""
        with self._lock:
            consumers = list(self._consumers.values())
            self._consumers.clear()
        for consumer in consumers:
            with contextlib.suppress(Exception):
                consumer.close()


MARKERS = MarkerReaders()
"""This Python worker's marker consumers."""


def read_marker(
    config: dict[str, Any], transactional_id: str, marker_topic: str, timeout: float
) -> Marker:
    """The marker of ``transactional_id``: the committed offset of its group, read by this
    worker's marker consumer of that group (transient errors retried until ``timeout``).
    Offsets pending in an open transaction are not returned and not waited for (the consumer
    is ``read_uncommitted``, so it does not ask for stable offsets): that would stall behind
    a zombie's open transaction."""

    def fetch(seconds: float) -> Any:
        consumer = MARKERS.get(config, transactional_id)
        marker = [TopicPartition(marker_topic, 0)]
        try:
            found = consumer.committed(marker, timeout=seconds)[0]
            if found.error is not None:
                raise KafkaException(found.error)
        except KafkaException:
            MARKERS.drop(config, transactional_id)
            raise
        return found

    what = f"reading the batch marker of {transactional_id}"
    found = _retried(fetch, timeout, what)
    return Marker.parse(found.offset, found.metadata)


_RETIRED: dict[tuple[Any, str, str], int] = {}
"""The last batch each query committed under a retired id, as this worker read it (see
:func:`retired_written`): at most :data:`RETIRED_KEPT`, the oldest read forgotten first."""
RETIRED_KEPT = 256
"""How many retired ids' markers a Python worker remembers (one per Spark partition of each
sink and query it wrote; one forgotten is read again when needed)."""


def retired_written(
    config: dict[str, Any], transactional_id: str, marker_topic: str, timeout: float, query: str
) -> int:
    """The last batch of ``query`` committed under ``transactional_id``, an id no task writes
    under any more (a partition's id without its slot, as releases before the slots used it):
    its marker no longer changes once the run that fenced it started, so each worker reads
    it once (-1: none)."""
    key = (client_config_key(config), transactional_id, query)
    if key not in _RETIRED:
        written = read_marker(config, transactional_id, marker_topic, timeout).written(query)
        MARKERS.drop(config, transactional_id)
        while len(_RETIRED) >= RETIRED_KEPT:
            del _RETIRED[next(iter(_RETIRED))]
        _RETIRED[key] = written
    return _RETIRED[key]


def register_marker(
    config: dict[str, Any], transactional_id: str, marker_topic: str, timeout: float
) -> None:
    """Commit marker ``REGISTERED`` (outside any transaction) for a new id: the groups are
    how recovery finds every id to fence (transient errors retried until ``timeout``)."""

    def commit(seconds: float) -> Any:  # a synchronous commit has no time-out of its own
        consumer = MARKERS.get(config, transactional_id)
        return consumer.commit(
            offsets=[TopicPartition(marker_topic, 0, REGISTERED)], asynchronous=False
        )

    _retried(commit, timeout, f"registering {transactional_id}")


def _retried(call: Callable[[float], Any], timeout: float, what: str) -> Any:
    """``call(seconds_left)`` (a request of a marker consumer), again after transient errors
    (a group coordinator loading or moving, a lost connection) until ``timeout`` seconds
    passed; then a :class:`RestartableError`."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        try:
            return call(max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            error = kafka_error(exc)
            if not is_transient(error) or time.monotonic() + pause >= deadline:
                raise RestartableError(f"kafka sink: {what} failed: {error}") from None
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
