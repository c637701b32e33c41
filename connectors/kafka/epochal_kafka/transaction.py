"""The per-task transaction session of the exactly-once sink (:class:`KafkaTransaction`):
look at the batch marker, take a kept producer or make a new one, open the Kafka transaction
with the marker, produce, commit; and the errors of transaction calls. The protocol as a
whole is described in :mod:`epochal_kafka.sink` and ``docs/reference/connectors/kafka.md``."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer

from epochal_kafka.common import kafka_error
from epochal_kafka.marker import (
    MARKERS,
    Marker,
    batch_marker,
    last_written,
    read_marker,
    register_marker,
    retired_written,
    superseded,
)
from epochal_kafka.producers import PooledProducer, client_config_key, init_transactions
from epochal_kafka.records import RecordProducing, SinkSettings
from epochal_sdk import ConnectorContext, RestartableError, Transaction

if TYPE_CHECKING:
    import pyarrow


log = logging.getLogger("epochal.kafka.sink")

CALL_GRACE = 10.0
"""Seconds past its own time-out after which a client call of a task's session is taken as
hung (see ``KafkaTransaction._wait``)."""
FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
"""Errors that mean a newer producer of the same ``transactional.id`` took over."""


class KafkaTransaction(RecordProducing, Transaction):
    """One task's Kafka transaction, committed with its batch marker in ``prepare``.

    The session (in a background thread, overlapping the task's reading): look at the
    marker; skip if this batch is written; else take this worker's kept producer of the id
    (unless the marker shows a later commit by another producer, whose
    ``init_transactions()`` fenced it), or make a new one (``init_transactions()``, then look
    again); begin the transaction and add the marker ``batch + 1`` to it before any record
    (``send_offsets_to_transaction``: a kept producer that was fenced fails here and is
    replaced), while the task's rows are still being read. ``write`` produces into it,
    ``prepare`` commits it, or aborts it when the task had no records."""

    def __init__(self, sink: SinkSettings, task: ConnectorContext) -> None:
        super().__init__(sink)
        self.task = task
        self.batch = task.txn.batch  # a task's context: its batch is set
        self.transactional_id = sink.transactional_id(task)
        self.query_id = task.query_id
        """Spark's query id (from the runtime's task context): it tells a marker of this query
        from one left by an earlier query (a job restarted with a fresh checkpoint)."""
        self.pool = sink.pool
        self.held: PooledProducer | None = None
        self.reused = False
        """Whether this task's producer was kept from an earlier task of this worker."""
        self.skipped = False
        self.open = False
        self._broken = False
        self._abandoned = False
        """The session hung in a client call: it is left alone, its producer never kept."""
        self._call: tuple[str, float] = ("", 0.0)
        self._failure: BaseException | None = None
        self._session = threading.Thread(target=self._start_quietly, daemon=True)
        self._session.start()  # overlaps the broker round trips with the task's reading

    def _start_quietly(self) -> None:
        try:
            self._start()
        except BaseException as exc:  # re-raised in the task's thread by _wait
            self._failure = exc

    def _wait(self) -> None:
        """Wait until the session is ready (marker read, transaction open); raise what it met.
        A client call of the session that runs past its own time-out (plus ``CALL_GRACE``)
        is taken as hung: this attempt fails restartably and its producer is dropped."""
        while self._session.is_alive():
            self._session.join(0.2)
            call, started = self._call
            overdue = time.monotonic() - started - self.sink.timeout - CALL_GRACE
            if self._session.is_alive() and call and overdue > 0:
                self._abandoned = True
                raise RestartableError(
                    f"kafka sink: {call}() of {self.transactional_id} did not return within "
                    f"its time-out of {self.sink.timeout:g}s (+{CALL_GRACE:g}s): this attempt "
                    "stops and its producer is dropped; a retry starts with a new one"
                )
        if self._failure is not None:
            raise self._failure

    @contextlib.contextmanager
    def _calling(self, name: str) -> Iterator[None]:
        """Mark a client call of the session as running (for :meth:`_wait`)."""
        self._call = (name, time.monotonic())
        try:
            yield
        finally:
            self._call = ("", 0.0)

    # -- the session ----------------------------------------------------------------------

    def _start(self) -> None:
        """Choose the producer, look at the marker, open the transaction (background)."""
        marker = self._look()
        if self._written(marker, None):
            return
        config_key = client_config_key(self.sink.producer_config(self.transactional_id))
        kept = self.pool.take(self.transactional_id, config_key)
        if kept is not None and superseded(marker, kept, self.query_id):
            self._dispose(kept)  # fenced by the producer that committed since
            kept = None
        elif kept is not None and not kept.usable():
            log.info(
                "kafka sink: kept producer of %s met %s while idle: making a new one",
                self.transactional_id,
                kept.disrupted,
            )
            self._dispose(kept)
            kept = None
        # A kept producer was initialised before this look, so the look decides for it.
        if kept is not None and self._use(kept, marker, reused=True):
            return
        held = self._new_producer(config_key)
        self._use(held, self._look(), reused=False)  # a look after init_transactions()

    def _use(self, held: PooledProducer, marker: Marker, *, reused: bool) -> bool:
        """Skip (the marker, or ``held``'s own memory, shows the batch written) or open the
        transaction with ``held``. False if a kept producer was refused (fenced since): it is
        dropped and the caller makes a new one; a new producer's refusal raises."""
        self.held, self.reused = held, reused
        if self._written(marker, held):
            self.pool.give_back(held)
            self.held = None
            return True
        if marker.offset < 0:  # first use of this id: register it, so recovery fences it
            self._register()
        try:  # opened now, while the task's rows are still being read (see ``prepare``)
            self._open(held)
        except KafkaException as exc:
            self._drop(held)
            if not reused:
                raise _transaction_error(self.transactional_id, "begin", exc) from None
            log.info(
                "kafka sink: kept producer of %s refused (%s): making a new one",
                self.transactional_id,
                kafka_error(exc),
            )
            return False
        return True

    def _written(self, marker: Marker, held: PooledProducer | None) -> bool:
        """Whether this task's batch is already committed under this id: by the marker, or
        by what ``held`` itself committed (its own last commit may not be readable yet), or
        under the partition's id without a slot, which a job started before the slots wrote
        its batches under (:func:`~epochal_kafka.marker.retired_written`). Sets
        ``skipped``."""
        written = max(last_written(marker, held, self.query_id), self._retired())
        if written >= self.batch:
            log.info(
                "kafka sink: %s already committed batch %s (marker %s): writing nothing",
                self.transactional_id,
                self.task.batch,
                written,
            )
            self.skipped = True
        return self.skipped

    def _retired(self) -> int:
        sink = self.sink
        retired = str(self.task.writer_id)
        if retired == self.transactional_id:  # a sink that still writes under it
            return -1
        with self._calling("reading the batch marker of the id without a slot"):
            return retired_written(
                sink.config, retired, self.marker_topic, sink.timeout, self.query_id
            )

    @property
    def marker_topic(self) -> str:
        """The sink's marker topic (a sink in transactional mode always has one)."""
        topic = self.sink.marker_topic
        assert topic is not None, "a Kafka transaction of a sink without a marker topic"
        return topic

    def _look(self) -> Marker:
        """The marker of this id, read by the worker's marker consumer of its group (see
        :func:`~epochal_kafka.marker.read_marker`)."""
        sink = self.sink
        with self._calling("reading the marker"):
            return read_marker(sink.config, self.transactional_id, self.marker_topic, sink.timeout)

    def _register(self) -> None:
        """Commit marker ``REGISTERED`` (outside any transaction) for a new id: the groups
        are how recovery finds every id to fence."""
        sink = self.sink
        with self._calling("registering the id"):
            register_marker(sink.config, self.transactional_id, self.marker_topic, sink.timeout)

    def _new_producer(self, config_key: Any) -> PooledProducer:
        """A new producer of this id; its ``init_transactions()`` fences every older one and
        aborts their open transaction."""
        sink = self.sink
        held = PooledProducer(self.transactional_id, config_key)
        config = {
            **sink.producer_config(self.transactional_id),
            "on_delivery": held.on_delivery,
            "error_cb": held.on_error,
        }
        held.producer = Producer(config)
        self.pool.created += 1
        try:
            with self._calling("init_transactions"):
                init_transactions(held.producer, sink.timeout)
        except KafkaException as exc:
            raise RestartableError(
                f"kafka sink: init_transactions({self.transactional_id}) failed: {kafka_error(exc)}"
            ) from None
        return held

    def _open(self, held: PooledProducer) -> None:
        """Begin the transaction and add the marker ``batch + 1`` to it. A producer that was
        fenced (a newer one of this id exists) fails here, before any record is written."""
        sink = self.sink
        producer = held.producer
        assert producer is not None
        held.errors = self.errors
        producer.begin_transaction()
        held.in_transaction = True
        marker = batch_marker(self.marker_topic, self.batch, self.query_id, held.instance)
        metadata = MARKERS.get(sink.config, self.transactional_id).consumer_group_metadata()
        with self._calling("send_offsets_to_transaction"):
            producer.send_offsets_to_transaction([marker], metadata, sink.timeout)
        self.producer = producer
        self.open = True

    def _drop(self, held: PooledProducer) -> None:
        """Give up a producer that met an error: never kept again."""
        if self.held is held:
            self.held, self.producer, self.open = None, None, False
        self._dispose(held)

    def _dispose(self, held: PooledProducer) -> None:
        """Destroy a producer of the session (watched by :meth:`_wait` like a client call)."""
        with self._calling("closing the producer"):
            held.producer = None

    # -- the task's side ------------------------------------------------------------------

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Produce the rows inside the transaction (nothing on a replay already written)."""
        if batch.num_rows == 0:
            return
        self._wait()
        if self.skipped:
            return
        try:
            self._produce(batch)
        except KafkaException as exc:
            self._broken = True
            raise _transaction_error(self.transactional_id, "produce", exc) from None

    def prepare(self) -> dict[str, Any]:
        """Commit the Kafka transaction with the marker ``batch + 1`` (phase 1 = the Kafka
        commit): records and marker become visible to ``read_committed`` readers together. A
        task without records commits nothing: the transaction the session opened while the
        rows were read is aborted (opening it at the first record put the transaction's
        round trips to the coordinators on the task's critical path)."""
        data = {"transactional_id": self.transactional_id, "batch": self.task.batch}
        self._wait()
        if self.skipped:
            return {**data, "records": 0, "skipped": True}
        if self.open and self.rows == 0:
            self.abort()
        if not self.open:
            return {**data, "records": 0, "skipped": False, "reused": self.reused}
        held = self.held
        assert held is not None and held.producer is not None
        try:
            held.producer.commit_transaction(self.sink.timeout)
        except KafkaException as exc:
            self._broken = True
            raise _transaction_error(self.transactional_id, "commit", exc) from None
        held.in_transaction = False
        held.committed[self.query_id] = self.batch
        self.open = False
        self._raise_delivery_errors()
        return {**data, "records": self.rows, "skipped": False, "reused": self.reused}

    def abort(self) -> None:
        """Abort the open transaction (if that fails, the next ``init_transactions`` of this
        id aborts it; the producer is not kept)."""
        if self._abandoned:
            return
        try:
            self._wait()
        except BaseException:  # the session's failure is the task's failure already
            if self._abandoned:
                return
        held = self.held
        if not self.open or held is None or held.producer is None:
            return
        try:
            held.producer.abort_transaction(self.sink.timeout)
            held.in_transaction = False
        except KafkaException as exc:
            log.warning("kafka sink: abort of %s failed: %s", self.transactional_id, exc)
            self._broken = True
        self.open = False

    def close(self) -> None:
        """Give the producer back to this worker's pool if it is clean (no transaction open,
        no error met); drop it otherwise."""
        if not self._abandoned:
            with contextlib.suppress(BaseException):  # raised to the task already
                self._wait()
        if self._abandoned:
            return  # the hung session keeps its producer; it is never given back
        held, self.held, self.producer = self.held, None, None
        if held is None:
            return
        if (
            self._broken
            or self.errors
            or held.in_transaction
            or held.disrupted
            or held.producer is None
        ):
            held.producer = None
            return
        self.pool.give_back(held)


def _transaction_error(transactional_id: str, step: str, exc: KafkaException) -> Exception:
    """The error a failed transaction call (``step``) raises: restartable when a newer
    producer fenced this one or the error is not fatal; a plain error when it is fatal."""
    error = kafka_error(exc)
    text = f"kafka sink: {step} of transaction {transactional_id} failed: {error}"
    if error.code() in FENCED:
        return RestartableError(
            f"{text}. A newer producer of this id fenced this one (a newer attempt of the task "
            "or the recovery of a new run): this attempt stops; a retry looks at the marker "
            "again and writes only what is not committed."
        )
    if error.fatal():
        return RuntimeError(text)
    return RestartableError(text)
