"""Sink contracts: transactional sinks (two-phase commit) and idempotent sinks (upsert by key).

The runtime drives the protocols: it calls ``begin``/``write``/``prepare`` in the tasks,
records the commit decision durably on the driver, calls ``commit`` after that, and on recovery
commits what was decided and rolls back the rest. Connector authors never touch Spark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from epochal_sdk.guarantees import Guarantee
from epochal_sdk.options import Options
from epochal_sdk.schema import Schema

if TYPE_CHECKING:
    import pyarrow

JSON = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""


@dataclass(frozen=True, order=True)
class TransactionId:
    """The one id scheme of transactions driven by the runtime:
    ``<prefix>.<batch>.<partition>.<run>.<attempt>``, where ``<prefix>`` is
    ``ep.<job>.<sink id>`` (see :func:`transaction_prefix`).

    Unique per task attempt, the same on a retry of the same step, never random; the run
    grows at every query start, so a new run never reuses an old id and recovery can tell
    which run prepared a transaction.
    """

    prefix: str
    batch: int
    partition: int
    run: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.prefix}.{self.batch}.{self.partition}.{self.run}.{self.attempt}"

    @classmethod
    def parse(cls, text: str, prefix: str | None = None) -> TransactionId | None:
        """The id in ``text``, or None if it is not one (or not of ``prefix``: an id of
        another sink whose prefix merely starts like this one's is not a match)."""
        head, *rest = text.rsplit(".", 4)
        if len(rest) != 4 or not all(part.isdigit() for part in rest):
            return None
        if prefix is not None and head != prefix:
            return None
        batch, partition, run, attempt = (int(part) for part in rest)
        return cls(head, batch, partition, run, attempt)

    @classmethod
    def of(cls, text: str) -> TransactionId:
        """Like :meth:`parse`, but a clear error when ``text`` is not such an id."""
        parsed = cls.parse(text)
        if parsed is None:
            raise ValueError(
                f"{text!r} is not an epochal transaction id "
                "(<prefix>.<batch>.<partition>.<run>.<attempt>)"
            )
        return parsed

    def batch_prefix(self) -> str:
        """The prefix of every id of this id's batch (for ``in_doubt`` look-ups)."""
        return f"{self.prefix}.{self.batch}."


@dataclass(frozen=True)
class TaskContext:
    """Who is writing: the job, the sink, the batch (snapshot epoch), the Spark partition and
    the task attempt. ``transaction_id`` is stable across restarts, so it can fence zombies."""

    job: str
    sink_id: str
    batch_id: int
    partition: int
    attempt: int
    schema: Schema
    run: int = 0
    """The job run (it grows at every query start), so a new run never reuses an old id."""

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


def transaction_prefix(job: str, sink_id: str) -> str:
    """The transaction id prefix of a job's sink."""
    return f"ep.{job}.{sink_id}"


def batch_of(transaction_id: str) -> int:
    """The batch id inside a transaction id (see :class:`TransactionId`)."""
    return TransactionId.of(transaction_id).batch


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
        :func:`~epochal_sdk.errors.unreachable`), a missing table or columns that do not fit."""

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
    def in_doubt(self, prefix: str) -> list[Prepared]:
        """Every prepared, unsettled transaction whose id starts with ``prefix``."""


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
