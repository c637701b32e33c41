"""Sink contracts: transactional sinks (two-phase commit) and idempotent sinks (upsert by key).

The runtime drives the protocols: it calls ``begin``/``write``/``prepare`` in the tasks,
records the commit decision durably on the driver, calls ``commit`` after that, and on recovery
commits what was decided and rolls back the rest. Connector authors never touch Spark.

Where a sink's code runs (every call gets a sink object built for it, ``YourSink(options)``,
and ``close`` after it; nothing in memory survives between calls):

* **the driver's planner**: plans the write of every batch
  (:meth:`~epochal_sdk.sinks.Sink.max_guarantee`, :meth:`~epochal_sdk.sinks.Sink.sink_mode`); at the
  first plan of each run (each query start) it also calls :meth:`~epochal_sdk.sinks.Sink.check`
  and then, for a transactional sink, recovery
  (:meth:`~epochal_sdk.TransactionalSink.in_doubt`,
  :meth:`~epochal_sdk.TransactionalSink.commit`,
  :meth:`~epochal_sdk.TransactionalSink.rollback`), before any task of the run.
* **a task on an executor**: one per Spark partition of a batch and attempt:
  :meth:`~epochal_sdk.TransactionalSink.begin` → :meth:`~epochal_sdk.Transaction.write` …
  → :meth:`~epochal_sdk.Transaction.prepare` (or :meth:`~epochal_sdk.Transaction.abort`),
  or :meth:`~epochal_sdk.IdempotentSink.open` →
  :meth:`~epochal_sdk.IdempotentWriter.write` … →
  :meth:`~epochal_sdk.IdempotentWriter.flush`.
* **a short-lived commit worker on the driver**: one per batch, after all its tasks
  succeeded: records the decision and commits (phase 2), then rolls back the batch's other
  prepared attempts; or rolls back what the tasks prepared when Spark gives up on the batch.
* **an operator's command**: ``epochal in-doubt list``/``settle`` calls ``in_doubt``,
  ``commit`` and ``rollback`` from another process, while the job is stopped.

A sink object lives for one call, so a sink keeps no connection open between calls and
has no idle gap to keep alive with heartbeats (an acknowledging source has: see
:class:`~epochal_sdk.AcknowledgingSource`). What a sink's call returns from must be done on
the server when it returns: rows staged by ``prepare``, a transaction committed or rolled
back, upserts written by ``flush``; the runtime records the step as done right after (an
acknowledging source's ``acknowledge`` is the one call that need not be confirmed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from epochal_sdk import _deprecated
from epochal_sdk.context import ConnectorContext
from epochal_sdk.guarantees import Guarantee
from epochal_sdk.ids import RecoveryScope
from epochal_sdk.options import Options
from epochal_sdk.schema import Schema

if TYPE_CHECKING:
    import pyarrow

JSON = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""


@dataclass(frozen=True)
class Prepared:
    """A prepared transaction: its id and what the sink needs to commit or roll it back.
    Travels from the task to the driver and into the snapshot, so ``data`` must be JSON.

    The runtime builds it from :attr:`ConnectorContext.txn
    <epochal_sdk.ConnectorContext.txn>` and what :meth:`Transaction.prepare`
    returned, records it in the batch's commit decision, and hands it to
    :meth:`TransactionalSink.commit` and :meth:`~TransactionalSink.rollback`. A sink's
    :meth:`~TransactionalSink.in_doubt` rebuilds it from the system.

    Attributes:
        transaction_id: the task attempt's transaction id
            (``ep.<job>.<sink>.<batch>.<partition>.<run>.<attempt>``, see
            :class:`~epochal_sdk.TransactionId`).
        data: what :meth:`Transaction.prepare` returned (kept in the decision), or what
            :meth:`~TransactionalSink.in_doubt` put there when it rebuilt the handle from the
            system after a crash: both reach ``commit`` and ``rollback``, so they must work
            with either (the safest ``data`` is one ``in_doubt`` can rebuild exactly, or none:
            everything from the id).
    """

    transaction_id: str
    data: JSON = None


class Sink(ABC):
    """What every sink has: options, a schema check and the strongest guarantee it can give.

    Subclass :class:`TransactionalSink` or :class:`IdempotentSink` (or both, and choose with
    :meth:`sink_mode`). The runtime builds ``YourSink(options)`` for every call site (see the
    module doc: the planner, each task, each batch's commit), so keep the constructor cheap:
    read and check options there, open connections on first use.

    Attributes:
        options: the options the user gave the sink (``.option(...)``), typed getters
            included; ``options.context`` is :attr:`context`.
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE
    """The strongest guarantee the connector can give; the default of
    :meth:`max_guarantee`."""

    def __init__(self, options: Options) -> None:
        self.options = options

    @property
    def context(self) -> ConnectorContext:
        """Where this sink object runs: job, part id, run, query id, and in a task the batch,
        partition and attempt, plus the metrics handle (see
        :class:`~epochal_sdk.ConnectorContext`). Handed over by the runtime with the
        options; never read the environment or Spark for these."""
        return self.options.context

    def max_guarantee(self) -> Guarantee:
        """The strongest guarantee this sink can give with these options and this server.

        Called on the driver whenever the runtime plans a batch's write or commits a batch
        (so keep it cheap: from options, or from what :meth:`check` learnt). The job's
        guarantee is lowered to it (or the job refused) as the job's settings say.

        Returns:
            A :class:`~epochal_sdk.Guarantee`; :attr:`MAX_GUARANTEE` by default.
        """
        return self.MAX_GUARANTEE

    def guarantee_reason(self) -> str:
        """Why :meth:`max_guarantee` is below exactly-once, if it is (shown when the runtime
        refuses or downgrades the job). Empty by default.

        Returns:
            One sentence for the user, or ``""``.
        """
        return ""

    def sink_mode(self) -> str:
        """Which contract the runtime drives: ``"transactional"`` or ``"idempotent"``. Only a
        sink that implements both needs to override it (usually from a ``mode`` option); such a
        sink is driven as idempotent by default.

        Called on the driver with :meth:`max_guarantee`; must give the same answer for the
        same options.

        Returns:
            ``"transactional"`` or ``"idempotent"``.
        """
        if isinstance(self, TransactionalSink) and not isinstance(self, IdempotentSink):
            return "transactional"
        return "idempotent"

    def settles_each_partition(self) -> bool:
        """Whether this sink settles each Spark partition's share of a batch on its own, so
        that a replayed batch must give every partition the rows it had the first time.

        True in idempotent mode (the runtime checks each partition's keys on a replay); a
        transactional sink that makes a partition's writes final in ``prepare`` (a Kafka
        transaction committed there) overrides it to True. False for a transactional sink
        that decides the batch as a whole in ``commit``.

        The runtime refuses (or, with the downgrade allowed, runs at-least-once) a job whose
        source may give a replayed batch's rows to other partitions (Spark's Kafka source)
        straight into such a sink; rows routed by key in between (``repartition(<column>)``,
        a keyed aggregation) keep it exactly-once. Called on the driver, before the query
        starts; must give the same answer for the same options.

        Returns:
            Whether a replay must keep each row in its partition.
        """
        return self.sink_mode() == "idempotent"

    def check(self, schema: Schema) -> None:
        """Called on the driver at the start of every run, before its first batch: fail with a
        clear error on bad options, an unreachable server (raise what
        :func:`~epochal_sdk.unreachable` returns), a missing table or columns that do not fit
        (:class:`~epochal_sdk.SchemaMismatchError`).

        It runs in the driver's planner at the first plan of each run (each query start),
        before recovery and before any task of the run.

        ``check`` may create what the sink writes to (a table, a map) only when the user asked
        for it by an option (e.g. ``createTable``) or when creating it is harmless and
        idempotent; otherwise a missing target is an error that says how to create it. It is
        called again at every restart, so what it creates must tolerate already existing
        (and another job creating it at the same moment).

        Args:
            schema: the columns the query writes, in order (names, Spark SQL types,
                nullability).

        Raises:
            ~epochal_sdk.ConfigError: an option is missing or wrong.
            ~epochal_sdk.SchemaMismatchError: the columns do not fit the target.
        """

    def close(self) -> None:
        """Release connections. Called after every use of this object: after ``check`` and
        recovery, at the end of every task (after success and after failure), after every
        batch's commit. Never called on a process that is killed; it may run on an object
        that never connected."""


class SinkWriter(ABC):
    """Writes one task's records. ``write`` receives Arrow record batches (``to_pylist()``
    gives dicts); it may buffer, as long as the records are durable by the end of the task
    (``prepare`` for transactions, ``flush`` for idempotent writers).

    The base of :class:`Transaction` and :class:`IdempotentWriter`; lives in one task on an
    executor, for one task attempt."""

    @abstractmethod
    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Write (or buffer) these records.

        Called in the task zero or more times (a partition without records may get no
        call), with the task's records in order, in Arrow batches whose size Spark chooses.

        Args:
            batch: records in the query's columns (:attr:`ConnectorContext.schema
                <epochal_sdk.ConnectorContext.schema>`); ``batch.to_pylist()`` gives dicts.
        """

    def close(self) -> None:
        """Release the task's resources (called after success and after failure), once, as
        the task's last call (not when the process is killed)."""


class Transaction(SinkWriter):
    """One task's transaction: write, then prepare (phase 1).

    Made by :meth:`TransactionalSink.begin` in a task on an executor; the runtime then calls
    :meth:`write` for each Arrow batch of the task's records, :meth:`prepare` once, and
    :meth:`close`; if anything raises before ``prepare`` returned, :meth:`abort` instead of
    (or after a failed) ``prepare``, then ``close``. A partition without records still
    begins and prepares a transaction (no ``write``).
    """

    @abstractmethod
    def prepare(self) -> JSON:
        """Phase 1: make the writes durable but invisible; return what ``commit`` needs.

        Called once in the task, after the last :meth:`write` (also when there was none).
        When it returns, the transaction must survive the death of this process: the driver
        commits it from another process (:meth:`TransactionalSink.commit`), and after a crash
        :meth:`TransactionalSink.in_doubt` must find it. Exactly-once, nothing may become
        visible before ``commit``; at-least-once, the runtime commits it in this task right
        after ``prepare`` returns.

        Returns:
            JSON data (``json.dumps`` must keep it as it is; small, since it is stored in
            the commit decision), what :meth:`~TransactionalSink.commit` and
            :meth:`~TransactionalSink.rollback` need besides the transaction id (may be
            None). It becomes :attr:`Prepared.data`.
        """

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written (the task failed before ``prepare`` returned).

        Called in the task when :meth:`write` or :meth:`prepare` (or the runtime's checks
        between them, e.g. a driver that lost the job's lease) raised, before the error
        fails the task; Spark then retries the task with a new attempt (a new transaction
        id). Not called when the process dies (SIGKILL, a lost executor): what an unprepared
        transaction wrote must then stay invisible by itself (an uncommitted database
        transaction is dropped with its connection; a staged file nobody renames is never
        read), and a prepared one is rolled back by recovery through
        :meth:`TransactionalSink.in_doubt`. Must not raise when nothing was written.
        """


class TransactionalSink(Sink):
    """A sink with transactions that can be prepared in a task and committed by the driver.

    The system must let one process prepare a transaction (durable, invisible) and another
    commit or roll it back later by its id, and list the prepared ones: PostgreSQL's
    ``PREPARE TRANSACTION``, Kafka transactions, a staged file renamed into place.

    Exactly-once, for each batch: every task prepares its own transaction (:meth:`begin`,
    :meth:`Transaction.prepare`); the driver records the decision (the batch's prepared
    transactions) durably, then calls :meth:`commit` for each, then :meth:`in_doubt` for the
    batch and :meth:`rollback` for the prepared attempts that are not in the decision. A crash
    anywhere is repaired at the start of the next run: decided transactions are committed,
    every other prepared transaction of earlier runs is rolled back. A batch that was decided
    before a crash is not written again when Spark replays it. At-least-once, each task
    commits its own transaction right after preparing it.
    """

    @abstractmethod
    def begin(self, task: ConnectorContext) -> Transaction:
        """Start the transaction of one task, named ``str(task.txn)``.

        Called in a task on an executor, once per task attempt: for every Spark partition of
        every batch (also one without records), and again for each retry of the task (a new
        attempt, so a new id). Exactly-once, not called for a replay of a batch that was
        already decided. ``self.context`` is ``task``.

        Args:
            task: the task's context: ``str(task.txn)`` (unique per task attempt,
                stable, never random; use it as the system's transaction id or put it where
                :meth:`in_doubt` finds it), ``task.batch``, ``task.partition``,
                ``task.attempt``, ``task.schema``, ``task.writer_id``, ``task.metrics``.

        Returns:
            The task's :class:`Transaction`.
        """

    @abstractmethod
    def commit(self, prepared: Prepared) -> None:
        """Phase 2: make a prepared transaction visible. Idempotent: committing a transaction
        that is already committed does nothing.

        Called on the driver: in each batch's commit worker, once for every transaction of the
        batch's decision, after the decision was recorded; in the planner at the start of a
        run (recovery), for decided transactions whose commit did not finish before a crash;
        by ``epochal in-doubt settle``. At-least-once, in the task itself right after
        :meth:`Transaction.prepare`. The same transaction may be committed more than once (a
        crash between two commits, a recovery after a commit): the second time must do
        nothing. A transaction that is neither prepared nor committed was rolled back outside
        the job: raise an error that says so rather than lose its records silently.

        Args:
            prepared: the transaction: its id and ``data`` as :meth:`Transaction.prepare`
                returned it, or as :meth:`in_doubt` rebuilt it (in recovery).
        """

    @abstractmethod
    def rollback(self, prepared: Prepared) -> None:
        """Drop a prepared transaction. Idempotent: unknown or settled ids do nothing.

        Called on the driver: in a batch's commit worker for the batch's prepared attempts
        that are not in its decision (tasks that failed after preparing, and retries), and
        for every prepared transaction of a batch Spark gave up on; in the planner at the
        start of a run (recovery) for every undecided transaction of earlier runs; by
        ``epochal in-doubt settle``. Never for a transaction of the decision, never for one
        of a later run.

        Args:
            prepared: the transaction: usually as :meth:`in_doubt` rebuilt it; as
                :meth:`Transaction.prepare` returned it when Spark aborts a batch.
        """

    @abstractmethod
    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        """Every prepared, unsettled transaction of this sink in ``scope``: those whose id
        starts with ``scope.head`` (the runtime keeps only ids that
        :meth:`~epochal_sdk.RecoveryScope.matches`, so a prefix search is enough).

        ``scope.purpose`` says what the look-up is for: ``recovery`` at a run's start (or an
        operator settling a stopped job), ``batch`` after one batch was decided, ``inspect``
        when an operator only lists. A sink with a side effect in this call (fencing writers,
        as Kafka's does) does it only when ``scope.recovery``. Each :class:`Prepared` must
        carry what :meth:`commit` and :meth:`rollback` need, as ``prepare`` returned it or
        rebuilt from the system (its ``data`` may then differ).

        Called on the driver: in the planner at the start of every run (``recovery``, every
        batch), in each batch's commit worker after phase 2 (``batch``), and by
        ``epochal in-doubt list``/``settle`` (``inspect``/``recovery``). It reads the system,
        never memory: the transactions were prepared by tasks in other processes, perhaps
        before a crash. Return those of every run; the runtime skips a later run's.

        Args:
            scope: what to look for (:class:`~epochal_sdk.RecoveryScope`: ``scope.head`` is
                the id prefix, ``scope.purpose`` why).

        Returns:
            One :class:`Prepared` per prepared, unsettled transaction in scope (none
            committed or rolled back). Its ``data`` need not equal what ``prepare``
            returned, but :meth:`commit` and :meth:`rollback` must work with it.
        """


class IdempotentWriter(SinkWriter):
    """One task's upserts.

    Made by :meth:`IdempotentSink.open` in a task on an executor; the runtime calls
    :meth:`write` for each Arrow batch of the task's records, then :meth:`flush` once, then
    :meth:`close` (also after a failure). There is no abort: what a failed task wrote stays,
    and the retry or the replay writes the same records again (same keys, same values).
    """

    @abstractmethod
    def flush(self) -> None:
        """Wait until every write of this task is durable. Called before the task returns.

        Called once in the task, after the last :meth:`write` (also when there was none);
        the task reports success only after it returns, and Spark's snapshot of the batch
        follows. Writes may land earlier (a writer may write as it buffers); after
        ``flush`` all of them must survive a crash of the system's client and of this
        process.
        """


class IdempotentSink(Sink):
    """A sink where writing a record twice has the effect of writing it once: an upsert by a
    stable key. The keys must be the same when a batch is replayed; the runtime checks that.

    After a crash, Spark replays the batches that were not committed: the same records
    reach :meth:`open`'s writers again, and upserting them again leaves one entry per key
    with the same value. Exactly-once, the runtime records a digest of each task's keys and
    fails a replay whose keys differ (a pipeline that makes random or time-based keys).
    """

    @abstractmethod
    def key_columns(self) -> tuple[str, ...]:
        """The columns that make a record's key.

        Called in every task (the runtime digests the keys it writes) and must name columns
        of the query (check that in :meth:`~epochal_sdk.sinks.Sink.check`).

        Returns:
            Column names, e.g. ``("key",)``.
        """

    @abstractmethod
    def open(self, task: ConnectorContext) -> IdempotentWriter:
        """A writer for one task.

        Called in a task on an executor, once per task attempt: for every Spark partition of
        every batch (also one without records), for every retry, and again when a batch is
        replayed after a crash. ``self.context`` is ``task``.

        Args:
            task: the task's context (``task.batch``, ``task.partition``, ``task.attempt``,
                ``task.schema``, ``task.record_id(n)``, ``task.metrics``).

        Returns:
            The task's :class:`IdempotentWriter`.
        """


if not TYPE_CHECKING:  # type checkers see the names above only, and report a deprecated one

    def __getattr__(name: str) -> object:
        """A deprecated name (``epochal_sdk.sinks.TaskContext``): from its new home, with a
        warning."""
        return _deprecated.moved(__name__, name)
