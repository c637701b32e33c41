"""The ids the runtime derives for a sink's writes, in one place.

Every id is derived from the job, its incarnation, the sink's part id and the task, never
random, so that a restarted job finds what an earlier run left behind, and a newer run never
reuses an older run's id. Connectors build and read them only through these types:

* :class:`TransactionId` ``ep.<job>.<incarnation>.<sink>.<batch>.<partition>.<run>.<attempt>``:
  one transaction of one task attempt (two-phase commit: prepared by the task, committed by
  the driver, found again by :meth:`~epochal_sdk.RecoveryScope.matches`).
* :class:`WriterId` ``ep.<job>.<incarnation>.<sink>.<partition>``: one writer per Spark
  partition, the same for every batch, run and attempt (for systems that fence a writer by a
  fixed id, like Kafka's ``transactional.id``).
* :class:`RecordId` ``<job>.<incarnation>.<sink>.<batch>.<partition>.<position>``: one record
  a task writes, the same on every replay of the batch (for systems that drop duplicates by
  an id, like a broker's duplicate detection).

**The incarnation** tells apart the jobs that carried the same name one after another. A job
created anew (its first ``run``, ``run --replace``, a ``run`` after ``jobs cancel``, a session
job whose job directory was emptied) gets a new one, recorded in its job record; every
restart, resume and run of that job keeps it, so recovery finds its own earlier runs'
transactions, while a successor under the same name never reuses (and so never collides
with, nor is taken for a zombie of) a predecessor's transaction, writer or record id. It is
``new_incarnation``: the job record's creation time in milliseconds, in base 36 (8
characters until the year 2059), made to differ from the predecessor's when there is one. A
job recorded before incarnations existed has none (``""``): its ids keep the form without it
(``ep.<job>.<sink>...``), and every reader parses both forms.

Job names and part ids hold letters, digits, ``-`` and ``_`` only, so the dots separate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ID_PREFIX = "ep"
"""The first part of every transaction and writer id."""


_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def new_incarnation(created: float, previous: str = "") -> str:
    """The incarnation of a job created at ``created`` (seconds since the epoch, as the job
    record keeps it): the milliseconds in base 36. When the job replaces a predecessor of
    the same name (``previous``, its incarnation), the result differs from it even if both
    were created in the same millisecond.

    Args:
        created: the job record's creation time.
        previous: the incarnation of the job this one replaces ("" when there is none).

    Returns:
        A short token of digits and lowercase letters.
    """
    millis = int(created * 1000)
    while True:
        digits = ""
        value = millis
        while True:
            value, rest = divmod(value, 36)
            digits = _BASE36[rest] + digits
            if not value:
                break
        if digits != previous:
            return digits
        millis += 1


def job_head(job: str) -> str:
    """What every transaction and writer id of ``job`` starts with, whatever its incarnation
    and sink: ``ep.<job>.``."""
    return f"{ID_PREFIX}.{job}."


def transaction_prefix(job: str, sink_id: str, incarnation: str = "") -> str:
    """The transaction id prefix of a job's sink: ``ep.<job>.<incarnation>.<sink id>``, or
    ``ep.<job>.<sink id>`` for a job recorded without an incarnation (``incarnation`` "")."""
    if incarnation:
        return f"{ID_PREFIX}.{job}.{incarnation}.{sink_id}"
    return f"{ID_PREFIX}.{job}.{sink_id}"


@dataclass(frozen=True)
class PrefixParts:
    """What a transaction prefix names (see ``transaction_prefix``).

    Attributes:
        job: the job's name.
        incarnation: the job's incarnation ("" for the form without one).
        sink_id: the sink's part id.
    """

    job: str
    incarnation: str
    sink_id: str

    @classmethod
    def parse(cls, prefix: str) -> PrefixParts | None:
        """The parts of ``prefix`` in either form, or None for a prefix of another form."""
        parts = prefix.split(".")
        if parts[0] != ID_PREFIX or not all(parts[1:]):
            return None
        if len(parts) == 3:
            return cls(parts[1], "", parts[2])
        if len(parts) == 4:
            return cls(parts[1], parts[2], parts[3])
        return None

    @property
    def prefix(self) -> str:
        """The prefix again (``transaction_prefix``)."""
        return transaction_prefix(self.job, self.sink_id, self.incarnation)


@dataclass(frozen=True, order=True)
class TransactionId:
    """The one id scheme of transactions driven by the runtime:
    ``<prefix>.<batch>.<partition>.<run>.<attempt>``, where ``<prefix>`` is
    ``ep.<job>.<incarnation>.<sink id>`` (``ep.<job>.<sink id>`` for a job without an
    incarnation; see
    :attr:`ConnectorContext.transaction_prefix <epochal_sdk.ConnectorContext.transaction_prefix>`).

    Unique per task attempt, the same on a retry of the same step, never random; the run
    grows at every query start, so a new run never reuses an old id and recovery can tell
    which run prepared a transaction. A task gets its own as
    :attr:`ConnectorContext.txn <epochal_sdk.ConnectorContext.txn>`;
    ``str(txn)`` is the id, :meth:`parse` reads one back.

    Attributes:
        prefix: ``ep.<job>.<incarnation>.<sink id>``, the same for every transaction of
            the sink.
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
        split = PrefixParts.parse(self.prefix)
        return split.job if split else None

    @property
    def incarnation(self) -> str | None:
        """The job's incarnation in the prefix ("" for the form without one, None for a
        prefix of another form)."""
        split = PrefixParts.parse(self.prefix)
        return split.incarnation if split else None

    @property
    def sink_id(self) -> str | None:
        """The sink's part id in the prefix (None for a prefix of another form)."""
        split = PrefixParts.parse(self.prefix)
        return split.sink_id if split else None


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
        prefix: ``ep.<job>.<incarnation>.<sink id>`` (see ``transaction_prefix``).
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
    """``<job>.<incarnation>.<sink>.<batch>.<partition>.<position>`` (without
    ``<incarnation>.`` for a job recorded without one): the ``position``-th record (from 0)
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
        incarnation: the job's incarnation ("" for a job recorded without one).
    """

    job: str
    sink_id: str
    batch: int
    partition: int
    position: int
    incarnation: str = ""

    def __str__(self) -> str:
        job = f"{self.job}.{self.incarnation}" if self.incarnation else self.job
        return f"{job}.{self.sink_id}.{self.batch}.{self.partition}.{self.position}"


Purpose = Literal["recovery", "batch", "inspect"]


@dataclass(frozen=True)
class RecoveryScope:
    """What an ``in_doubt`` look-up is for, handed to
    :meth:`~epochal_sdk.TransactionalSink.in_doubt` by the runtime.

    Attributes:
        prefix: the sink's transaction id prefix (``transaction_prefix``).
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
