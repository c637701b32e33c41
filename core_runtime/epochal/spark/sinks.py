"""Stream writers for transactional and idempotent sinks as Spark's Python data source sinks,
and the one place that wires each sink contract to them (:data:`CONTRACTS`: which writer
Spark gets, what runs at the start of a run). The contracts' steps themselves are in
:mod:`epochal.spark.sink_steps`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from epochal.spark import features, sink_steps
from epochal.spark.common import Part, protocol_step
from epochal.spark.sink_steps import TaskOutcome
from epochal_sdk import Schema
from epochal_sdk.sinks import Sink

log = logging.getLogger("epochal.sink")

if TYPE_CHECKING:  # checked against the newest pyspark
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriter
else:  # DataSourceStreamArrowWriter where pyspark has it (epochal.spark.features); without
    # it the writers get rows and turn them into Arrow record batches
    _StreamWriter = features.stream_writer_base()


@dataclass
class SinkCommitMessage(TaskOutcome, WriterCommitMessage):
    """A task's :class:`~epochal.spark.sink_steps.TaskOutcome` as Spark carries it to the
    driver's ``commit``."""

    @classmethod
    def of(cls, outcome: TaskOutcome) -> SinkCommitMessage:
        """The message that carries ``outcome``."""
        return cls(**{f.name: getattr(outcome, f.name) for f in fields(TaskOutcome)})


class TransactionalWriter(_StreamWriter):
    """Two-phase commit: tasks prepare, the driver decides durably, then commits."""

    def __init__(self, part: Part, schema: Schema, spark_schema: StructType | None = None) -> None:
        self.part = part
        self.schema = schema
        self.spark_schema = spark_schema

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        task = sink_steps.task_context(self.part, self.schema)
        iterator = features.arrow_batches(iterator, self.spark_schema)
        with protocol_step(self.part, task.batch, f"task {task.partition} write+prepare"):
            return SinkCommitMessage.of(sink_steps.write_and_prepare(self.part, task, iterator))

    def commit(  # type: ignore[override]  # Spark hands back what write() returned
        self, messages: list[SinkCommitMessage | None], batchId: int
    ) -> None:
        with protocol_step(self.part, batchId, "decide + phase-2 commit"):
            sink_steps.commit_transactional(self.part, batchId, list(messages))

    def abort(  # type: ignore[override]  # Spark hands back what write() returned
        self, messages: list[SinkCommitMessage | None], batchId: int
    ) -> None:
        sink_steps.abort_transactional(self.part, batchId, list(messages))


class IdempotentWriterAdapter(_StreamWriter):
    """Upserts by key, flushed before the task returns; key stability checked on replay."""

    def __init__(self, part: Part, schema: Schema, spark_schema: StructType | None = None) -> None:
        self.part = part
        self.schema = schema
        self.spark_schema = spark_schema

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        task = sink_steps.task_context(self.part, self.schema)
        iterator = features.arrow_batches(iterator, self.spark_schema)
        with protocol_step(self.part, task.batch, f"task {task.partition} upsert+flush"):
            return SinkCommitMessage.of(sink_steps.upsert_and_flush(self.part, task, iterator))

    def commit(  # type: ignore[override]  # Spark hands back what write() returned
        self, messages: list[SinkCommitMessage | None], batchId: int
    ) -> None:
        sink_steps.commit_idempotent(self.part, batchId, list(messages))

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("%s: batch %s aborted; upserts already written stay", self.part.label, batchId)


# -- the wiring of each contract --------------------------------------------------------------
@dataclass(frozen=True)
class SinkContract:
    """How the runtime drives one sink contract as a data source sink: the Spark writer of a
    query's sink, and what happens once at the start of every run (after ``check``, before
    any task)."""

    name: str
    contract: type[Sink]
    writer_class: type[DataSourceStreamWriter]

    def writer(
        self, part: Part, fields: Schema, spark_schema: StructType
    ) -> DataSourceStreamWriter:
        """The writer Spark gets for this part (``spark_schema``: the rows' schema, for a
        writer that gets rows rather than Arrow record batches)."""
        return self.writer_class(part, fields, spark_schema)  # type: ignore[call-arg]

    def start_run(self, part: Part, sink: Sink) -> str:
        """Recovery at the start of a run (:func:`~epochal.spark.sink_steps.start_run`).
        Returns what was done, for the job's log."""
        return sink_steps.start_run(part, sink, self.name)


CONTRACTS = {
    "transactional": SinkContract(
        "transactional", sink_steps.SINK_CONTRACTS["transactional"], TransactionalWriter
    ),
    "idempotent": SinkContract(
        "idempotent", sink_steps.SINK_CONTRACTS["idempotent"], IdempotentWriterAdapter
    ),
}
"""Every sink contract by the name ``Sink.sink_mode()`` returns."""


def contract_of(part: Part, sink: Sink) -> SinkContract:
    """The contract the runtime drives for ``sink`` (:func:`~epochal.spark.sink_steps.
    contract_name`)."""
    return CONTRACTS[sink_steps.contract_name(part, sink)]
