"""The ids the runtime derives for a sink's writes, in one place.

Every id is derived from the job, the sink's part id and the task, never random, so that a
restarted job finds what an earlier run left behind, and a newer run never reuses an older
run's id. Connectors build and read them only through these types:

* :class:`TransactionId` ``ep.<job>.<sink>.<batch>.<partition>.<run>.<attempt>``: one
  transaction of one task attempt (two-phase commit: prepared by the task, committed by the
  driver, found again by :meth:`~epochal_sdk.RecoveryScope.matches`).
* :class:`WriterId` ``ep.<job>.<sink>.<partition>``: one writer per Spark partition, the
  same for every batch, run and attempt (for systems that fence a writer by a fixed id, like
  Kafka's ``transactional.id``).
* :class:`RecordId` ``<job>.<sink>.<batch>.<partition>.<position>``: one record a task
  writes, the same on every replay of the batch (for systems that drop duplicates by an id,
  like a broker's duplicate detection).

Job names and part ids hold letters, digits, ``-`` and ``_`` only, so the dots separate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ID_PREFIX = "ep"
"""The first part of every transaction and writer id."""


def transaction_prefix(job: str, sink_id: str) -> str:
    """The transaction id prefix of a job's sink: ``ep.<job>.<sink id>``."""
    return f"{ID_PREFIX}.{job}.{sink_id}"


def _split_prefix(prefix: str) -> tuple[str, str] | None:
    parts = prefix.split(".")
    if len(parts) != 3 or parts[0] != ID_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


@dataclass(frozen=True, order=True)
class TransactionId:
    """The one id scheme of transactions driven by the runtime:
    ``<prefix>.<batch>.<partition>.<run>.<attempt>``, where ``<prefix>`` is
    ``ep.<job>.<sink id>`` (see
    :attr:`ConnectorContext.transaction_prefix <epochal_sdk.ConnectorContext.transaction_prefix>`).

    Unique per task attempt, the same on a retry of the same step, never random; the run
    grows at every query start, so a new run never reuses an old id and recovery can tell
    which run prepared a transaction. A task gets its own as
    :attr:`ConnectorContext.txn <epochal_sdk.ConnectorContext.txn>`;
    ``str(txn)`` is the id, :meth:`parse` reads one back.

    Attributes:
        prefix: ``ep.<job>.<sink id>``, the same for every transaction of the sink.
        batch: the micro-batch (snapshot epoch) the task wrote.
        partition: the Spark partition of the task.
        run: the job run that prepared it.
        attempt: the task attempt (0 for the first).
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
        another sink whose prefix merely starts like this one's is not a match).

        Args:
            text: a transaction id as the system stores it.
            prefix: the sink's prefix (``task.transaction_prefix``); None accepts any.

        Returns:
            The parsed id, or None.
        """
        head, *rest = text.rsplit(".", 4)
        if len(rest) != 4 or not all(part.isdigit() for part in rest):
            return None
        if prefix is not None and head != prefix:
            return None
        batch, partition, run, attempt = (int(part) for part in rest)
        return cls(head, batch, partition, run, attempt)

    @classmethod
    def of(cls, text: str) -> TransactionId:
        """Like :meth:`parse`, but a clear error when ``text`` is not such an id.

        Args:
            text: a transaction id.

        Returns:
            The parsed id.

        Raises:
            ValueError: ``text`` is not an epochal transaction id.
        """
        parsed = cls.parse(text)
        if parsed is None:
            raise ValueError(
                f"{text!r} is not an epochal transaction id "
                "(<prefix>.<batch>.<partition>.<run>.<attempt>)"
            )
        return parsed

    def batch_prefix(self) -> str:
        """The prefix of every id of this id's batch (for ``in_doubt`` look-ups).

        Returns:
            ``<prefix>.<batch>.``
        """
        return f"{self.prefix}.{self.batch}."

    @property
    def job(self) -> str | None:
        """The job in the prefix (None for a prefix of another form)."""
        split = _split_prefix(self.prefix)
        return split[0] if split else None

    @property
    def sink_id(self) -> str | None:
        """The sink's part id in the prefix (None for a prefix of another form)."""
        split = _split_prefix(self.prefix)
        return split[1] if split else None


def batch_of(transaction_id: str) -> int:
    """The batch id inside a transaction id (see :class:`TransactionId`)."""
    return TransactionId.of(transaction_id).batch


@dataclass(frozen=True, order=True)
class WriterId:
    """``<prefix>.<partition>``: the writer of one Spark partition of a sink, the same for
    every batch, run and attempt. For a system that fences a writer by a fixed id (a newer
    writer with the id aborts what an older one left open: Kafka's ``transactional.id``).
    A task gets its own as :attr:`ConnectorContext.writer_id
    <epochal_sdk.ConnectorContext.writer_id>`.

    Attributes:
        prefix: ``ep.<job>.<sink id>``.
        partition: the Spark partition.
    """

    prefix: str
    partition: int

    def __str__(self) -> str:
        return f"{self.prefix}.{self.partition}"

    @classmethod
    def parse(cls, text: str, prefix: str) -> WriterId | None:
        """The writer id in ``text`` if it is one of ``prefix``'s, else None.

        Args:
            text: a writer id as the system stores it.
            prefix: the sink's prefix (``task.transaction_prefix``).

        Returns:
            The parsed id, or None.
        """
        head, dot, tail = text.rpartition(".")
        if not dot or head != prefix or not tail.isdigit():
            return None
        return cls(head, int(tail))


@dataclass(frozen=True, order=True)
class RecordId:
    """``<job>.<sink>.<batch>.<partition>.<position>``: the ``position``-th record (from 0)
    that the task of ``partition`` writes in ``batch``. The same on every replay of the batch,
    whatever the run or the attempt, as long as the pipeline is deterministic (the runtime's
    key-stability check fails a replay that is not): for a system that drops duplicates by an
    id (a broker's duplicate detection). A task gets one per record from
    :meth:`ConnectorContext.record_id <epochal_sdk.ConnectorContext.record_id>`.

    Attributes:
        job: the job's name.
        sink_id: the sink's part id.
        batch: the micro-batch.
        partition: the Spark partition of the task.
        position: the record's position among the task's records, from 0.
    """

    job: str
    sink_id: str
    batch: int
    partition: int
    position: int

    def __str__(self) -> str:
        return f"{self.job}.{self.sink_id}.{self.batch}.{self.partition}.{self.position}"


Purpose = Literal["recovery", "batch", "inspect"]


@dataclass(frozen=True)
class RecoveryScope:
    """What an ``in_doubt`` look-up is for, handed to
    :meth:`~epochal_sdk.TransactionalSink.in_doubt` by the runtime.

    Attributes:
        prefix: the sink's transaction id prefix (``ep.<job>.<sink id>``).
        purpose: ``recovery``: at the start of a run (or an operator settling a stopped
            job): every batch; nothing of the job runs, and what is found is committed (if
            decided) or rolled back. ``batch``: after batch :attr:`batch` was decided, its
            tasks' failed attempts are rolled back. ``inspect``: an operator lists what is in
            doubt; change nothing.
        batch: the one batch looked at (``batch``), else None (every batch).
        run: the run asking (None for an operator): transactions of later runs are a newer
            driver's and are never settled by this one.
    """

    prefix: str
    purpose: Purpose = "recovery"
    batch: int | None = None
    run: int | None = None

    @property
    def recovery(self) -> bool:
        """Whether this is the look-up of a run's (or an operator's) recovery."""
        return self.purpose == "recovery"

    @property
    def head(self) -> str:
        """What every id in scope starts with: ``<prefix>.`` for every batch,
        ``<prefix>.<batch>.`` for one; ``in_doubt`` searches the system for it."""
        if self.batch is None:
            return f"{self.prefix}."
        return f"{self.prefix}.{self.batch}."

    def matches(self, transaction_id: str) -> bool:
        """Whether ``transaction_id`` is a transaction of this sink (and of :attr:`batch`).

        Args:
            transaction_id: an id found in the system.

        Returns:
            True when it parses as this sink's :class:`TransactionId` (of :attr:`batch`,
            when set).
        """
        txn = TransactionId.parse(transaction_id, self.prefix)
        return txn is not None and (self.batch is None or txn.batch == self.batch)
