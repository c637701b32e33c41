"""Stream writers for transactional and idempotent sinks, and the one place that wires each
sink contract to the runtime (:data:`CONTRACTS`: which writer Spark gets, what runs at the
start of a run)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from epochal.metrics import recording
from epochal.protocols import keys
from epochal.protocols.transactions import ScopedSink, two_phase_commit
from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.spark.common import Part, SparkTask, protocol_step
from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    Prepared,
    Schema,
    TransactionalSink,
)
from epochal_sdk.sinks import Sink

log = logging.getLogger("epochal.sink")

KEEP_BATCHES = 100
"""How many batches of sink records (decisions, key digests) the store keeps."""


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports to the driver: its prepared transaction (exactly-once
    transactional), and what it measured (records, bytes, timings, the connector's own
    metrics)."""

    prepared: Prepared | None = None
    records: int = 0
    skipped: bool = False
    bytes: int = 0
    values: dict[str, float] = field(default_factory=dict)


def _task(part: Part, schema: Schema) -> ConnectorContext:
    """The context of a sink's task: the ``task`` its ``begin``/``open`` gets, and the context
    of the sink object built for it (its batch, partition, attempt and schema)."""
    context = part.connector_context(task=SparkTask.current(), schema=schema)
    if context.batch is None or context.partition is None:  # outside a streaming query
        context = replace(context, batch=context.batch or 0, partition=context.partition or 0)
    return context


def two_phase(part: Part, sink: TransactionalSink) -> TwoPhaseCommit:
    """The 2PC driver for one sink of a job (its ``sink`` is the :class:`ScopedSink` that
    hands each ``in_doubt`` its scope and counts what is settled). Without a snapshot store
    (a query run outside epochal at less than exactly-once) decisions live nowhere, so only
    stray roll-back works."""
    store = (
        part.context.store(part.connector)
        if part.context.job_dir or part.guarantee == Guarantee.EXACTLY_ONCE
        else None
    )
    protocol, _ = two_phase_commit(
        store,
        sink,
        part.context.job,
        part.part_id,
        incarnation=part.context.incarnation,
        # a run that holds no lease has no place among the job's runs: its recovery rolls
        # back every in-doubt transaction of the sink (at less than exactly-once only)
        run=part.context.run if part.context.fence.active else None,
        step=part.context.reach,
        fence=part.context.check_fence,
        lease_epoch=part.context.lease_epoch,
    )
    return protocol


def _settled(protocol: TwoPhaseCommit) -> dict[str, float]:
    """What the protocol's sink counted (in-doubt found, committed, rolled back)."""
    scoped = protocol.sink
    counts = scoped.drain() if isinstance(scoped, ScopedSink) else {}
    counts.pop("commit_seconds", None)  # phase 2 is timed as a whole
    return counts


def _collected(messages: list[Any]) -> dict[str, float]:
    """The tasks' measurements of one batch, summed."""
    values = {"records_out": 0.0, "bytes_out": 0.0}
    for message in messages:
        if not isinstance(message, SinkCommitMessage):
            continue
        values["records_out"] += message.records
        values["bytes_out"] += message.bytes
        if message.skipped:
            recording.add(values, {"replays_skipped": 1})
        recording.add(values, message.values)
    return values


def _task_values(context: ConnectorContext, timings: dict[str, float]) -> dict[str, float]:
    return recording.add(timings, recording.connector_values(context.metrics.drain()))


class TransactionalWriter(DataSourceStreamArrowWriter):
    """Two-phase commit: tasks prepare, the driver decides durably, then commits."""

    def __init__(self, part: Part, schema: Schema) -> None:
        self.part = part
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        task = _task(self.part, self.schema)
        with protocol_step(self.part, task.batch, f"task {task.partition} write+prepare"):
            return self._write(task, iterator)

    def _write(
        self, task: ConnectorContext, iterator: Iterator[pa.RecordBatch]
    ) -> SinkCommitMessage:
        sink: TransactionalSink = self.part.build_sink(task)
        timings: dict[str, float] = {}
        try:
            exactly_once = self.part.guarantee == Guarantee.EXACTLY_ONCE
            if exactly_once and two_phase(self.part, sink).is_decided(task.txn.batch):
                for _ in iterator:  # replay of a decided batch: write nothing
                    pass
                return SinkCommitMessage(skipped=True)
            records = size = 0
            with recording.timed(timings, "write"):
                txn = sink.begin(task)
                try:
                    for batch in iterator:
                        txn.write(batch)
                        records += batch.num_rows
                        size += batch.nbytes
                    self.part.context.reach("sink.after_write", task.batch)
                    if exactly_once:  # a task of a driver that lost the job prepares nothing
                        self.part.context.check_fence(
                            f"batch {task.batch}: task {task.partition} preparing"
                        )
                    with recording.timed(timings, "prepare"):
                        data = txn.prepare()
                except BaseException:
                    txn.abort()
                    raise
                finally:
                    txn.close()
            prepared = Prepared(str(task.txn), data)
            self.part.context.reach("sink.after_prepare", task.batch)
            if not exactly_once:  # at-least-once: commit at once, no decision
                with recording.timed(timings, "commit"):
                    sink.commit(prepared)
                recording.add(timings, {"committed": 1})
                return SinkCommitMessage(
                    records=records, bytes=size, values=_task_values(task, timings)
                )
            return SinkCommitMessage(
                prepared=prepared,
                records=records,
                bytes=size,
                values=_task_values(task, timings),
            )
        finally:
            sink.close()

    def commit(  # type: ignore[override]  # Spark hands back what write() returned
        self, messages: list[SinkCommitMessage | None], batchId: int
    ) -> None:
        with protocol_step(self.part, batchId, "decide + phase-2 commit"):
            self._commit(messages, batchId)

    def _commit(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:
        context = self.part.connector_context(batch=batchId)
        sink: TransactionalSink = self.part.build_sink(context)
        values = _collected(messages)
        try:
            protocol = two_phase(self.part, sink)
            if self.part.guarantee == Guarantee.EXACTLY_ONCE:
                prepared = [m.prepared for m in messages if m and m.prepared]
                with recording.timed(values, "decide"):
                    protocol.decide(batchId, prepared)
                with recording.timed(values, "commit"):
                    protocol.complete(batchId)
                if batchId % 10 == 0:
                    protocol.prune(batchId - KEEP_BATCHES)
            else:  # tasks committed their own transactions; drop those of dead attempts
                protocol.rollback_strays(batchId)
            recording.add(values, _settled(protocol))
        finally:
            sink.close()
            recording.add(values, recording.connector_values(context.metrics.drain()))
            self.part.report("sink", batchId, values)
        self.part.context.reach("sink.after_commit", batchId)

    def abort(  # type: ignore[override]  # Spark hands back what write() returned
        self, messages: list[SinkCommitMessage | None], batchId: int
    ) -> None:
        if self.part.guarantee != Guarantee.EXACTLY_ONCE:
            return
        sink: TransactionalSink = self.part.build_sink(self.part.connector_context(batch=batchId))
        try:
            prepared = [m.prepared for m in messages if m is not None]
            protocol = two_phase(self.part, sink)
            protocol.abort_batch(batchId, prepared)
            self.part.report("sink", batchId, _settled(protocol))
        finally:
            sink.close()


class IdempotentWriterAdapter(DataSourceStreamArrowWriter):
    """Upserts by key, flushed before the task returns; key stability checked on replay."""

    def __init__(self, part: Part, schema: Schema) -> None:
        self.part = part
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        task = _task(self.part, self.schema)
        with protocol_step(self.part, task.batch, f"task {task.partition} upsert+flush"):
            return self._write(task, iterator)

    def _write(
        self, task: ConnectorContext, iterator: Iterator[pa.RecordBatch]
    ) -> SinkCommitMessage:
        sink: IdempotentSink = self.part.build_sink(task)
        digest = keys.KeyDigest()
        key_columns = sink.key_columns()
        records = size = 0
        timings: dict[str, float] = {}
        try:
            with recording.timed(timings, "write"):
                writer = sink.open(task)
                try:
                    for batch in iterator:
                        writer.write(batch)
                        digest.add_batch(batch, key_columns)
                        records += batch.num_rows
                        size += batch.nbytes
                    self.part.context.reach("sink.after_write", task.batch)
                    with recording.timed(timings, "flush"):
                        writer.flush()
                finally:
                    writer.close()
            self.part.context.reach("sink.after_flush", task.batch)
            if self.part.context.job_dir and self.part.guarantee == Guarantee.EXACTLY_ONCE:
                store = self.part.context.store(self.part.connector)
                txn = task.txn  # a task's: its batch and partition are set
                keys.check_and_record(store, self.part.part_id, txn.batch, txn.partition, digest)
            return SinkCommitMessage(
                records=records, bytes=size, values=_task_values(task, timings)
            )
        finally:
            sink.close()

    def commit(  # type: ignore[override]  # Spark hands back what write() returned
        self, messages: list[SinkCommitMessage | None], batchId: int
    ) -> None:
        if self.part.context.job_dir and batchId % 10 == 0:
            keys.prune(
                self.part.context.store(self.part.connector), self.part.part_id, batchId - 10
            )
        self.part.report("sink", batchId, _collected(messages))
        self.part.context.reach("sink.after_commit", batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("%s: batch %s aborted; upserts already written stay", self.part.label, batchId)


# -- the wiring of each contract --------------------------------------------------------------
@dataclass(frozen=True)
class SinkContract:
    """How the runtime drives one sink contract: the Spark writer of a query's sink, and
    what happens once at the start of every run (after ``check``, before any task)."""

    name: str
    contract: type[Sink]
    writer_class: type[DataSourceStreamWriter]

    def writer(self, part: Part, fields: Schema) -> DataSourceStreamWriter:
        """The writer Spark gets for this part."""
        return self.writer_class(part, fields)  # type: ignore[call-arg]

    def start_run(self, part: Part, sink: Sink) -> str:
        """Recovery at the start of a run: a transactional sink finishes the decided batches
        and rolls back every other in-doubt transaction of earlier runs (two-phase commit);
        an idempotent sink has nothing to settle. Returns what was done, for the job's log."""
        if self.name != "transactional":
            return ""
        assert isinstance(sink, TransactionalSink)
        values: dict[str, float] = {}
        protocol = two_phase(part, sink)
        with recording.timed(values, "recover"):
            report = protocol.recover()
        part.report("sink", None, recording.add(values, _settled(protocol)))
        return f"{report} {report.rolled_back}"


CONTRACTS = {
    "transactional": SinkContract("transactional", TransactionalSink, TransactionalWriter),
    "idempotent": SinkContract("idempotent", IdempotentSink, IdempotentWriterAdapter),
}
"""Every sink contract by the name ``Sink.sink_mode()`` returns."""


def contract_of(part: Part, sink: Sink) -> SinkContract:
    """The contract the runtime drives for ``sink`` (its ``sink_mode()``); a clear error for a
    sink that implements none, or names one it does not implement."""
    supported = [c.name for c in CONTRACTS.values() if isinstance(sink, c.contract)]
    if not supported:
        raise TypeError(f"{part.label}: {type(sink).__name__} implements no sink contract")
    mode = sink.sink_mode()
    if mode not in supported:
        raise ConfigError(
            part.connector,
            "mode",
            f"{mode!r} is not a contract {type(sink).__name__} implements",
            f"Use one of: {', '.join(supported)}.",
        )
    return CONTRACTS[mode]
