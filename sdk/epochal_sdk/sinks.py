"""Sink contracts: transactional sinks (two-phase commit) and idempotent sinks (upsert by key).

The runtime drives the protocols: it calls ``begin``/``write``/``prepare`` in the tasks,
records the commit decision durably on the driver, calls ``commit`` after that, and on recovery
commits what was decided and rolls back the rest. Connector authors never touch Spark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from epochal_sdk.context import ConnectorContext, Metrics, context_property
from epochal_sdk.guarantees import Guarantee
from epochal_sdk.ids import (
    RecordId,
    RecoveryScope,
    TransactionId,
    WriterId,
    batch_of,
    transaction_prefix,
)
from epochal_sdk.options import Options
from epochal_sdk.schema import Schema

if TYPE_CHECKING:
    import pyarrow

JSON = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""


__all__ = [  # the id helpers stay importable from here, where they were first
    "IdempotentSink",
    "IdempotentWriter",
    "Prepared",
    "RecordId",
    "RecoveryScope",
    "Sink",
    "SinkWriter",
    "TaskContext",
    "Transaction",
    "TransactionId",
    "TransactionalSink",
    "WriterId",
    "batch_of",
    "transaction_prefix",
]


@dataclass(frozen=True)
class TaskContext:
    """Who is writing: the job, the sink, the batch (snapshot epoch), the Spark partition and
    the task attempt. ``transaction_id`` is stable across restarts, so it can fence zombies.

    The same values are in the sink's :attr:`~Sink.context` while it serves this task."""

    job: str
    sink_id: str
    batch_id: int
    partition: int
    attempt: int
    schema: Schema
    run: int = 0
    """The job run (it grows at every query start), so a new run never reuses an old id."""
    query_id: str = ""
    """Spark's streaming query id: the same across the runs of one checkpoint, new when the
    job starts over with a fresh checkpoint ("" outside a streaming query)."""
    metrics: Metrics = field(default_factory=Metrics, compare=False, repr=False)
    """Where the writer counts its own things (see :class:`~epochal_sdk.Metrics`); the
    runtime adds them to the part's metrics of this batch."""

    @property
    def prefix(self) -> str:
        """The prefix of every transaction id of this job's sink (for recovery look-ups)."""
        return transaction_prefix(self.job, self.sink_id)

    @property
    def txn(self) -> TransactionId:
        """This task attempt's transaction id, as a value."""
        return TransactionId(self.prefix, self.batch_id, self.partition, self.run, self.attempt)

    @property
    def transaction_id(self) -> str:
        """``<prefix>.<batch>.<partition>.<run>.<attempt>``: unique per task attempt, stable
        across retries of the same step, never random."""
        return str(self.txn)

    @property
    def writer_id(self) -> WriterId:
        """This task's writer: ``<prefix>.<partition>``, the same for every batch, run and
        attempt (for systems that fence writers by a fixed id)."""
        return WriterId(self.prefix, self.partition)

    def record_id(self, position: int) -> str:
        """The id of the ``position``-th record (from 0) this task writes: the same on every
        replay of the batch (see :class:`~epochal_sdk.RecordId`)."""
        return str(RecordId(self.job, self.sink_id, self.batch_id, self.partition, position))


@dataclass(frozen=True)
class Prepared:
    """A prepared transaction: its id and what the sink needs to commit or roll it back.
    Travels from the task to the driver and into the snapshot, so ``data`` must be JSON."""

    transaction_id: str
    data: JSON = None


class Sink(ABC):
    """What every sink has: options, a schema check and the strongest guarantee it can give."""

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        self.options = options

    context: ConnectorContext = context_property(
        """Where this sink object runs: job, part id, run, query id, and in a task the batch,
        partition and attempt, plus the metrics handle (see
        :class:`~epochal_sdk.ConnectorContext`). Handed over by the runtime with the
        options; never read the environment or Spark for these."""
    )

    def max_guarantee(self) -> Guarantee:
        """The strongest guarantee this sink can give with these options and this server."""
        return self.MAX_GUARANTEE

    def guarantee_reason(self) -> str:
        """Why :meth:`max_guarantee` is below exactly-once, if it is (shown when the runtime
        refuses or downgrades the job). Empty by default."""
        return ""

    def sink_mode(self) -> str:
        """Which contract the runtime drives: ``"transactional"`` or ``"idempotent"``. Only a
        sink that implements both needs to override it (usually from a ``mode`` option); such a
        sink is driven as idempotent by default."""
        if isinstance(self, TransactionalSink) and not isinstance(self, IdempotentSink):
            return "transactional"
        return "idempotent"

    def check(self, schema: Schema) -> None:
        """Called on the driver at the start of every run, before its first batch: fail with a
        clear error on bad options, an unreachable server (raise
        :func:`~epochal_sdk.errors.unreachable`), a missing table or columns that do not fit.

        ``check`` may create what the sink writes to (a table, a map) only when the user asked
        for it by an option (e.g. ``createTable``) or when creating it is harmless and
        idempotent; otherwise a missing target is an error that says how to create it. It is
        called again at every restart, so what it creates must tolerate already existing
        (and another job creating it at the same moment)."""

    def close(self) -> None:
        """Release connections."""


class SinkWriter(ABC):
    """Writes one task's records. ``write`` receives Arrow record batches (``to_pylist()``
    gives dicts); it may buffer, as long as the records are durable by the end of the task
    (``prepare`` for transactions, ``flush`` for idempotent writers)."""

    @abstractmethod
    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Write (or buffer) these records."""

    def close(self) -> None:
        """Release the task's resources (called after success and after failure)."""


class Transaction(SinkWriter):
    """One task's transaction: write, then prepare (phase 1)."""

    @abstractmethod
    def prepare(self) -> JSON:
        """Phase 1: make the writes durable but invisible; return what ``commit`` needs."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written (the task failed before ``prepare`` returned)."""


class TransactionalSink(Sink):
    """A sink with transactions that can be prepared in a task and committed by the driver."""

    @abstractmethod
    def begin(self, task: TaskContext) -> Transaction:
        """Start the transaction of one task, named ``task.transaction_id``."""

    @abstractmethod
    def commit(self, prepared: Prepared) -> None:
        """Phase 2: make a prepared transaction visible. Idempotent: committing a transaction
        that is already committed does nothing."""

    @abstractmethod
    def rollback(self, prepared: Prepared) -> None:
        """Drop a prepared transaction. Idempotent: unknown or settled ids do nothing."""

    @abstractmethod
    def in_doubt(self, prefix: str, scope: RecoveryScope | None = None) -> list[Prepared]:
        """Every prepared, unsettled transaction whose id starts with ``prefix``.

        ``scope`` says what the look-up is for (:class:`~epochal_sdk.RecoveryScope`):
        ``recovery`` at a run's start (or an operator settling a stopped job), ``batch``
        after one batch, ``inspect`` when an operator only lists. ``prefix`` is always
        ``scope.head``. A sink with a side effect in this call (fencing writers) does it only
        when ``scope.recovery``. Sinks written before the scope existed take ``prefix`` only;
        the runtime still calls them that way (with a ``DeprecationWarning``)."""


class IdempotentWriter(SinkWriter):
    """One task's upserts."""

    @abstractmethod
    def flush(self) -> None:
        """Wait until every write of this task is durable. Called before the task returns."""


class IdempotentSink(Sink):
    """A sink where writing a record twice has the effect of writing it once: an upsert by a
    stable key. The keys must be the same when a batch is replayed; the runtime checks that."""

    @abstractmethod
    def key_columns(self) -> tuple[str, ...]:
        """The columns that make a record's key."""

    @abstractmethod
    def open(self, task: TaskContext) -> IdempotentWriter:
        """A writer for one task."""
