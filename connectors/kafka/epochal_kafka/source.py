"""A replayable source over Kafka topics: one partition id per ``topic:partition``."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

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
    Offsets,
    Options,
    ReplayableSource,
    RestartableError,
    SnapshotError,
    Split,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("epochal.kafka.source")


@functools.cache
def arrow_schema() -> pa.Schema:
    """The source's rows as Arrow batches (:data:`SCHEMA`), built where records are read
    (pyarrow imported there: docs/authors/connectors.md, "Where the code runs")."""
    import pyarrow as pa

    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", headers),
        ]
    )


SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)
CHUNK_ROWS = 20_000
"""Rows per Arrow record batch a task yields."""

EARLIEST, LATEST = -2, -1


CONSUME_WAIT = 0.05
"""Seconds a read waits in one ``consume()`` call for the records it asked for. A range that
ends in a transaction marker holds fewer records than offsets, so the last call of such a read
waits this long before the client's position shows the range is done."""

FETCH_QUEUE_BACKOFF_MS = 10
"""The readers' ``fetch.queue.backoff.ms`` unless ``kafka.fetch.queue.backoff.ms`` is given.
librdkafka (2.4+) pauses fetching a partition for that long (default 1000 ms) once its local
queue holds ``queued.min.messages`` (100 000): a task reading more than that waited out the
pause again and again (300 000 records of one partition: 1.3-2.3 s, with 10 ms 0.5-0.6 s)."""


def partition_id(topic: str, partition: int) -> str:
    """``topic:partition`` (``:`` never occurs in a topic name)."""
    return f"{topic}:{partition}"


def parse_partition_id(pid: str) -> tuple[str, int]:
    """``(topic, partition)`` of a partition id."""
    topic, _, number = pid.rpartition(":")
    return topic, int(number)


class DataLossError(SnapshotError):
    """Offsets a batch must read are gone (retention, a deleted or recreated topic)."""


class KafkaSource(ReplayableSource):
    """Reads Kafka topics; offsets (the next offset per ``topic:partition``) live in the
    snapshot, and a batch re-reads exactly its range ``[start, end)``.

    Options: ``kafka.bootstrap.servers`` (required; every ``kafka.*`` option goes to
    librdkafka), ``subscribe`` (comma-separated topics) or ``subscribePattern`` (a regular
    expression over topic names), ``startingOffsets`` (``earliest``, ``latest`` or JSON
    ``{"topic": {"0": 42, "1": -2}}``, -2 earliest, -1 latest), ``startingTimestamp`` (ms since
    the epoch, for every partition), ``maxRecordsPerBatch`` (alias ``maxOffsetsPerTrigger``),
    ``minPartitions`` (split large ranges into more Spark tasks), ``failOnDataLoss`` (default
    true), ``readTimeoutMs`` (a task that makes no progress this long fails restartably,
    default 120000), ``metadataTimeoutMs`` (default 30000).

    The isolation level is ``read_committed`` unless ``kafka.isolation.level`` says otherwise:
    "end" offsets are then last stable offsets and a range may hold fewer records than
    ``end - start`` (aborted records and transaction markers are skipped).
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        config = client_config(options)
        config.setdefault("isolation.level", "read_committed")
        self.config = config
        self.bootstrap = str(config["bootstrap.servers"])
        self.read_committed = str(config["isolation.level"]).lower() == "read_committed"
        topics = [t.strip() for t in options.str("subscribe", "").split(",") if t.strip()]
        pattern = options.str("subscribePattern", "").strip()
        if bool(topics) == bool(pattern):
            raise ConfigError(
                CONNECTOR,
                "subscribe",
                "give exactly one of 'subscribe' and 'subscribePattern'",
                "Set .option('subscribe', 'topic1,topic2') or "
                ".option('subscribePattern', 'orders-.*').",
            )
        self.topics = topics
        try:
            self.pattern = re.compile(pattern) if pattern else None
        except re.error as exc:
            raise ConfigError(
                CONNECTOR,
                "subscribePattern",
                f"{pattern!r} is not a regular expression: {exc}",
                "Give a Python regular expression matched against whole topic names.",
            ) from None
        self.starting = self._parse_starting(options)
        self.fail_on_data_loss = options.bool("failOnDataLoss", True)
        self.min_partitions = options.int("minPartitions", None, minimum=1)
        self.read_timeout = (options.int("readTimeoutMs", 120_000, minimum=1) or 120_000) / 1e3
        self.metadata_timeout = (
            options.int("metadataTimeoutMs", 30_000, minimum=1) or 30_000
        ) / 1e3
        self.max_records_per_batch()
        self._admin: Any = None

    @staticmethod
    def _parse_starting(options: Options) -> Any:
        timestamp = options.int("startingTimestamp", None, minimum=0)
        raw = options.str("startingOffsets", "").strip()
        if timestamp is not None and raw:
            raise ConfigError(
                CONNECTOR,
                "startingTimestamp",
                "is given together with 'startingOffsets'",
                "Give only one of them.",
            )
        if timestamp is not None:
            return ("timestamp", timestamp)
        if raw.lower() in ("", "earliest", "latest"):
            return raw.lower() or "earliest"
        try:
            spec = json.loads(raw)
            parsed = {
                str(topic): {int(p): int(o) for p, o in parts.items()}
                for topic, parts in spec.items()
            }
        except (ValueError, AttributeError, TypeError):
            raise ConfigError(
                CONNECTOR,
                "startingOffsets",
                f"{raw!r} is not earliest, latest or JSON offsets",
                'Use earliest, latest or {"topic": {"0": 42, "1": -2}} (-2 = earliest, '
                "-1 = latest).",
            ) from None
        return parsed

    # -- metadata -------------------------------------------------------------------------

    @property
    def admin(self) -> Any:
        """The admin client (driver side), created on first use."""
        if self._admin is None:
            self._admin = admin_client(self.config)
        return self._admin

    def schema(self) -> str:
        """Kafka records: key and value as binary, headers as an array of (key, value)."""
        return SCHEMA

    def max_records_per_batch(self) -> int | None:
        """``maxRecordsPerBatch`` (or Spark's name ``maxOffsetsPerTrigger``)."""
        return self.options.int("maxRecordsPerBatch", None, minimum=1) or self.options.int(
            "maxOffsetsPerTrigger", None, minimum=1
        )

    def _metadata(self, at_start: bool = False) -> dict[str, int]:
        """Partition count of every subscribed topic that exists now."""
        metadata = list_topics(self.admin, self.bootstrap, self.metadata_timeout, at_start=at_start)
        found = {}
        for name, topic in metadata.topics.items():
            if topic.error is not None or not topic.partitions:
                continue
            wanted = (
                name in self.topics
                if self.pattern is None
                else (not name.startswith("__") and self.pattern.fullmatch(name) is not None)
            )
            if wanted:
                found[name] = len(topic.partitions)
        return found

    def check(self) -> None:
        """Fail on bad options, an unreachable cluster or a subscribed topic that is missing."""
        found = self._metadata(at_start=True)
        missing = [t for t in self.topics if t not in found]
        if missing:
            raise ConfigError(
                CONNECTOR,
                "subscribe",
                f"topic(s) {missing} do not exist at {self.bootstrap}",
                "Create them first or fix the names (or use 'subscribePattern' to pick up "
                "topics created later).",
            )
        if self.pattern is not None and not found:
            log.warning(
                "kafka source: no topic matches %r yet; partitions are picked up when they appear",
                self.pattern.pattern,
            )

    def partitions(self) -> list[str]:
        """Every ``topic:partition`` of the subscribed topics."""
        found = self._metadata()
        return sorted(partition_id(t, p) for t, n in found.items() for p in range(n))

    # -- offsets --------------------------------------------------------------------------

    def _list_offsets(self, specs: dict[str, Any]) -> dict[str, int]:
        """Offsets by partition id for ``{pid: OffsetSpec}`` in one admin request."""
        if not specs:
            return {}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        request = {TopicPartition(*parse_partition_id(p)): s for p, s in specs.items()}
        try:
            futures = self.admin.list_offsets(
                request, isolation_level=isolation, request_timeout=self.metadata_timeout
            )
            return {
                partition_id(tp.topic, tp.partition): future.result().offset
                for tp, future in futures.items()
            }
        except KafkaException as exc:
            raise RestartableError(
                f"kafka source: listing offsets at {self.bootstrap} failed: {kafka_error(exc)}"
            ) from None

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        """Where reading starts. ``startingOffsets``/``startingTimestamp`` apply to the
        partitions of the job's first batch; a partition discovered later (a new topic or
        partition) starts at its earliest offset, so none of its records is skipped."""
        wanted = list(partitions)
        at_job_start = set(wanted) >= set(self.partitions())
        starting = self.starting if at_job_start else "earliest"
        earliest = self._list_offsets({p: OffsetSpec.earliest() for p in wanted})
        if starting == "earliest":
            return earliest
        latest = self.latest_offsets(wanted)
        if starting == "latest":
            return latest
        if isinstance(starting, tuple):  # ("timestamp", ms)
            found = self._list_offsets({p: OffsetSpec.for_timestamp(starting[1]) for p in wanted})
            return {p: latest[p] if found[p] < 0 else max(found[p], earliest[p]) for p in wanted}
        assert isinstance(starting, dict)  # per topic and partition (KafkaSource.starting)
        out = {}
        for p in wanted:
            topic, number = parse_partition_id(p)
            given = starting.get(topic, {}).get(number, EARLIEST)
            out[p] = earliest[p] if given == EARLIEST else latest[p] if given == LATEST else given
        return out

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        """The end of each partition: the last stable offset under ``read_committed`` (every
        record before it is decided, so the range is final), else the high watermark."""
        return self._list_offsets({p: OffsetSpec.latest() for p in partitions})

    def splits(self, start: Offsets, end: Offsets) -> list[Split]:
        """One split per partition with data; more when ``minPartitions`` asks for them.
        Partitions whose offsets moved backwards or vanished are data loss."""
        current = set(self.partitions()) if set(start) else set()
        for pid, offset in start.items():
            if pid not in current:
                self._data_loss(
                    f"partition {pid} is gone (topic deleted?) with reading position {offset}",
                    None,
                )
            elif pid in end and int(end[pid]) < int(offset):
                self._data_loss(
                    f"partition {pid} ends at {end[pid]}, before the reading position {offset} "
                    "(topic recreated?)",
                    None,
                )
        ranges = [
            (p, int(start[p]), int(end[p]))
            for p in sorted(end)
            if p in start and p in current and int(end[p]) > int(start[p])
        ]
        if self.min_partitions and len(ranges) < self.min_partitions:
            return _split_ranges(ranges, self.min_partitions)
        return [Split(p, s, e) for p, s, e in ranges]

    def _data_loss(self, what: str, lost: int | None) -> None:
        count = "an unknown number of" if lost is None else str(lost)
        if self.fail_on_data_loss:
            raise DataLossError(
                f"kafka source: {what}: {count} record(s) this job has not read are gone "
                "(retention, a deleted or recreated topic). Set .option('failOnDataLoss', "
                "'false') to skip them (they are counted in the log), or start a new job."
            )
        log.warning(
            "kafka source: %s: skipping %s lost record(s) (failOnDataLoss=false)", what, count
        )

    # -- reading --------------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "group.id": "epochal-reader",
                "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                **self.config,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
            }
        )

    def min_records_per_task(self) -> int:
        """``minRecordsPerTask`` (the SDK's default), or 0 when ``minPartitions`` cuts large
        ranges into more tasks: those splits are never put back together."""
        return 0 if self.min_partitions else super().min_records_per_task()

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        """The records of ``[start, end)`` of one partition (:meth:`read_splits`)."""
        return self.read_splits([split])

    def read_splits(self, splits: Sequence[Split]) -> Iterator[pa.RecordBatch]:
        """The records of the splits' ranges ``[start, end)``, read together by one consumer
        assigned to every partition at its start, until each partition's position reaches its
        end (control records and aborted records are skipped by the client, so a position can
        jump over offsets). Each Arrow batch holds records of one partition, in order.
        Splits of one partition (``minPartitions``) are read one after the other."""
        ranges = [(*parse_partition_id(s.partition), int(s.start), int(s.end)) for s in splits]
        if len({(topic, number) for topic, number, _, _ in ranges}) < len(ranges):
            for one in ranges:
                yield from self._read_ranges([one])
            return
        yield from self._read_ranges(ranges)

    def _read_ranges(self, ranges: list[tuple[str, int, int, int]]) -> Iterator[pa.RecordBatch]:
        ranges = [r for r in ranges if r[2] < r[3]]
        if not ranges:
            return
        consumer = self._consumer()
        try:
            yield from _Reading(self, consumer, ranges).batches()
        finally:
            consumer.close()

    def log_start(self, consumer: Consumer, topic: str, number: int) -> int | None:
        """The first offset the broker still has of ``topic:number`` (None: the partition is
        gone), asked when a read found its position out of range."""
        deadline = time.monotonic() + self.read_timeout
        while True:
            try:
                low, _ = consumer.get_watermark_offsets(
                    TopicPartition(topic, number), timeout=self.metadata_timeout, cached=False
                )
                return int(low)
            except KafkaException as exc:
                error = kafka_error(exc)
                if error.code() in GONE:
                    return None
                if not is_transient(error) or time.monotonic() > deadline:
                    raise RestartableError(
                        f"kafka source: {topic}:{number}: querying offsets failed: {error}"
                    ) from None
                time.sleep(0.5)  # a leader election or a broker restart: ask again


GONE = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION)
"""Errors that say a partition no longer exists."""


class _Partition:
    """One partition being read: where it is, where it ends, its records so far."""

    def __init__(self, topic: str, number: int, start: int, end: int) -> None:
        self.topic, self.number, self.position, self.end = topic, number, start, end
        self.done = False
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self.offsets: list[int] = []
        self.times: list[int] = []
        self.types: list[int] = []
        self.headers: list[Any] = []

    def add(self, message: Any) -> None:
        kind, stamp = message.timestamp()
        self.keys.append(message.key())
        self.values.append(message.value())
        self.offsets.append(message.offset())
        self.times.append(stamp)
        self.types.append(kind)
        self.headers.append(message.headers())

    def take(self) -> pa.RecordBatch:
        """The records so far as an Arrow batch (and forget them)."""
        batch = _to_batch(
            self.topic,
            self.number,
            self.keys,
            self.values,
            self.offsets,
            self.times,
            self.types,
            self.headers,
        )
        self.keys, self.values, self.offsets = [], [], []
        self.times, self.types, self.headers = [], [], []
        return batch


class _Reading:
    """One task's read of its partitions' ranges with one consumer."""

    def __init__(
        self, source: KafkaSource, consumer: Consumer, ranges: list[tuple[str, int, int, int]]
    ) -> None:
        self.source, self.consumer = source, consumer
        self.parts = {(t, n): _Partition(t, n, s, e) for t, n, s, e in ranges}
        self.pending = dict(self.parts)

    def batches(self) -> Iterator[pa.RecordBatch]:
        self.consumer.assign(
            [TopicPartition(p.topic, p.number, p.position) for p in self.parts.values()]
        )
        last_progress = time.monotonic()
        while self.pending:
            before = sum(p.position for p in self.pending.values())
            # ask for no more than the ranges still hold: consume() returns once it has that
            # many (else only at its timeout, which every small batch would wait out)
            left = sum(p.end - p.position for p in self.pending.values())
            wanted = max(1, min(CHUNK_ROWS, 10_000, left))
            for message in self.consumer.consume(num_messages=wanted, timeout=CONSUME_WAIT):
                self._take(message)
            self._check_positions()
            for part in self.parts.values():
                if len(part.offsets) >= CHUNK_ROWS or (part.done and part.offsets):
                    yield part.take()
            if not self.pending:
                break
            if sum(p.position for p in self.pending.values()) != before:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.source.read_timeout:
                stuck = next(iter(self.pending.values()))
                raise RestartableError(
                    f"kafka source: {stuck.topic}:{stuck.number}: no progress for "
                    f"{self.source.read_timeout:g}s at offset {stuck.position} (reading up to "
                    f"{stuck.end}); broker down?"
                )

    def _finish(self, part: _Partition) -> None:
        part.done = True
        self.pending.pop((part.topic, part.number), None)
        if self.pending:  # no more fetching for it while the others are read
            with contextlib.suppress(KafkaException):
                self.consumer.pause([TopicPartition(part.topic, part.number)])

    def _take(self, message: Any) -> None:
        part = self.pending.get((message.topic(), message.partition()))
        error = message.error()
        if error is not None:
            if part is None:
                if error.code() != KafkaError._PARTITION_EOF and not is_transient(error):
                    self._fail(message, error)
                return
            if error.code() == KafkaError._PARTITION_EOF:
                if message.offset() >= part.end:
                    self._finish(part)
                return
            self._on_error(part, error)
            return
        if part is None:
            return  # fetched before its range was done
        offset = message.offset()
        if offset >= part.end:
            self._finish(part)
            return
        part.add(message)
        part.position = offset + 1
        if part.position >= part.end:
            self._finish(part)

    def _check_positions(self) -> None:
        """The client's position passes control and aborted records it skipped, so it
        reaches a range's end when the range ends in a transaction marker."""
        if not self.pending:
            return
        asked = [TopicPartition(p.topic, p.number) for p in self.pending.values()]
        for found in self.consumer.position(asked):
            part = self.pending.get((found.topic, found.partition))
            if part is not None and found.offset is not None and found.offset >= part.end:
                self._finish(part)

    def _on_error(self, part: _Partition, error: KafkaError) -> None:
        """An error event while reading ``part``."""
        source = self.source
        if error.code() == KafkaError._AUTO_OFFSET_RESET or error.code() in GONE:
            low = (
                None
                if error.code() in GONE
                else source.log_start(self.consumer, part.topic, part.number)
            )
            name = f"{part.topic}:{part.number}"
            if low is None:
                source._data_loss(f"partition {name} is gone", part.end - part.position)
                self._finish(part)
                return
            if low <= part.position:  # a reset without a loss: read on from where it was
                self._reassign()
                return
            lost = min(low, part.end) - part.position
            source._data_loss(
                f"{name}: offsets {part.position}..{min(low, part.end) - 1} were deleted "
                f"(the log now starts at {low})",
                lost,
            )
            part.position = min(low, part.end)
            if part.position >= part.end:
                self._finish(part)
            else:
                self._reassign()
            return
        if is_transient(error):
            return
        raise RuntimeError(f"kafka source: reading {part.topic}:{part.number} failed: {error}")

    def _reassign(self) -> None:
        """Assign the partitions still read again, each at its position: after an offset
        reset error the client refuses a seek of that partition (an erroneous state)."""
        self.consumer.assign(
            [TopicPartition(p.topic, p.number, p.position) for p in self.pending.values()]
        )

    def _fail(self, message: Any, error: KafkaError) -> None:
        raise RuntimeError(
            f"kafka source: reading {message.topic()}:{message.partition()} failed: {error}"
        )


def _to_batch(
    topic: str,
    number: int,
    keys: list[Any],
    values: list[Any],
    offsets: list[int],
    times: list[int],
    types: list[int],
    headers: list[Any],
) -> pa.RecordBatch:
    """Consumed records as an Arrow batch in the source's schema."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    count = len(offsets)
    stamps = pc.multiply(pa.array(times, pa.int64()), 1000).cast(schema.field(5).type)
    header_type = schema.field(7).type
    if any(h is not None for h in headers):
        header_array = pa.array(
            [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
            type=header_type,
        )
    else:
        header_array = pa.nulls(count, header_type)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([number] * count, pa.int32()),
        pa.array(offsets, pa.int64()),
        stamps,
        pa.array(types, pa.int32()),
        header_array,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _split_ranges(ranges: list[tuple[str, int, int]], wanted: int) -> list[Split]:
    """Cut ``(partition, start, end)`` ranges into about ``wanted`` splits, in proportion to
    their sizes (every range keeps at least one split)."""
    total = sum(e - s for _, s, e in ranges)
    out = []
    for pid, start, end in ranges:
        pieces = max(1, round(wanted * (end - start) / total)) if total else 1
        step = -(-(end - start) // pieces)
        out += [Split(pid, low, min(low + step, end)) for low in range(start, end, step)]
    return out
