"""A sink into Kafka: exactly-once with Kafka transactions, or at-least-once with the
idempotent producer.

Exactly-once protocol (``mode=transactional``, the default): every Spark task (one Spark
partition of one batch) writes in ONE Kafka transaction whose ``transactional.id`` is
``ep.<job>.<sink>.<spark partition>``: stable across attempts and runs, so a newer producer's
``init_transactions()`` fences an older one and aborts its open transaction. The same
transaction commits a batch marker: the consumer-group offset of group
``<transactional.id>`` on ``(markerTopic, 0)`` set to ``batch + 1`` (metadata: the Spark query
id and the producer instance that committed it), via ``send_offsets_to_transaction``.
``prepare()`` commits the Kafka transaction (so the records and the marker become visible
together); the runtime's ``commit()`` has nothing left to do. A replayed, undecided batch
finds the marker of each Spark partition that already committed and writes nothing there.

Producers are kept: each Python worker process keeps the transactional producer of every
``transactional.id`` it used (:class:`ProducerPool`), so a task whose worker has one skips
``init_transactions()``. A kept producer is not used when the marker shows a later commit
by another producer of its id (whose ``init_transactions()`` fenced it) or when it reported a
lost connection while idle; a kept producer fenced otherwise (by recovery) is refused by
``send_offsets_to_transaction``, before it writes a record, and replaced; any fencing,
time-out or error drops a producer. The marker is read by a consumer the worker keeps per
id (:class:`MarkerReaders`), never by one made for the task. The look that decides always
follows the ``init_transactions()`` of the producer that will commit, and a producer
remembers its own last commit: that keeps a replay from writing twice (the argument is in
``docs/connectors/kafka.md``).

Recovery at query start (``in_doubt``) fences every ``transactional.id`` the sink ever used,
so no transaction lingers and ``read_committed`` readers never wait for a timeout. Atomicity
is per Spark partition per batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import ConfigResource, OffsetSpec, ResourceType

from epochal_kafka.common import (
    CONNECTOR,
    admin_client,
    client_config,
    is_transient,
    kafka_error,
    list_topics,
)
from epochal_sdk import (
    ConfigError,
    Guarantee,
    IdempotentSink,
    IdempotentWriter,
    Options,
    PoisonRecordError,
    Prepared,
    RecoveryScope,
    RestartableError,
    Schema,
    SchemaMismatchError,
    TaskContext,
    Transaction,
    TransactionalSink,
    WriterId,
)

if TYPE_CHECKING:
    import pyarrow

log = logging.getLogger("epochal.kafka.sink")

MODES = ("transactional", "idempotent")
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
REGISTERED = 0
"""Marker offset of a ``transactional.id`` that is known (so recovery fences it) but has not
committed a batch yet. A committed batch ``b`` is stored as ``b + 1``."""
POOL_SIZE = 8
"""How many idle transactional producers one Python worker process keeps (least recently
used ones beyond that are closed)."""
FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
"""Errors that mean a newer producer of the same ``transactional.id`` took over."""


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


@dataclass(eq=False)
class PooledProducer:
    """A transactional producer that a Python worker keeps across tasks: one per
    ``transactional.id`` (and client configuration). ``instance`` names it in the markers it
    commits; ``committed`` remembers the last batch it committed per query, because the marker
    of a commit that just returned may not be readable yet (the broker writes the transaction
    markers after it answered)."""

    transactional_id: str
    config_key: tuple[tuple[str, str], ...]
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

_ADMINS: dict[Any, Any] = {}
_CACHE_LOCK = threading.Lock()
MARKER_READERS = 16
"""How many marker consumers (one per ``transactional.id``) a Python worker keeps."""


def _config_key(config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in config.items()))


def _admin(config: dict[str, Any]) -> Any:
    """This worker's admin client for ``config`` (made once, thread-safe): the sink's checks
    and recovery on the driver, which PySpark may run again for every batch in its long-lived
    planner worker, reuse its connections."""
    key = _config_key(config)
    with _CACHE_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            admin = _ADMINS[key] = admin_client(config)
    return admin


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
        key = (_config_key(config), group)
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
            consumer = self._consumers.pop((_config_key(config), group), None)
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


class KafkaSink(TransactionalSink, IdempotentSink):
    """Writes rows to Kafka: column ``value`` (string/binary, required), optional ``key``,
    ``topic`` (per-record topic), ``partition`` and ``headers``
    (``array<struct<key string, value binary>>`` or a map).

    Options: ``kafka.bootstrap.servers`` (required; ``kafka.*`` goes to librdkafka),
    ``topic`` (the default topic; required without a ``topic`` column), ``mode``
    (``transactional``: exactly-once; ``idempotent``: at-least-once), ``markerTopic`` (the topic
    whose partition 0 carries the batch markers; default ``topic``),
    ``transactionTimeoutMs`` (default 600000), ``snapshotIntervalMs`` (default 60000) and
    ``expectedRecoveryMs`` (default 120000) for the submit-time timeout check,
    ``timeoutMs`` (client calls: init, commit, flush; default 60000).
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.config = client_config(options)
        self.bootstrap = str(self.config["bootstrap.servers"])
        self.topic = options.str("topic", "").strip() or None
        self.mode = options.choice("mode", "transactional", MODES)
        self.marker_topic = options.str("markerTopic", "").strip() or self.topic
        self.transaction_timeout_ms = (
            options.int("transactionTimeoutMs", 600_000, minimum=1000) or 600_000
        )
        self.snapshot_interval_ms = options.int("snapshotIntervalMs", 60_000, minimum=0) or 0
        self.expected_recovery_ms = options.int("expectedRecoveryMs", 120_000, minimum=0) or 0
        self.timeout = (options.int("timeoutMs", 60_000, minimum=100) or 60_000) / 1000
        self._topic_column = True  # until check() saw the columns: assume any topic
        self.pool = WORKER_POOL
        """Where this worker keeps its transactional producers (tests give another one to
        play a second worker)."""
        if self.mode == "transactional" and self.marker_topic is None:
            raise ConfigError(
                CONNECTOR,
                "markerTopic",
                "is required when no 'topic' option is given",
                "Set .option('topic', ...) or .option('markerTopic', <an existing topic>): "
                "its partition 0 carries the exactly-once batch markers (consumer-group offsets).",
            )

    # -- contract choice --------------------------------------------------------------------

    def sink_mode(self) -> str:
        """``transactional`` (exactly-once) or ``idempotent`` (at-least-once)."""
        return self.mode

    def max_guarantee(self) -> Guarantee:
        """Exactly-once with transactions; at-least-once with the idempotent producer (a
        replayed batch is written again)."""
        return Guarantee.EXACTLY_ONCE if self.mode == "transactional" else Guarantee.AT_LEAST_ONCE

    def key_columns(self) -> tuple[str, ...]:
        """No upsert key: idempotent mode is at-least-once (the runtime's key-stability check
        only runs under exactly-once)."""
        return ()

    # -- submit-time checks -----------------------------------------------------------------

    def check(self, schema: Schema) -> None:
        """Columns fit, the cluster answers, the topics exist, the transaction timeout fits
        the broker's ``transaction.max.timeout.ms`` and the snapshot interval."""
        names = {f.name: f.type for f in schema}
        if "value" not in names:
            raise SchemaMismatchError(
                f"kafka sink: there is no 'value' column among {sorted(names)}. Select one, "
                "e.g. .selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value')."
            )
        for name, kind in names.items():
            allowed = COLUMN_TYPES.get(name)
            if allowed is None:
                raise SchemaMismatchError(
                    f"kafka sink: column {name!r} is not one the sink writes "
                    f"({', '.join(COLUMN_TYPES)}). Drop it or fold it into 'value'."
                )
            if kind.replace(" ", "") not in allowed:
                raise SchemaMismatchError(
                    f"kafka sink: column {name!r} has type {kind}; it must be one of "
                    f"{', '.join(allowed)}. Cast it."
                )
        self._topic_column = "topic" in names
        if self.topic is None and "topic" not in names:
            raise ConfigError(
                CONNECTOR,
                "topic",
                "is required when the rows have no 'topic' column",
                "Set .option('topic', ...) or add a 'topic' column.",
            )
        admin = _admin(self.config)
        metadata = list_topics(admin, self.bootstrap, self.timeout, at_start=True)
        for option, topic in (("topic", self.topic), ("markerTopic", self.marker_topic)):
            if topic is not None and (
                topic not in metadata.topics or metadata.topics[topic].error is not None
            ):
                raise ConfigError(
                    CONNECTOR,
                    option,
                    f"topic {topic!r} does not exist at {self.bootstrap}",
                    "Create it first (the sink does not create topics).",
                )
        if self.mode == "transactional":
            self._check_timeouts(admin, metadata)

    def _check_timeouts(self, admin: Any, metadata: Any) -> None:
        broker_max = _broker_config(admin, metadata, "transaction.max.timeout.ms", self.timeout)
        ours = self.transaction_timeout_ms
        if broker_max is not None and ours > broker_max:
            raise ConfigError(
                CONNECTOR,
                "transactionTimeoutMs",
                f"{ours} ms exceeds the broker's transaction.max.timeout.ms = {broker_max} ms "
                "(init_transactions would be refused)",
                f"Set it to at most {broker_max} or raise transaction.max.timeout.ms.",
            )
        needed = self.snapshot_interval_ms + self.expected_recovery_ms
        if ours <= needed:
            log.warning(
                "kafka sink: transaction.timeout.ms = %s ms is not above snapshotIntervalMs "
                "(%s ms) + expectedRecoveryMs (%s ms) = %s ms. Each transaction spans one task's "
                "write and is committed by the task (never left open across a snapshot), so a "
                "timeout only fails a slow task (loudly, it is retried) and loses nothing; "
                "raise transactionTimeoutMs above %s ms to avoid such retries.",
                ours,
                self.snapshot_interval_ms,
                self.expected_recovery_ms,
                needed,
                needed,
            )

    # -- exactly-once -------------------------------------------------------------------------

    def transactional_id(self, task: TaskContext) -> str:
        """The task's writer id (:class:`~epochal_sdk.WriterId`, ``<prefix>.<partition>``):
        stable across attempts and runs, so a newer producer fences an older one."""
        return str(task.writer_id)

    def begin(self, task: TaskContext) -> Transaction:
        """The Kafka transaction of one task (its session starts at once, in the background,
        with this worker's kept producer of the task's ``transactional.id`` if it may)."""
        return KafkaTransaction(self, task)

    def commit(self, prepared: Prepared) -> None:
        """Nothing to do: ``prepare`` committed the Kafka transaction with its marker."""

    def rollback(self, prepared: Prepared) -> None:
        """Nothing to do: a transaction that did not commit in ``prepare`` was aborted by its
        task, or is aborted by the next ``init_transactions`` of its ``transactional.id``
        (recovery, or the next producer of that id)."""

    def in_doubt(self, prefix: str, scope: RecoveryScope | None = None) -> list[Prepared]:
        """Nothing is ever left prepared. At a recovery (``scope.recovery``: a run's start,
        an operator settling) it fences every ``transactional.id`` of the sink, so that no
        transaction of a dead run lingers; other look-ups (a batch, a listing) do nothing."""
        head = prefix.rstrip(".")
        recovery = scope.recovery if scope is not None else not head.rsplit(".", 1)[-1].isdigit()
        if self.mode != "transactional" or not recovery:
            return []
        if not self._topic_column and self.topic is not None and not self._unstable():
            return []  # no open transaction holds back read_committed readers of the topic
        fenced = self.fence(head)
        log.info("kafka sink: fenced %d transactional id(s) of %s", len(fenced), head)
        return []

    def _unstable(self) -> bool:
        """Whether a partition of ``topic`` has its last stable offset below its high
        watermark: an open transaction (maybe one of a dead task) holds readers back."""
        admin = _admin(self.config)
        try:
            topic = admin.list_topics(self.topic, timeout=self.timeout).topics[self.topic]
            request = {TopicPartition(self.topic, p): OffsetSpec.latest() for p in topic.partitions}
            ends = {}
            for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
                futures = admin.list_offsets(
                    request, isolation_level=level, request_timeout=self.timeout
                )
                ends[level] = {tp.partition: f.result().offset for tp, f in futures.items()}
        except (KafkaException, KeyError):
            return True  # cannot tell: fence
        stable, high = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
        return any(stable[p] < high[p] for p in high)

    def fence(self, prefix: str) -> list[str]:
        """``init_transactions()`` on every registered ``transactional.id`` under
        ``prefix``: aborts their open transactions now. Returns the ids."""
        admin = _admin(self.config)
        try:
            groups = admin.list_consumer_groups(request_timeout=self.timeout).result()
        except KafkaException as exc:
            raise RestartableError(
                f"kafka sink: listing consumer groups at {self.bootstrap} failed: "
                f"{kafka_error(exc)}"
            ) from None
        ids = sorted(g.group_id for g in groups.valid if WriterId.parse(g.group_id, prefix))
        errors: list[BaseException] = []

        def one(transactional_id: str) -> None:
            try:
                producer = Producer(self._producer_config(transactional_id))
                _init_transactions(producer, self.timeout)
                producer.flush(0)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.pool.drop(ids)  # fenced now: a kept one would only fail its first check
        if errors:
            raise RestartableError(f"kafka sink: fencing {prefix}.* failed: {errors[0]}")
        return ids

    def _producer_config(self, transactional_id: str | None) -> dict[str, Any]:
        config = {
            "linger.ms": 5,
            **self.config,
            "enable.idempotence": True,
            "acks": "all",
            "delivery.report.only.error": True,
        }
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
            config["transaction.timeout.ms"] = self.transaction_timeout_ms
        return config

    # -- at-least-once ------------------------------------------------------------------------

    def open(self, task: TaskContext) -> IdempotentWriter:
        """An idempotent producer for one task (at-least-once)."""
        return KafkaWriter(self)


class _Producing:
    """Turns Arrow batches into produce calls and collects delivery errors."""

    def __init__(self, sink: KafkaSink) -> None:
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
                    raise PoisonRecordError(
                        f"kafka sink: row {self.rows + i} of this task (topic {topic!r}) cannot "
                        f"be produced: {exc}. Fix or filter the record (size limits: "
                        "message.max.bytes / max.request.size)."
                    ) from None
        self.rows += count
        producer.poll(0)

    def _produce_plain(
        self, producer: Producer, topic: Any, values: list[Any], keys: list[Any] | None
    ) -> None:
        """Key and value only, to one topic."""
        produce = producer.produce
        pairs = zip(values, keys if keys is not None else [None] * len(values), strict=True)
        for index, (value, key) in enumerate(pairs):
            try:
                produce(topic, value, key)
            except BufferError:  # local queue full: serve delivery reports, then retry
                while True:
                    producer.poll(0.05)
                    try:
                        produce(topic, value, key)
                        break
                    except BufferError:
                        continue
            except (KafkaException, TypeError) as exc:
                raise PoisonRecordError(
                    f"kafka sink: row {self.rows + index} of this task (topic {topic!r}) "
                    f"cannot be produced: {exc}. Fix or filter the record (size limits: "
                    "message.max.bytes / max.request.size)."
                ) from None


def _headers(value: Any) -> list[tuple[str, Any]]:
    """Headers from a list of ``{"key", "value"}`` structs or a map (list of pairs)."""
    if isinstance(value, dict):
        return list(value.items())
    return [(h["key"], h["value"]) if isinstance(h, dict) else tuple(h) for h in value]


class KafkaTransaction(_Producing, Transaction):
    """One task's Kafka transaction, committed with its batch marker in ``prepare``.

    The session (in a background thread, overlapping the task's reading): look at the
    marker; skip if this batch is written; else take this worker's kept producer of the id
    (unless the marker shows a later commit by another producer, whose
    ``init_transactions()`` fenced it), or make a new one (``init_transactions()``, then look
    again); when the first record arrives, begin the transaction and add the marker
    ``batch + 1`` to it before any record (``send_offsets_to_transaction``: a kept producer
    that was fenced fails here and is replaced). ``write`` produces into it, ``prepare``
    commits it. A task without records opens no transaction."""

    def __init__(self, sink: KafkaSink, task: TaskContext) -> None:
        super().__init__(sink)
        self.task = task
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
        self._rows = threading.Event()
        """Set by the first record (open the transaction) or the end of the task (there are
        none: ``_no_rows``)."""
        self._no_rows = False
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
        config_key = _config_key(self.sink._producer_config(self.transactional_id))
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
        self._rows.wait()  # the transaction is opened when the first record arrives
        if self._no_rows:
            return True  # a task without records commits nothing; the producer is kept
        try:
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
        by what ``held`` itself committed (its own last commit may not be readable yet).
        Sets ``skipped``."""
        written = last_written(marker, held, self.query_id)
        if written >= self.task.batch_id:
            log.info(
                "kafka sink: %s already committed batch %s (marker %s): writing nothing",
                self.transactional_id,
                self.task.batch_id,
                written,
            )
            self.skipped = True
        return self.skipped

    def _look(self) -> Marker:
        """The marker of this id: the committed offset of group ``<transactional.id>``, read
        by the worker's marker consumer of that group. Offsets pending in an open transaction
        are not returned and not waited for (the consumer is ``read_uncommitted``, so it does
        not ask for stable offsets): that would stall behind a zombie's open transaction."""
        sink = self.sink

        def fetch(seconds: float) -> Any:
            consumer = MARKERS.get(sink.config, self.transactional_id)
            marker = [TopicPartition(sink.marker_topic, 0)]
            try:
                found = consumer.committed(marker, timeout=seconds)[0]
                if found.error is not None:
                    raise KafkaException(found.error)
            except KafkaException:
                MARKERS.drop(sink.config, self.transactional_id)
                raise
            return found

        what = f"reading the batch marker of {self.transactional_id}"
        with self._calling("reading the marker"):
            found = _retried(fetch, sink.timeout, what)
        return Marker.parse(found.offset, found.metadata)

    def _register(self) -> None:
        """Commit marker ``REGISTERED`` (outside any transaction) for a new id: the groups
        are how recovery finds every id to fence."""
        sink = self.sink

        def commit(seconds: float) -> Any:  # a synchronous commit has no time-out of its own
            consumer = MARKERS.get(sink.config, self.transactional_id)
            return consumer.commit(
                offsets=[TopicPartition(sink.marker_topic, 0, REGISTERED)], asynchronous=False
            )

        with self._calling("registering the id"):
            _retried(commit, sink.timeout, f"registering {self.transactional_id}")

    def _new_producer(self, config_key: Any) -> PooledProducer:
        """A new producer of this id; its ``init_transactions()`` fences every older one and
        aborts their open transaction."""
        sink = self.sink
        held = PooledProducer(self.transactional_id, config_key)
        config = {
            **sink._producer_config(self.transactional_id),
            "on_delivery": held.on_delivery,
            "error_cb": held.on_error,
        }
        held.producer = Producer(config)
        self.pool.created += 1
        try:
            with self._calling("init_transactions"):
                _init_transactions(held.producer, sink.timeout)
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
        marker = TopicPartition(
            sink.marker_topic,
            0,
            self.task.batch_id + 1,
            metadata=f"{self.query_id};{held.instance}",
        )
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

    def _end_of_rows(self) -> None:
        """No more records come: a session still waiting for the first one opens nothing."""
        if not self._rows.is_set():
            self._no_rows = True
            self._rows.set()

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Produce the rows inside the transaction (nothing on a replay already written)."""
        if batch.num_rows == 0:
            return
        self._rows.set()
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
        task without records commits nothing (no transaction was opened)."""
        data = {"transactional_id": self.transactional_id, "batch": self.task.batch_id}
        self._end_of_rows()
        self._wait()
        if self.skipped:
            return {**data, "records": 0, "skipped": True}
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
        held.committed[self.query_id] = self.task.batch_id
        self.open = False
        self._raise_delivery_errors()
        return {**data, "records": self.rows, "skipped": False, "reused": self.reused}

    def abort(self) -> None:
        """Abort the open transaction (if that fails, the next ``init_transactions`` of this
        id aborts it; the producer is not kept)."""
        self._end_of_rows()
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
        self._end_of_rows()
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


def _retried(call: Any, timeout: float, what: str) -> Any:
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


CALL_GRACE = 10.0
"""Seconds past its own time-out after which a client call of a task's session is taken as
hung (see ``KafkaTransaction._wait``)."""
INIT_STEP = 0.05
"""Seconds per ``init_transactions()`` call while it is retried (see
:func:`_init_transactions`)."""


def _init_transactions(producer: Producer, timeout: float) -> None:
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


def _transaction_error(transactional_id: str, step: str, exc: KafkaException) -> Exception:
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


class KafkaWriter(_Producing, IdempotentWriter):
    """One task's records through the idempotent producer (at-least-once). The producer is
    created at once, so that it connects and gets its producer id while the task reads."""

    def __init__(self, sink: KafkaSink) -> None:
        super().__init__(sink)
        self.producer = Producer({**sink._producer_config(None), "on_delivery": self._on_delivery})

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


def _broker_config(admin: Any, metadata: Any, name: str, timeout: float) -> int | None:
    """A numeric broker config of the controller/any broker (None if it cannot be read)."""
    broker = next(iter(metadata.brokers), None)
    if broker is None:
        return None
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
        return int(configs[name].value)
    except (KafkaException, KeyError, ValueError, TypeError):
        log.warning("kafka sink: could not read the broker's %s", name)
        return None
