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
``transactional.id`` it used (:class:`~epochal_kafka.producers.ProducerPool`), so a task
whose worker has one skips ``init_transactions()``. A kept producer is not used when the
marker shows a later commit by another producer of its id (whose ``init_transactions()``
fenced it) or when it reported a lost connection while idle; a kept producer fenced
otherwise (by recovery) is refused by ``send_offsets_to_transaction``, before it writes a
record, and replaced; any fencing, time-out or error drops a producer. The marker is read by
a consumer the worker keeps per id (:class:`~epochal_kafka.marker.MarkerReaders`), never by
one made for the task. The look that decides always follows the ``init_transactions()`` of
the producer that will commit, and a producer remembers its own last commit: that keeps a
replay from writing twice (the argument is in ``docs/reference/connectors/kafka.md``).

Recovery at query start (``in_doubt``) fences every ``transactional.id`` the sink ever used,
so no transaction lingers and ``read_committed`` readers never wait for a timeout. Atomicity
is per Spark partition per batch.

The parts, one module each: :mod:`~epochal_kafka.marker` (the batch marker and its
consumers), :mod:`~epochal_kafka.producers` (the producer pool),
:mod:`~epochal_kafka.transaction` (the per-task transaction session),
:mod:`~epochal_kafka.records` (Arrow rows to produce calls) and :mod:`~epochal_kafka.writer`
(the at-least-once writer); this module has the sink itself: its options, submit-time
checks, ids and recovery.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, OffsetSpec, ResourceType

from epochal_kafka.common import (
    CONNECTOR,
    admin_client,
    client_config,
    kafka_error,
    list_topics,
)
from epochal_kafka.producers import (
    WORKER_POOL,
    client_config_key,
    init_transactions,
)
from epochal_kafka.records import COLUMN_TYPES
from epochal_kafka.transaction import KafkaTransaction
from epochal_kafka.writer import KafkaWriter
from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    IdempotentWriter,
    Options,
    Prepared,
    RecoveryScope,
    RestartableError,
    Schema,
    SchemaMismatchError,
    Transaction,
    TransactionalSink,
    WriterId,
)

log = logging.getLogger("epochal.kafka.sink")

SLOTS = 2
"""How many ``transactional.id`` a Spark partition's writer takes turns with, batch by batch
(:func:`transactional_id`)."""


def transactional_id(writer: WriterId, batch: int) -> str:
    """``<writer id>.<batch % SLOTS>``: the ``transactional.id`` of a partition's writer in
    ``batch``. Every attempt and replay of a batch has the same, so a newer producer fences
    an older one and its marker tells whether the batch is written. Consecutive batches
    alternate: a task of epochal's own sources runs in two Python workers, one reading and
    one writing, which swap roles from one batch to the next, so with one id per partition
    each worker's new producer fenced the one the other kept; with the batch's parity in the
    id each keeps its own (``docs/evidence/performance/timeline.md``)."""
    return f"{writer}.{batch % SLOTS}"


def writer_of(text: str, prefix: str) -> WriterId | None:
    """The writer of ``text`` if it is a ``transactional.id`` of the sink with ``prefix``:
    one of :func:`transactional_id`, or a writer id without a slot (what releases before
    the slots used: recovery fences those too)."""
    head, dot, tail = text.rpartition(".")
    if dot and tail.isdigit():
        found = WriterId.parse(head, prefix)
        if found is not None:
            return found
    return WriterId.parse(text, prefix)


INT32_MAX = 2**31 - 1
"""librdkafka's limit of ``transaction.timeout.ms`` (a 32-bit integer)."""
MODES = ("transactional", "idempotent")
"""The values of option ``mode``: exactly-once with Kafka transactions, or at-least-once with
the idempotent producer."""

_ADMINS: dict[Any, Any] = {}
_CACHE_LOCK = threading.Lock()


def _admin(config: dict[str, Any]) -> Any:
    """This worker's admin client for ``config`` (made once, thread-safe): the sink's checks
    and recovery on the driver, which PySpark may run again for every batch in its long-lived
    planner worker, reuse its connections."""
    key = client_config_key(config)
    with _CACHE_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            admin = _ADMINS[key] = admin_client(config)
    return admin


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
            options.int("transactionTimeoutMs", 600_000, minimum=1000, maximum=INT32_MAX) or 600_000
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

    def settles_each_partition(self) -> bool:
        """Yes: each partition's Kafka transaction commits in ``prepare``, and a replay skips
        the partitions whose batch marker is there, so a replayed batch must give every
        partition the rows it had."""
        return True

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

    def transactional_id(self, task: ConnectorContext) -> str:
        """The task's ``transactional.id`` (:func:`transactional_id`): the same for every
        attempt and run of its batch, so a newer producer fences an older one."""
        assert task.batch is not None, "a task's context has its batch"
        return transactional_id(task.writer_id, task.batch)

    def begin(self, task: ConnectorContext) -> Transaction:
        """The Kafka transaction of one task (its session starts at once, in the background,
        with this worker's kept producer of the task's ``transactional.id`` if it may)."""
        return KafkaTransaction(self, task)

    def commit(self, prepared: Prepared) -> None:
        """Nothing to do: ``prepare`` committed the Kafka transaction with its marker."""

    def rollback(self, prepared: Prepared) -> None:
        """Nothing to do: a transaction that did not commit in ``prepare`` was aborted by its
        task, or is aborted by the next ``init_transactions`` of its ``transactional.id``
        (recovery, or the next producer of that id)."""

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        """Nothing is ever left prepared. At a recovery (``scope.recovery``: a run's start,
        an operator settling) it fences every ``transactional.id`` of the sink, so that no
        transaction of a dead run lingers; other look-ups (a batch, a listing) do nothing."""
        head = scope.head.rstrip(".")
        if self.mode != "transactional" or not scope.recovery:
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
        ids = sorted(g.group_id for g in groups.valid if writer_of(g.group_id, prefix))
        errors: list[BaseException] = []

        def one(transactional_id: str) -> None:
            try:
                producer = Producer(self.producer_config(transactional_id))
                init_transactions(producer, self.timeout)
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

    def producer_config(self, transactional_id: str | None) -> dict[str, Any]:
        """The librdkafka configuration of this sink's producers: idempotent, ``acks=all``,
        delivery reports of errors only; transactional (with the sink's transaction timeout)
        when ``transactional_id`` is given."""
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

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        """An idempotent producer for one task (at-least-once)."""
        return KafkaWriter(self)


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
