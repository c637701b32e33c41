"""Every epochal sink as a ``foreachBatch`` writer, with the data source sink's protocol::

    query = (
        frame.writeStream.foreachBatch(
            epochal.foreach_batch("jdbc", job="orders", snapshot_dir="/data/epochal", **options)
        )
        .option("checkpointLocation", "/data/orders-checkpoint")
        .start()
    )

Spark calls the writer on the driver with each micro-batch's frame and id, and calls it again
with the same id after a failure. The writer keeps the job's lease (the same fence and run
numbers as the data source sink), runs recovery once at the start of a run, and for each
batch:

- a transactional sink: if the decision log holds batch N, N is a replay of a decided batch:
  its decision is completed (phase 2; committing twice is harmless) and nothing is written
  again. Else the tasks write and prepare (``mapInArrow``, one transaction per partition with
  the usual :class:`~epochal_sdk.TransactionId`), the driver decides, then commits;
- an idempotent sink: the tasks upsert and flush, and a replay must write the same keys per
  partition (:mod:`epochal.protocols.keys`). In update and complete output modes an upsert of
  the changed rows is exactly-once.

It imports nothing of PySpark's Python data source API, so it runs on pyspark 3.5 too.
"""

from __future__ import annotations

import functools
import logging
import pickle
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from epochal.parts import registry
from epochal.parts.effective import effective
from epochal.parts.job_context import JobContext
from epochal.parts.spark_plan.capabilities import Role
from epochal.parts.spark_plan.classification import sink_part
from epochal.parts.spark_plan.judgement import judge, part_records, settled_by_partition
from epochal.parts.spark_plan.jvm import Jvm, UnreadablePlanError, private_field
from epochal.parts.spark_plan.reading import read_started_query
from epochal.parts.spark_plan.session import session_driver
from epochal.spark import sink_steps, task_ends
from epochal.spark.common import Part, protocol_step, sdk_schema
from epochal.spark.sink_steps import TaskOutcome
from epochal_sdk import Guarantee, Schema, TransactionalSink

log = logging.getLogger("epochal.foreach_batch")

OUTCOME_COLUMN = "outcome"
"""The one column of the frame the tasks return: each task's pickled :class:`TaskOutcome`."""

JOB_OPTIONS = {
    "job": "epochal.job",
    "snapshot_dir": "epochal.snapshotDir",
    "guarantee": "epochal.guarantee",
    "allow_downgrade": "epochal.allowDowngrade",
}
"""The keyword arguments of :func:`foreach_batch` that name the job, as the options a data
source sink of the same job takes."""


def foreach_batch(
    connector: str,
    *,
    job: str | None = None,
    snapshot_dir: str | None = None,
    guarantee: str | None = None,
    allow_downgrade: bool | None = None,
    options: Mapping[str, str] | None = None,
    **connector_options: Any,
) -> ForeachBatchWriter:
    """The ``foreachBatch`` writer of the epochal sink ``connector``.

    Args:
        connector: the sink's connector (``jdbc``, ``kafka``, ``jms``, ``map``, ...).
        job: the job's name (``epochal.job``).
        snapshot_dir: where the job's lease, decision log and records live
            (``epochal.snapshotDir``); an exactly-once job needs one.
        guarantee: the job's guarantee (``epochal.guarantee``; default exactly-once).
        allow_downgrade: run a sink that cannot give the job's guarantee with what it can.
        options: options by their full names (the connector's and ``epochal.*``: names a
            keyword cannot spell, such as ``epochal.leaseTtl``).
        connector_options: the connector's options, as ``.option(...)`` would give them.

    The same job name and snapshot directory as a data source sink of the job give the same
    part id, so the writer finds that sink's decisions and in-doubt transactions.
    """
    given: dict[str, str] = {k: _text(v) for k, v in (options or {}).items()}
    given.update({k: _text(v) for k, v in connector_options.items()})
    named = {
        "job": job,
        "snapshot_dir": snapshot_dir,
        "guarantee": guarantee,
        "allow_downgrade": allow_downgrade,
    }
    for name, value in named.items():
        if value is not None:
            given[JOB_OPTIONS[name]] = _text(value)
    return ForeachBatchWriter(connector, given)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class _Run:
    """The writer's part in the current run, after the run's start (lease, checks,
    recovery)."""

    part: Part
    contract: str


class ForeachBatchWriter:
    """A ``foreachBatch`` function that writes each batch through an epochal sink's contract
    (see the module doc). Build it with :func:`foreach_batch`."""

    def __init__(self, connector: str, options: Mapping[str, str]) -> None:
        self.connector = connector
        self.options = dict(options)
        registry.connector(connector)  # installed, and loads (else: why not)
        registry.check_runtime_options(self.options)
        registry.check_options(connector, "sink", self.options)
        self._run: _Run | None = None
        self._query_run: str | None = None
        """The Spark query run this writer last started a run for: a query run is started
        once (a second start of it, after a batch's failure that a caller swallowed, claims
        no new run and takes no lost lease back); a run id never comes back."""
        global _made, _last_made
        _made, _last_made = _made + 1, self

    def __call__(self, frame: Any, batch_id: int) -> None:
        run = self._run or self._start(frame)
        try:
            with protocol_step(run.part, batch_id, "foreachBatch"):
                if run.contract == "transactional":
                    self._write_transactional(run.part, frame, batch_id)
                else:
                    self._write_idempotent(run.part, frame, batch_id)
        except BaseException:
            self._run = None  # the query fails; a query started again starts a run again
            raise

    # -- the start of a run ----------------------------------------------------------------
    def _start(self, frame: Any) -> _Run:
        """Hold the job's lease, check the sink, record the part, and recover what earlier
        runs left in doubt: once per run, before the run's first batch is written. In a
        plain session a start of the query after the first in this driver begins a new run
        (its Spark run id is the job group of its batches' jobs), as a data source sink's
        does: its recovery settles what the stopped query left, and no transaction id of
        the stopped query is used again."""
        spark = frame.sparkSession
        query_run = task_ends.job_group(spark)
        starting = query_run if query_run != self._query_run else None
        context = JobContext.current(self.options).holding_the_lease(
            self.options, session_driver(spark), query_start=starting
        )
        self._query_run = query_run
        part = Part.in_job("sink", self.connector, self.options, context)
        fields = sdk_schema(frame.schema)
        sink = part.build_sink()
        try:
            contract = sink_steps.contract_name(part, sink)
            reason = str(sink.guarantee_reason() or "")
            part.guarantee = effective(
                context.guarantee,
                sink.max_guarantee(),
                part=f"sink {part.label}",
                options=self.options,
                allow_downgrade=context.allow_downgrade,
                why=reason,
            )
            part.check_target("sink")
            sink.check(fields)
            judge_query(frame, part)
            part.record("sink", contract, reason)
            done = sink_steps.start_run(part, sink, contract)
        finally:
            sink.close()
        log.info(
            "epochal: foreachBatch %s of job %r, run %s (%s)%s",
            part.label,
            context.job,
            context.run,
            part.guarantee.label,
            f": recovery: {done}" if done else "",
        )
        self._run = _Run(part, contract)
        return self._run

    # -- each batch ------------------------------------------------------------------------
    def _write_transactional(self, part: Part, frame: Any, batch: int) -> None:
        if part.guarantee == Guarantee.EXACTLY_ONCE and self._decided(part, batch):
            self._complete_replay(part, frame, batch)
            return
        try:
            outcomes = run_tasks(part, frame, batch, "transactional")
        except BaseException:
            _roll_back_batch(part, frame, batch)
            raise
        sink_steps.commit_transactional(part, batch, outcomes)

    def _write_idempotent(self, part: Part, frame: Any, batch: int) -> None:
        outcomes = run_tasks(part, frame, batch, "idempotent")
        sink_steps.commit_idempotent(part, batch, outcomes)

    @staticmethod
    def _decided(part: Part, batch: int) -> bool:
        """Whether the decision log holds ``batch`` (a replay of a decided batch)."""
        sink: TransactionalSink = part.build_sink(part.connector_context(batch=batch))
        try:
            return sink_steps.two_phase(part, sink).is_decided(batch)
        finally:
            sink.close()

    def _complete_replay(self, part: Part, frame: Any, batch: int) -> None:
        """A replay of a decided batch: complete its decision (phase 2, then its strays
        rolled back) and write nothing."""
        context = part.connector_context(batch=batch)
        sink: TransactionalSink = part.build_sink(context)
        values: dict[str, float] = {"replays_skipped": 1}
        try:
            protocol = sink_steps.two_phase(part, sink)
            protocol.complete(batch)
            values.update(sink_steps.settled(protocol))
            values.update(sink_steps.committed_records(protocol, batch))
        finally:
            sink.close()
            part.report("sink", batch, values)
        log.info(
            "epochal: %s: batch %s was decided before: completed, not written again",
            part.label,
            batch,
        )
        part.context.reach("sink.after_commit", batch)


_made = 0
_last_made: ForeachBatchWriter | None = None


def writers_made() -> tuple[int, ForeachBatchWriter | None]:
    """How many writers this process has made, and the last one: a driver that builds a
    job's query (``epochal run``) compares the count before and after, and judges the
    query's ``foreachBatch`` sink as that writer's epochal sink when the build made exactly
    one (the writer then refuses or lowers itself at its first batch, as a data source
    sink does when Spark plans it), not as an unknown function."""
    return _made, _last_made


def _roll_back_batch(part: Part, frame: Any, batch: int) -> None:
    """The tasks of an undecided batch failed, or the query was stopped while they ran: roll
    back what they prepared in this run (a batch written again in the same run uses the same
    transaction ids), once no task of the batch runs any more (a task the stop cancelled can
    still prepare after the driver heard of the cancel: :mod:`epochal.spark.task_ends`).
    Best effort: recovery at the next run's start rolls back whatever is left."""
    if part.guarantee != Guarantee.EXACTLY_ONCE:
        return
    group = task_ends.job_group(frame.sparkSession)
    if group is not None and not task_ends.wait_for_tasks_to_end(frame.sparkSession, group):
        log.warning(
            "epochal: %s: batch %s: a task of the failed batch still runs after %.0f s; "
            "what it prepares later is rolled back at the next run's start",
            part.label,
            batch,
            task_ends.TASKS_END_SECONDS,
        )
    sink: TransactionalSink = part.build_sink(part.connector_context(batch=batch))
    try:
        protocol = sink_steps.two_phase(part, sink)
        if not protocol.is_decided(batch):
            protocol.rollback_strays(batch)
    except Exception as exc:  # the batch's own failure is the one to raise
        log.warning("epochal: %s: batch %s: roll-back after a failure: %s", part.label, batch, exc)
    finally:
        sink.close()


def query_of(frame: Any) -> tuple[Any, Any] | None:
    """The session and the JVM ``StreamExecution`` of the streaming query whose micro-batch
    ``frame`` is, or None when it is not found. Spark runs each query's batches in a session
    of its own (``StreamExecution.sparkSessionForStream``), and the ``foreachBatch`` frame
    belongs to it: the query is the active one of the application's session (or of the
    frame's) whose session for the stream is the frame's."""
    from pyspark.sql import SparkSession

    batch_session = frame._jdf.sparkSession()
    sessions = [SparkSession.getActiveSession(), frame.sparkSession]
    sessions.insert(0, getattr(SparkSession, "_instantiatedSession", None))
    for session in (s for s in sessions if s is not None):
        for query in session.streams.active:
            execution = query._jsq.streamingQuery()
            try:
                if private_field(execution, "sparkSessionForStream").equals(batch_session):
                    return session, execution
            except Exception:  # py4j: not a field of this Spark's StreamExecution
                continue
    return None


def judge_query(frame: Any, part: Part) -> None:
    """Judge the query's other parts (Spark's sources, the batch relations joined to them)
    against the job's guarantee, as the session check judges a query with an epochal data
    source sink: under exactly-once a part that gives less refuses the run
    (``GuaranteeError``) unless the job allows the downgrade; each part is recorded in the
    run's store, so status and metrics show the whole query. Spark's sources are judged
    against the epochal sink this writer drives (a sink that settles each partition needs
    the rows routed by key after Spark's Kafka source). A query whose plan cannot be read is
    named in a warning and runs with only the sink checked."""
    found = query_of(frame)
    if found is None:
        log.warning(
            "epochal: %s: the foreachBatch function's query is not found; Spark's own "
            "sources of it are not judged against job %r's guarantee",
            part.label,
            part.context.job,
        )
        return
    spark, execution = found
    try:
        started = read_started_query(spark, execution)
        sink = sink_part(f"epochal.{part.connector}", part.options, Jvm(spark))
    except UnreadablePlanError as exc:
        log.warning(
            "epochal: %s: the query could not be read, Spark's own sources of it are not "
            "judged against job %r's guarantee: %s",
            part.label,
            part.context.job,
            exc,
        )
        return
    sources = settled_by_partition(started.plan.sources, sink, part.options)
    verdict = judge(
        (*sources, *started.plan.static),
        part.context.guarantee,
        allow_downgrade=part.context.allow_downgrade,
        in_session=True,
    )
    if part.context.job_dir:
        store = part.context.store(part.connector)
        for record in part_records(verdict):
            if record.kind != Role.SINK.value:
                record.write(store)


TaskStep = Callable[[Part, Any, Iterator[pa.RecordBatch]], TaskOutcome]
TASK_STEPS: dict[str, tuple[str, TaskStep]] = {
    "transactional": ("write+prepare", sink_steps.write_and_prepare),
    "idempotent": ("upsert+flush", sink_steps.upsert_and_flush),
}
"""What a task does for each contract (its step's name in errors, and the step)."""


def run_tasks(part: Part, frame: Any, batch: int, contract: str) -> list[TaskOutcome]:
    """Run the contract's task step on every partition of ``frame`` (``mapInArrow``: the
    rows reach each task as Arrow batches) and return each task's outcome to the driver."""
    task = functools.partial(_task, part, batch, sdk_schema(frame.schema), contract)
    rows = frame.mapInArrow(task, f"{OUTCOME_COLUMN} binary").collect()
    return [pickle.loads(row[0]) for row in rows]


def _task(
    part: Part, batch: int, fields: Schema, contract: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One task of a batch, on an executor: the contract's step over the partition's rows,
    its outcome returned as one row."""
    context = sink_steps.task_context(part, fields, batch)
    name, step = TASK_STEPS[contract]
    with protocol_step(part, batch, f"task {context.partition} {name}"):
        outcome = step(part, context, batches)
    yield pa.RecordBatch.from_arrays(
        [pa.array([pickle.dumps(outcome)], pa.binary())], names=[OUTCOME_COLUMN]
    )
