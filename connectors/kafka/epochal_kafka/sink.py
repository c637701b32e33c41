"""A sink into Kafka: exactly-once with Kafka transactions, or at-least-once with the
idempotent producer.

Exactly-once protocol (``mode=transactional``, the default): every Spark task (one Spark
partition of one batch) writes in ONE Kafka transaction whose ``transactional.id`` is
``ep.<job>.<sink>.<spark partition>``: stable across attempts and runs, so a new attempt's
``init_transactions()`` fences the old one and aborts its open transaction. The same
transaction commits a batch marker: the consumer-group offset of group
``<transactional.id>`` on ``(markerTopic, 0)`` set to ``batch + 1`` (metadata: the Spark query
id), via ``send_offsets_to_transaction``. ``prepare()`` commits the Kafka transaction (so the
records and the marker become visible together); the runtime's ``commit()`` has nothing left
to do. A replayed, undecided batch finds the marker of each Spark partition that already
committed and writes nothing there. Recovery at query start (``in_doubt``) fences every
``transactional.id`` the sink ever used, so no transaction lingers and ``read_committed``
readers never wait for a timeout. Atomicity is per Spark partition per batch.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Producer, TopicPartition
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
    RestartableError,
    Schema,
    SchemaMismatchError,
    TaskContext,
    Transaction,
    TransactionalSink,
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


def _query_id() -> str:
    """The Spark query id of the running task ('' outside Spark). It tells a marker of this
    query from one left by an earlier query (a job restarted with a fresh checkpoint)."""
    try:
        from pyspark import TaskContext as SparkTaskContext
    except ImportError:  # pragma: no cover - pyspark is there whenever Spark runs us
        return ""
    task = SparkTaskContext.get()
    return (task.getLocalProperty("sql.streaming.queryId") or "") if task else ""


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
        admin = admin_client(self.config)
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
        """``ep.<job>.<sink>.<spark partition>``: stable across attempts and runs (fencing)."""
        return f"{task.prefix}.{task.partition}"

    def begin(self, task: TaskContext) -> Transaction:
        """The Kafka transaction of one task (its session starts at once, in the background)."""
        return KafkaTransaction(self, task)

    def commit(self, prepared: Prepared) -> None:
        """Nothing to do: ``prepare`` committed the Kafka transaction with its marker."""

    def rollback(self, prepared: Prepared) -> None:
        """Nothing to do: a transaction that did not commit in ``prepare`` is aborted by the
        next ``init_transactions`` of its ``transactional.id`` (recovery or a new attempt)."""

    def in_doubt(self, prefix: str) -> list[Prepared]:
        """Nothing is ever left prepared. Called with the bare job prefix at query start
        (recovery), it fences every ``transactional.id`` of the sink so that no transaction
        of a dead run lingers; per-batch calls (``<prefix><batch>.``) do nothing."""
        head = prefix.rstrip(".")
        if self.mode != "transactional" or head.rsplit(".", 1)[-1].isdigit():
            return []
        if not self._topic_column and self.topic is not None and not self._unstable():
            return []  # no open transaction holds back read_committed readers of the topic
        fenced = self.fence(head)
        log.info("kafka sink: fenced %d transactional id(s) of %s", len(fenced), head)
        return []

    def _unstable(self) -> bool:
        """Whether a partition of ``topic`` has its last stable offset below its high
        watermark: an open transaction (maybe one of a dead task) holds readers back."""
        admin = admin_client(self.config)
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
        admin = admin_client(self.config)
        try:
            groups = admin.list_consumer_groups(request_timeout=self.timeout).result()
        except KafkaException as exc:
            raise RestartableError(
                f"kafka sink: listing consumer groups at {self.bootstrap} failed: "
                f"{kafka_error(exc)}"
            ) from None
        ids = sorted(
            g.group_id
            for g in groups.valid
            if g.group_id.startswith(prefix + ".") and g.group_id[len(prefix) + 1 :].isdigit()
        )
        errors: list[BaseException] = []

        def one(transactional_id: str) -> None:
            try:
                producer = Producer(self._producer_config(transactional_id))
                producer.init_transactions(self.timeout)
                producer.flush(0)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
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
    """One task's Kafka transaction, committed with its batch marker in ``prepare``."""

    def __init__(self, sink: KafkaSink, task: TaskContext) -> None:
        super().__init__(sink)
        self.task = task
        self.transactional_id = sink.transactional_id(task)
        self.query_id = _query_id()
        self.consumer: Consumer | None = None
        self.skipped = False
        self.open = False
        self._failure: BaseException | None = None
        self._session = threading.Thread(target=self._start_quietly, daemon=True)
        self._session.start()  # overlaps the broker round trips with the task's reading

    def _start_quietly(self) -> None:
        try:
            self._start()
        except BaseException as exc:  # re-raised in the task's thread by _wait
            self._failure = exc

    def _wait(self) -> None:
        """Wait until the session is ready (fenced, marker read); raise what it met."""
        self._session.join()
        if self._failure is not None:
            raise self._failure

    def _start(self) -> None:
        """Fence older instances and look at the marker (in a background thread)."""
        sink = self.sink
        config = {**sink._producer_config(self.transactional_id), "on_delivery": self._on_delivery}
        self.producer = Producer(config)
        try:
            self.producer.init_transactions(sink.timeout)
        except KafkaException as exc:
            raise RestartableError(
                f"kafka sink: init_transactions({self.transactional_id}) failed: {kafka_error(exc)}"
            ) from None
        self.consumer = Consumer(
            {
                **sink.config,
                "group.id": self.transactional_id,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        marker = TopicPartition(sink.marker_topic, 0)
        try:
            found = self.consumer.committed([marker], timeout=sink.timeout)[0]
        except KafkaException as exc:
            raise RestartableError(
                f"kafka sink: reading the batch marker of {self.transactional_id} failed: "
                f"{kafka_error(exc)}"
            ) from None
        if found.offset > REGISTERED and (found.metadata or "") == self.query_id:
            written = found.offset - 1
            if written >= self.task.batch_id:
                log.info(
                    "kafka sink: %s already committed batch %s (marker %s): writing nothing",
                    self.transactional_id,
                    self.task.batch_id,
                    written,
                )
                self.skipped = True
                return
        if found.offset < 0:  # first use of this id: register it, so recovery can fence it
            self.consumer.commit(
                offsets=[TopicPartition(sink.marker_topic, 0, REGISTERED)], asynchronous=False
            )

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Produce the rows inside the transaction (nothing on a replay already written)."""
        if batch.num_rows == 0:
            return
        if not self.open:
            self._wait()
            if self.skipped:
                return
            assert self.producer is not None
            self.producer.begin_transaction()
            self.open = True
        try:
            self._produce(batch)
        except KafkaException as exc:
            raise _transaction_error(self.transactional_id, "produce", exc) from None

    def prepare(self) -> dict[str, Any]:
        """Commit the Kafka transaction with the marker ``batch + 1`` (phase 1 = the Kafka
        commit): records and marker become visible to ``read_committed`` readers together."""
        data = {"transactional_id": self.transactional_id, "batch": self.task.batch_id}
        self._wait()
        if not self.open:
            return {**data, "records": 0, "skipped": self.skipped}
        assert self.producer is not None and self.consumer is not None
        marker = TopicPartition(
            self.sink.marker_topic, 0, self.task.batch_id + 1, metadata=self.query_id
        )
        try:
            self.producer.send_offsets_to_transaction(
                [marker], self.consumer.consumer_group_metadata(), self.sink.timeout
            )
            self.producer.commit_transaction(self.sink.timeout)
        except KafkaException as exc:
            raise _transaction_error(self.transactional_id, "commit", exc) from None
        self.open = False
        self._raise_delivery_errors()
        return {**data, "records": self.rows, "skipped": False}

    def abort(self) -> None:
        """Abort the open transaction (best effort: the next ``init_transactions`` of this id
        aborts it anyway)."""
        self._session.join()
        if self.open and self.producer is not None:
            try:
                self.producer.abort_transaction(self.sink.timeout)
            except KafkaException as exc:
                log.warning("kafka sink: abort of %s failed: %s", self.transactional_id, exc)
            self.open = False

    def close(self) -> None:
        """Release the producer and the marker consumer."""
        self._session.join()
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        self.producer = None


def _transaction_error(transactional_id: str, step: str, exc: KafkaException) -> Exception:
    error = kafka_error(exc)
    text = f"kafka sink: {step} of transaction {transactional_id} failed: {error}"
    if error.fatal():
        return RuntimeError(
            f"{text}. The id was fenced: a newer attempt of this task took over (this attempt "
            "is a zombie and stops)."
        )
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
