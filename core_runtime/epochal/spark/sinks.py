"""Stream writers for transactional and idempotent sinks."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext as SparkTaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from epochal.protocols import keys
from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.spark.common import Part, protocol_step
from epochal_sdk import (
    Guarantee,
    IdempotentSink,
    Prepared,
    Schema,
    TaskContext,
    TransactionalSink,
    transaction_prefix,
)

log = logging.getLogger("epochal.sink")

KEEP_BATCHES = 100
"""How many batches of sink records (decisions, key digests) the store keeps."""


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports to the driver."""

    prepared: Prepared | None = None
    records: int = 0
    skipped: bool = False


def _task(part: Part, schema: Schema) -> TaskContext:
    spark_task = SparkTaskContext.get()
    batch = spark_task.getLocalProperty("streaming.sql.batchId") if spark_task else None
    return TaskContext(
        job=part.context.job,
        sink_id=part.part_id,
        batch_id=int(batch) if batch is not None else 0,
        partition=spark_task.partitionId() if spark_task else 0,
        attempt=spark_task.attemptNumber() if spark_task else 0,
        schema=schema,
        run=part.context.run,
    )


def two_phase(part: Part, sink: TransactionalSink) -> TwoPhaseCommit:
    """The 2PC driver for one sink of a job. Without a snapshot store (a query run outside
    epochal at less than exactly-once) decisions live nowhere, so only stray roll-back works."""
    store = (
        part.context.store(part.connector)
        if part.context.job_dir or part.guarantee == Guarantee.EXACTLY_ONCE
        else None
    )
    return TwoPhaseCommit(
        store,
        sink,
        part.part_id,
        transaction_prefix(part.context.job, part.part_id),
        run=part.context.run,
        step=part.context.reach,
        fence=part.context.check_fence,
        lease_epoch=part.context.lease_epoch,
    )


class TransactionalWriter(DataSourceStreamArrowWriter):
    """Two-phase commit: tasks prepare, the driver decides durably, then commits."""

    def __init__(self, part: Part, schema: Schema) -> None:
        self.part = part
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        task = _task(self.part, self.schema)
        with protocol_step(self.part, task.batch_id, f"task {task.partition} write+prepare"):
            return self._write(task, iterator)

    def _write(self, task: TaskContext, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        sink: TransactionalSink = self.part.build_sink()
        try:
            exactly_once = self.part.guarantee == Guarantee.EXACTLY_ONCE
            if exactly_once and two_phase(self.part, sink).is_decided(task.batch_id):
                for _ in iterator:  # replay of a decided batch: write nothing
                    pass
                return SinkCommitMessage(skipped=True)
            txn = sink.begin(task)
            records = 0
            try:
                for batch in iterator:
                    txn.write(batch)
                    records += batch.num_rows
                self.part.context.reach("sink.after_write", task.batch_id)
                data = txn.prepare()
            except BaseException:
                txn.abort()
                raise
            finally:
                txn.close()
            prepared = Prepared(task.transaction_id, data)
            self.part.context.reach("sink.after_prepare", task.batch_id)
            if not exactly_once:  # at-least-once: commit at once, no decision
                sink.commit(prepared)
                return SinkCommitMessage(records=records)
            return SinkCommitMessage(prepared=prepared, records=records)
        finally:
            sink.close()

    def commit(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:
        with protocol_step(self.part, batchId, "decide + phase-2 commit"):
            self._commit(messages, batchId)

    def _commit(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:
        sink: TransactionalSink = self.part.build_sink()
        try:
            protocol = two_phase(self.part, sink)
            if self.part.guarantee == Guarantee.EXACTLY_ONCE:
                protocol.commit_batch(batchId, [m.prepared for m in messages if m and m.prepared])
                if batchId % 10 == 0:
                    protocol.prune(batchId - KEEP_BATCHES)
            else:  # tasks committed their own transactions; drop those of dead attempts
                protocol.rollback_strays(batchId)
        finally:
            sink.close()
        self.part.context.reach("sink.after_commit", batchId)

    def abort(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:
        if self.part.guarantee != Guarantee.EXACTLY_ONCE:
            return
        sink: TransactionalSink = self.part.build_sink()
        try:
            prepared = [m.prepared for m in messages if m is not None]
            two_phase(self.part, sink).abort_batch(batchId, prepared)
        finally:
            sink.close()


class IdempotentWriterAdapter(DataSourceStreamArrowWriter):
    """Upserts by key, flushed before the task returns; key stability checked on replay."""

    def __init__(self, part: Part, schema: Schema) -> None:
        self.part = part
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        task = _task(self.part, self.schema)
        with protocol_step(self.part, task.batch_id, f"task {task.partition} upsert+flush"):
            return self._write(task, iterator)

    def _write(self, task: TaskContext, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        sink: IdempotentSink = self.part.build_sink()
        digest = keys.KeyDigest()
        key_columns = sink.key_columns()
        records = 0
        try:
            writer = sink.open(task)
            try:
                for batch in iterator:
                    writer.write(batch)
                    digest.add_batch(batch, key_columns)
                    records += batch.num_rows
                self.part.context.reach("sink.after_write", task.batch_id)
                writer.flush()
            finally:
                writer.close()
            self.part.context.reach("sink.after_flush", task.batch_id)
            if self.part.context.job_dir and self.part.guarantee == Guarantee.EXACTLY_ONCE:
                store = self.part.context.store(self.part.connector)
                keys.check_and_record(
                    store, self.part.part_id, task.batch_id, task.partition, digest
                )
            return SinkCommitMessage(records=records)
        finally:
            sink.close()

    def commit(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:
        if self.part.context.job_dir and batchId % 10 == 0:
            keys.prune(
                self.part.context.store(self.part.connector), self.part.part_id, batchId - 10
            )
        self.part.context.reach("sink.after_commit", batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("%s: batch %s aborted; upserts already written stay", self.part.label, batchId)
