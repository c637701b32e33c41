"""The steps of each sink contract, whichever way Spark hands a batch's rows to them: what a
task of a transactional sink does (write, prepare), what a task of an idempotent sink does
(upsert, flush, key check), what the driver does with a batch's outcome (decide and
complete, roll back, report) and at the start of a run (recovery).

Two writers drive them: Spark's Python data source sinks (:mod:`epochal.spark.sinks`,
pyspark 4) and ``foreachBatch`` (:mod:`epochal.spark.foreach_batch`, pyspark 3.5 and later).
Nothing here imports PySpark's data source API.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from epochal.metrics import recording, timeline
from epochal.protocols import keys
from epochal.protocols.transactions import ScopedSink, two_phase_commit
from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.spark.common import Part, SparkTask
from epochal.state import retention
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

if TYPE_CHECKING:
    import pyarrow as pa

SINK_CONTRACTS: dict[str, type[Sink]] = {
    "transactional": TransactionalSink,
    "idempotent": IdempotentSink,
}
"""Every sink contract by the name ``Sink.sink_mode()`` returns."""


@dataclass
class TaskOutcome:
    """What a task reports to the driver: its prepared transaction (exactly-once
    transactional), and what it measured (records, bytes, timings, the connector's own
    metrics)."""

    prepared: Prepared | None = None
    records: int = 0
    skipped: bool = False
    bytes: int = 0
    values: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)
    """The task's timeline (:mod:`epochal.metrics.timeline`), when the job notes one."""


def contract_name(part: Part, sink: Sink) -> str:
    """The contract the runtime drives for ``sink`` (its ``sink_mode()``); a clear error for a
    sink that implements none, or names one it does not implement."""
    supported = [name for name, kind in SINK_CONTRACTS.items() if isinstance(sink, kind)]
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
    return mode


def task_context(part: Part, schema: Schema, batch: int | None = None) -> ConnectorContext:
    """The context of a sink's task: the ``task`` its ``begin``/``open`` gets, and the context
    of the sink object built for it (its batch, partition, attempt and schema). ``batch``:
    the batch the caller knows it writes (``foreachBatch``), else the task's own."""
    context = part.connector_context(task=SparkTask.current(), schema=schema)
    if batch is not None:
        context = replace(context, batch=batch)
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


def settled(protocol: TwoPhaseCommit) -> dict[str, float]:
    """What the protocol's sink counted (in-doubt found, committed, rolled back)."""
    scoped = protocol.sink
    counts = scoped.drain() if isinstance(scoped, ScopedSink) else {}
    counts.pop("commit_seconds", None)  # phase 2 is timed as a whole
    return counts


def collected(outcomes: Iterable[TaskOutcome | None]) -> dict[str, float]:
    """The tasks' measurements of one batch, summed."""
    values = {"records_out": 0.0, "bytes_out": 0.0}
    for outcome in outcomes:
        if not isinstance(outcome, TaskOutcome):
            continue
        values["records_out"] += outcome.records
        values["bytes_out"] += outcome.bytes
        if outcome.skipped:
            recording.add(values, {"replays_skipped": 1})
        recording.add(values, outcome.values)
    return values


def _task_values(context: ConnectorContext, timings: dict[str, float]) -> dict[str, float]:
    return recording.add(timings, recording.connector_values(context.metrics.drain()))


# -- tasks ------------------------------------------------------------------------------------
def write_and_prepare(
    part: Part, task: ConnectorContext, batches: Iterator[pa.RecordBatch]
) -> TaskOutcome:
    """A transactional sink's task: begin, write every batch, prepare (exactly-once: the
    driver decides; less: commit at once). A replay of a batch that was decided writes
    nothing."""
    marks = timeline.Marks(task=True)
    marks.mark("entered")
    sink: TransactionalSink = part.build_sink(task)
    timings: dict[str, float] = {}
    try:
        exactly_once = part.guarantee == Guarantee.EXACTLY_ONCE
        if exactly_once and two_phase(part, sink).is_decided(task.txn.batch):
            for _ in batches:  # replay of a decided batch: write nothing
                pass
            return TaskOutcome(skipped=True)
        records = size = 0
        with recording.timed(timings, "write"):
            txn = sink.begin(task)
            marks.mark("began")
            try:
                for batch in batches:
                    marks.mark("first_rows")
                    with marks.spent("in_write"):
                        txn.write(batch)
                    records += batch.num_rows
                    size += batch.nbytes
                marks.mark("rows_done")
                part.context.reach("sink.after_write", task.batch)
                if exactly_once:  # a task of a driver that lost the job prepares nothing
                    part.context.check_fence(f"batch {task.batch}: task {task.partition} preparing")
                with recording.timed(timings, "prepare"):
                    data = txn.prepare()
                marks.mark("prepared")
            except BaseException:
                txn.abort()
                raise
            finally:
                txn.close()
        prepared = Prepared(str(task.txn), data)
        part.context.reach("sink.after_prepare", task.batch)
        if not exactly_once:  # at-least-once: commit at once, no decision
            with recording.timed(timings, "commit"):
                sink.commit(prepared)
            recording.add(timings, {"committed": 1})
        return TaskOutcome(
            prepared=prepared if exactly_once else None,
            records=records,
            bytes=size,
            values=_task_values(task, timings),
            marks=_returned(part, marks),
        )
    finally:
        sink.close()


def upsert_and_flush(
    part: Part, task: ConnectorContext, batches: Iterator[pa.RecordBatch]
) -> TaskOutcome:
    """An idempotent sink's task: upsert every batch, flush, and (exactly-once) check that a
    replay of this (batch, partition) wrote the same keys as the first time."""
    marks = timeline.Marks(task=True)
    marks.mark("entered")
    sink: IdempotentSink = part.build_sink(task)
    digest = keys.KeyDigest()
    key_columns = sink.key_columns()
    records = size = 0
    timings: dict[str, float] = {}
    try:
        with recording.timed(timings, "write"):
            writer = sink.open(task)
            marks.mark("began")
            try:
                for batch in batches:
                    marks.mark("first_rows")
                    with marks.spent("in_write"):
                        writer.write(batch)
                    digest.add_batch(batch, key_columns)
                    records += batch.num_rows
                    size += batch.nbytes
                marks.mark("rows_done")
                part.context.reach("sink.after_write", task.batch)
                if part.guarantee == Guarantee.EXACTLY_ONCE:  # a task of a driver that lost
                    # the job flushes nothing: its rows could be older than the new driver's
                    part.context.check_fence(f"batch {task.batch}: task {task.partition} flushing")
                with recording.timed(timings, "flush"):
                    writer.flush()
                marks.mark("prepared")
            finally:
                writer.close()
        part.context.reach("sink.after_flush", task.batch)
        if part.context.job_dir and part.guarantee == Guarantee.EXACTLY_ONCE:
            store = part.context.store(part.connector)
            txn = task.txn  # a task's: its batch and partition are set
            keys.check_and_record(store, part.part_id, txn.batch, txn.partition, digest)
        return TaskOutcome(
            records=records,
            bytes=size,
            values=_task_values(task, timings),
            marks=_returned(part, marks),
        )
    finally:
        sink.close()


def _returned(part: Part, marks: timeline.Marks) -> dict[str, float]:
    """A task's marks for its commit message (none when the job notes no timeline)."""
    if not part.context.timeline:
        return {}
    marks.mark("returned")
    return marks.as_dict()


def _keep_timeline(
    part: Part, batch: int, marks: timeline.Marks, outcomes: Sequence[TaskOutcome | None]
) -> None:
    if part.context.timeline:
        tasks = [o.marks for o in outcomes if isinstance(o, TaskOutcome)]
        timeline.write(part.context.job_dir, part.part_id, batch, marks, tasks)


# -- the driver -------------------------------------------------------------------------------
def commit_transactional(part: Part, batch: int, outcomes: Sequence[TaskOutcome | None]) -> None:
    """The driver's side of a transactional sink's batch: decide and complete it
    (exactly-once), or roll back the strays of failed attempts (less); report the batch."""
    marks = timeline.Marks(task=False)
    marks.mark("entered")
    context = part.connector_context(batch=batch)
    sink: TransactionalSink = part.build_sink(context)
    values = collected(outcomes)
    try:
        protocol = two_phase(part, sink)
        if part.guarantee == Guarantee.EXACTLY_ONCE:
            prepared = [o.prepared for o in outcomes if o and o.prepared]
            with recording.timed(values, "decide"):
                protocol.decide(batch, prepared, records=int(values["records_out"]))
            marks.mark("decided")
            with recording.timed(values, "commit"):
                protocol.complete(batch)
            marks.mark("completed")
            values.update(committed_records(protocol, batch))
            if retention.due(batch):
                protocol.prune(retention.oldest_kept(batch, retention.DECISION_BATCHES))
        else:  # tasks committed their own transactions; drop those of dead attempts
            protocol.rollback_strays(batch)
            values["records_committed"] = values["records_out"]
        recording.add(values, settled(protocol))
    finally:
        sink.close()
        recording.add(values, recording.connector_values(context.metrics.drain()))
        part.report("sink", batch, values)
        marks.mark("reported")
    _keep_timeline(part, batch, marks, outcomes)
    part.context.reach("sink.after_commit", batch)


def abort_transactional(part: Part, batch: int, outcomes: Sequence[TaskOutcome | None]) -> None:
    """Spark gave up on a transactional sink's batch: roll back what its tasks prepared
    (a batch already decided is completed instead)."""
    if part.guarantee != Guarantee.EXACTLY_ONCE:
        return
    sink: TransactionalSink = part.build_sink(part.connector_context(batch=batch))
    try:
        prepared = [o.prepared for o in outcomes if o is not None]
        protocol = two_phase(part, sink)
        protocol.abort_batch(batch, prepared)
        part.report("sink", batch, settled(protocol))
    finally:
        sink.close()


def commit_idempotent(part: Part, batch: int, outcomes: Sequence[TaskOutcome | None]) -> None:
    """The driver's side of an idempotent sink's batch: the tasks' upserts are written
    already; forget old key digests now and then, and report the batch."""
    marks = timeline.Marks(task=False)
    marks.mark("entered")
    if part.context.job_dir and retention.due(batch):
        oldest = retention.oldest_kept(batch, retention.KEY_DIGEST_BATCHES)
        keys.prune(part.context.store(part.connector), part.part_id, oldest)
    values = collected(outcomes)
    values["records_committed"] = values["records_out"]  # a replay upserts the batch whole
    part.report("sink", batch, values)
    marks.mark("reported")
    _keep_timeline(part, batch, marks, outcomes)
    part.context.reach("sink.after_commit", batch)


def start_run(part: Part, sink: Sink, contract: str) -> str:
    """Recovery at the start of a run: a transactional sink finishes the decided batches and
    rolls back every other in-doubt transaction of earlier runs (two-phase commit); an
    idempotent sink has nothing to settle. Returns what was done, for the job's log."""
    if contract != "transactional":
        return ""
    assert isinstance(sink, TransactionalSink)
    values: dict[str, float] = {}
    protocol = two_phase(part, sink)
    with recording.timed(values, "recover"):
        report = protocol.recover()
    part.report("sink", None, recording.add(values, settled(protocol)))
    for batch in report.completed_batches:  # decided in an earlier run, reported maybe not
        part.report("sink", batch, committed_records(protocol, batch))
    return f"{report} {report.rolled_back}"


def committed_records(protocol: TwoPhaseCommit, batch: int) -> dict[str, float]:
    """The metric of ``batch``'s committed records, from its decision (empty when the
    decision is gone or holds no count): whichever run decided the batch, and however often
    it is completed again, the count is the decided attempt's."""
    records = protocol.committed_records(batch)
    return {} if records is None else {"records_committed": float(records)}
