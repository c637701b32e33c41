"""Source contracts: replayable sources and acknowledging sources.

A connector author implements one of these and never touches Spark. The runtime turns it into
a Spark streaming source, stores what the snapshot needs and decides when to acknowledge.

Where a source's code runs (one process of each kind, each with its own source objects;
nothing in memory survives from one process to the next):

* **the driver's long-lived source runner**: the Python worker Spark keeps on the driver for
  the life of one query run (from a query start to its stop or crash). It builds one source
  object, calls :meth:`~epochal_sdk.sources.Source.check` on it first, then plans every batch
  with it
  (:class:`ReplayableSource`: ``partitions``, ``latest_offsets``, ...;
  :class:`AcknowledgingSource`: ``open`` once, then ``receive`` and ``acknowledge``) and
  calls :meth:`~epochal_sdk.sources.Source.close` when the query stops. A crash or a restart ends
  the process (without ``close``); the next run starts a new one.
* **a task on an executor** (replayable sources only): a new source object per task, whose
  :meth:`~epochal_sdk.ReplayableSource.read` reads the task's split (or whose
  :meth:`~epochal_sdk.ReplayableSource.read_splits` reads its splits, when the runtime gave it
  several small ones) and whose ``close`` is called right after. An acknowledging source is
  never built in a task: tasks read the stored batch.
* **the driver's planner**: builds a short-lived source object to ask for
  :meth:`~epochal_sdk.sources.Source.schema` when a query is defined.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from epochal_sdk.context import ConnectorContext
from epochal_sdk.guarantees import Guarantee
from epochal_sdk.options import Options
from epochal_sdk.schema import column_names

if TYPE_CHECKING:
    import pyarrow

Offset = Any
"""A position in one partition: a JSON value (an int for most sources). Offsets are compared
with ``==`` (a split whose start equals its end is empty) and stored as JSON, so use ints,
strings or lists of them, never floats or objects."""

Offsets = dict[str, Offset]
"""Positions by partition id. Stored in Spark's offset log, i.e. in the snapshot."""

MIN_RECORDS_PER_TASK = 50_000
"""The default of :meth:`~epochal_sdk.ReplayableSource.min_records_per_task`: a Python
task's fixed cost is tens of milliseconds, its reading some 100 000 records a second, so a task
of this many keeps that cost under a fifth of the task while a batch of 100 000 records over 2
partitions still gets 2 tasks."""

Rows = Iterator["tuple[Any, ...] | dict[str, Any] | pyarrow.RecordBatch"]
"""What ``read`` yields: tuples in the order of :meth:`~epochal_sdk.sources.Source.schema`'s
columns, dicts by column name (missing columns are null), or Arrow record batches in the
schema (much faster)."""


@dataclass(frozen=True)
class Split:
    """A range of one partition that one Spark task reads: ``start`` inclusive, ``end``
    exclusive, both as returned by the source's offsets.

    Attributes:
        partition: the partition's id (one of :meth:`ReplayableSource.partitions`).
        start: the first offset to read (inclusive).
        end: the offset after the last one to read (exclusive).
    """

    partition: str
    start: Offset
    end: Offset


class Source(ABC):
    """What every source has: options, a schema and the strongest guarantee it can give.

    Subclass :class:`ReplayableSource` or :class:`AcknowledgingSource`, never this class
    directly. The runtime builds the source as ``YourSource(options)`` wherever it needs one
    (see the module doc: the driver's source runner, each read task, the planner), so keep
    the constructor cheap: read and check options there, open connections later.

    Attributes:
        options: the options the user gave the source (``.option(...)``), typed getters
            included; ``options.context`` is :attr:`context`.
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE
    """The strongest guarantee the connector can give; the default of :meth:`max_guarantee`.
    A connector that cannot replay exactly says so here (e.g. ``Guarantee.AT_LEAST_ONCE``)."""

    def __init__(self, options: Options) -> None:
        self.options = options

    @property
    def context(self) -> ConnectorContext:
        """Where this source object runs: job, part id, run, query id, and in a read task the
        batch, partition and attempt, plus the metrics handle (see
        :class:`~epochal_sdk.ConnectorContext`). Handed over by the runtime with the
        options; never read the environment or Spark for these."""
        return self.options.context

    @abstractmethod
    def schema(self) -> str:
        """The columns this source produces, as a Spark DDL string (``"id bigint, v string"``).

        Called on the driver when a query is defined (by the planner, on a short-lived
        object). It must return the same columns every time for the same options: a
        restarted job reads its snapshot's rows in this schema.

        Returns:
            A Spark DDL string, ``"<name> <type>, ..."``.
        """

    def columns(self) -> tuple[str, ...]:
        """The column names of :meth:`schema`, in order: the order of a tuple row.

        Returns:
            The names, e.g. ``("id", "v")``.
        """
        return column_names(self.schema())

    def max_guarantee(self) -> Guarantee:
        """The strongest guarantee this source can give with these options and this server.

        Called in the driver's source runner at every query start, after :meth:`check`; the
        job's guarantee is lowered to it (or the job refused) as the job's settings say.
        Override to look at options or the server; the default is :attr:`MAX_GUARANTEE`.

        Returns:
            A :class:`~epochal_sdk.Guarantee`.
        """
        return self.MAX_GUARANTEE

    def guarantee_reason(self) -> str:
        """Why :meth:`max_guarantee` is below exactly-once, if it is (shown when the runtime
        refuses or downgrades the job). Empty by default.

        Returns:
            One sentence for the user, or ``""``.
        """
        return ""

    def check(self) -> None:
        """Fail early, with a clear error, on what would make the job fail later.

        Called in the driver's source runner at the start of every run (each query start:
        the first one, a restart in place, a new driver), before :meth:`max_guarantee` and
        before the first batch is planned; on an acknowledging source also before
        :meth:`~epochal_sdk.AcknowledgingSource.open`. Raise on bad options, a missing topic or
        table, an
        unreachable server (raise what :func:`~epochal_sdk.unreachable` returns: it fails a
        job that starts and restarts a job that ran). A source's ``check`` never creates what
        it reads.

        Raises:
            ~epochal_sdk.ConfigError: an option is missing or wrong
                (``self.options.error(...)``).
        """

    def close(self) -> None:
        """Release connections. Called when this object is no longer needed: after
        :meth:`check` (the runtime checks on an object of its own), after a task's
        :meth:`~epochal_sdk.ReplayableSource.read`, and when the query stops (the source runner's
        object). Never called on a process that is killed; it may be called twice, and on an
        object that never opened anything."""


class ReplayableSource(Source):
    """A source that can re-read any range of its partitions exactly (Kafka, a journal, a
    table read by a monotonic column).

    Offsets live in the snapshot; after a failure the runtime re-reads the ranges of the batches
    that were not committed. ``read`` must return the same records for the same split every
    time it is called: that is what makes the source exactly-once.

    One instance is created on the driver to plan batches and one in each task to read, so
    open connections lazily and keep no state between ``read`` calls.

    How one batch goes: the driver's source runner calls :meth:`partitions`,
    :meth:`initial_offsets` (for partitions it has not seen), :meth:`latest_offsets` and, with
    a read limit, :meth:`limit`, at every trigger (also when nothing new arrived: that is how
    the runtime learns there is no batch to run); when the end differs from the start, the
    batch's offsets are written to the snapshot and :meth:`splits` divides the range into
    tasks (several small splits share a task: :meth:`min_records_per_task`); each task calls
    :meth:`read` (or :meth:`read_splits`) on a new object. After a crash, the batches that were
    planned but not committed are planned again from the offsets in the snapshot and read
    again: the same :class:`Split` ranges, so ``read`` must give the same records.

    Partitions may come and go. A new partition joins at its :meth:`initial_offsets` and is
    read from the next batch. A partition that :meth:`partitions` no longer lists keeps its
    last offset in the snapshot and is simply not read (nothing of it is planned); if it comes
    back, reading goes on from that offset. A range that a batch must read (again) but whose
    data is gone (retention, a deleted partition, a replaced file) is never skipped:
    :meth:`read` raises :class:`~epochal_sdk.DataGoneError`, which fails the job with your
    message.
    """

    @abstractmethod
    def partitions(self) -> list[str]:
        """The current partition ids. New ids are picked up at the next batch.

        Called in the driver's source runner at the first start of a job and at every
        trigger (each attempt to plan a batch, every trigger interval, also when idle), so
        keep it cheap (one listing call).

        Returns:
            Partition ids, as strings (the keys of :data:`~epochal_sdk.sources.Offsets`).
        """

    @abstractmethod
    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        """Where a new job (or a newly discovered partition) starts reading.

        Called in the driver's source runner: once for every partition when a job starts
        with an empty checkpoint, and at a trigger for each partition that appears in
        :meth:`partitions` for the first time. Usually the beginning of the data, or its end
        when an option says to start from new data only.

        Args:
            partitions: the partitions to give a start for.

        Returns:
            An offset for each of ``partitions``.
        """

    @abstractmethod
    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        """The end of the data available now in each partition (exclusive).

        Called in the driver's source runner at every trigger (with Trigger.AvailableNow once,
        at the query's start). Count only data that :meth:`read` can read in full and that
        will not change (e.g. whole lines of a file another process appends to, committed
        rows of a table).

        Args:
            partitions: the partitions listed by :meth:`partitions` at this trigger.

        Returns:
            The exclusive end offset of each of ``partitions``.
        """

    @abstractmethod
    def read(self, split: Split) -> Rows:
        """Yield exactly the records of ``split``, in order, every time it is called: tuples
        in :meth:`columns` order, dicts by column name, or Arrow record batches. Raise
        :class:`~epochal_sdk.DataGoneError` when records of the range are gone.

        Called in a task on an executor, on a new source object (closed after the task),
        once per split of a batch and again for every retry of the task and every replay of
        the batch after a crash: each call must give the same records.
        ``self.context.batch`` and ``self.context.partition`` name the batch and the Spark
        task.

        Args:
            split: the partition and the offsets ``[start, end)`` to read.

        Returns:
            An iterator of rows (:data:`~epochal_sdk.sources.Rows`).

        Raises:
            ~epochal_sdk.DataGoneError: records of the range no longer exist.
        """

    def max_records_per_batch(self) -> int | None:
        """The read limit per batch (admission control), usually from an option.

        Called in the driver's source runner at each query start. The default reads the
        ``maxRecordsPerBatch`` option (records); None means no limit (a batch takes all that
        :meth:`latest_offsets` reports).

        Returns:
            The most records one batch may read, or None.
        """
        return self.options.int("maxRecordsPerBatch", None, minimum=1)

    def limit(self, start: Offsets, latest: Offsets, max_records: int) -> Offsets:
        """End offsets that cover at most ``max_records`` records from ``start``.

        The default works for integer offsets that count records; it shares the limit evenly
        between the partitions that have data. Override it for other offsets.

        Called in the driver's source runner at every trigger when there is a read limit
        (:meth:`max_records_per_batch`).

        Args:
            start: where the batch starts, per partition.
            latest: what :meth:`latest_offsets` reported, per partition.
            max_records: the read limit (records).

        Returns:
            The batch's end offsets, for each partition between its start and its latest.
        """
        pending = {
            p: max(0, int(latest[p]) - int(start[p] if p in start else latest[p])) for p in latest
        }
        end = dict(latest)
        remaining = max_records
        active = sorted(p for p, n in pending.items() if n > 0)
        while active and remaining > 0:
            share = max(1, remaining // len(active))
            still = []
            for p in active:
                if remaining <= 0:
                    break
                take = min(share, pending[p], remaining)
                pending[p] -= take
                remaining -= take
                if pending[p] > 0:
                    still.append(p)
            active = still
        for p, left in pending.items():
            end[p] = int(latest[p]) - left
        return end

    def splits(self, start: Offsets, end: Offsets) -> list[Split]:
        """The tasks of one batch: by default one split per partition that has data.

        Called in the driver's source runner once for each planned batch, and again for a
        batch that is planned again after a crash (with the same offsets: return the same
        splits). Override to cut a large range into several tasks.

        Args:
            start: the batch's start offsets (inclusive).
            end: the batch's end offsets (exclusive).

        Returns:
            The splits, one Spark task each.
        """
        return [
            Split(p, start[p], end[p]) for p in sorted(end) if p in start and start[p] != end[p]
        ]

    def min_records_per_task(self) -> int:
        """How many records a Spark task should read at least: the runtime gives one task
        several small splits of a batch (:meth:`read_splits`) until it holds this many, so
        that a batch over many partitions pays a task's fixed cost (a Python worker's hand-off,
        a connection, a sink's transaction) a few times, not once per partition. 0 keeps one
        task per split.

        Called in the driver's source runner when it plans a batch; the number of tasks it
        gives a batch is kept in the batch's offsets, so a replay reads the same splits
        together. The default reads the ``minRecordsPerTask`` option
        (:data:`~epochal_sdk.sources.MIN_RECORDS_PER_TASK` when it is not given); it counts
        records as the offsets' differences, so a source whose offsets are not integers that
        count records is never grouped.

        Returns:
            The least records per task (0: one task per split).
        """
        return self.options.int("minRecordsPerTask", MIN_RECORDS_PER_TASK, minimum=0) or 0

    def read_splits(self, splits: Sequence[Split]) -> Rows:
        """Yield the records of several splits of one batch that one task reads (see
        :meth:`min_records_per_task`): by default :meth:`read` of each, in turn, on this
        object. Override to read them together (one connection, one request for all); each
        split's records must still come in order, and be exactly those :meth:`read` gives.

        Called in a task instead of :meth:`read` when the task has more than one split.

        Args:
            splits: the task's splits (of different partitions, in partition order).

        Returns:
            An iterator of rows (:data:`~epochal_sdk.sources.Rows`).
        """
        for split in splits:
            yield from self.read(split)


@dataclass(frozen=True)
class Message:
    """One message of an acknowledging source, as :meth:`AcknowledgingSource.receive`
    returns it.

    Attributes:
        id: a stable ID: the same message redelivered carries the same ID (the runtime drops
            a redelivery by it and passes it to :meth:`AcknowledgingSource.acknowledge`).
            Never an ID of one delivery (a delivery tag, a receipt handle).
        row: the message as a tuple in the source's schema order, or a dict by column name.
        redelivered: the broker says it delivered this message before (JMS
            ``JMSRedelivered``, a pending entry read again or claimed). The runtime warns
            when such a message is not in its dedupe window.
        headers: the broker's headers, for the connector's own use; the runtime neither
            stores nor reads them (put what the pipeline needs into ``row``).
    """

    id: str
    row: tuple[Any, ...] | dict[str, Any]
    redelivered: bool = False
    headers: dict[str, str] = field(default_factory=dict, compare=False)


class AcknowledgingSource(Source):
    """A source that redelivers what is not acknowledged (a JMS queue, a STOMP destination,
    or a log with pending lists: Redis Streams consumer groups, Kafka share groups, NATS
    JetStream, SQS).

    The runtime keeps one instance open on the driver for the life of a query. It stores each
    batch's messages and IDs in the snapshot before the batch is planned, acknowledges only
    after the snapshot that covers them is complete, and drops redelivered IDs it has already
    stored. The connector only receives and acknowledges.

    Every call below runs in the driver's long-lived source runner, on one object per query
    run: :meth:`~epochal_sdk.sources.Source.check`, :meth:`open` once, then :meth:`receive` at
    every trigger and :meth:`acknowledge` after every snapshot,
    :meth:`~epochal_sdk.sources.Source.close` when the query stops.
    Tasks never build the source. After a crash a new process opens a new object: every
    message received but not acknowledged before must come back from the system (a broker
    redelivers it to the new session by itself; a pull-based log must read its own pending
    entries again and claim those of consumers that are gone; see docs/authors/guides).

    At-least-once, the runtime keeps batches in memory instead of the snapshot and
    acknowledges once Spark committed them; nothing is dropped as a redelivery.

    The time between calls: the runtime calls the source once per trigger (``receive`` to
    plan a batch, ``acknowledge`` after a batch's snapshot). Between two calls it runs the
    batch (read tasks, the sink's write and commit) and waits for the next trigger, so the
    longest gap is the longest batch plus the trigger interval, with no bound the runtime
    sets (a slow sink can make it minutes). A client's heartbeats (STOMP ``heart-beat``,
    AMQP ``heartbeat``) must not depend on the source being called: use a client that sends
    them from its own I/O thread (stomp.py does; pika's ``BlockingConnection`` does not). A
    call that finds the connection gone raises :class:`~epochal_sdk.RestartableError`: the
    job restarts from its last snapshot and what was not acknowledged comes back.
    """

    @abstractmethod
    def open(self, max_unacknowledged: int) -> None:
        """Connect and subscribe. Never hold more than ``max_unacknowledged`` unacknowledged
        messages (size the broker's prefetch from it).

        Called once per query run in the driver's source runner, before the first
        :meth:`receive` (at the first trigger, after
        :meth:`~epochal_sdk.sources.Source.check`). A source over a
        log with pending lists starts here what :meth:`receive` replays: its own pending
        entries first.

        Args:
            max_unacknowledged: twice the read limit (``maxRecordsPerBatch``, default 10,000
                records): the batch waiting for its snapshot and the next one. A broker's
                prefetch (or consumer window) sized by it keeps messages from piling up
                unacknowledged in this process.
        """

    @abstractmethod
    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` seconds for the first.

        Called in the driver's source runner at every trigger (each attempt to plan a batch,
        also when idle), and again at once when every message it returned was a redelivery
        the runtime already holds. Not called while a batch stored before a crash waits to
        be planned again. What it returns is stored (exactly-once) before anything is
        acknowledged; do not acknowledge here.

        Args:
            max_messages: the most messages to return (records: the read limit,
                ``maxRecordsPerBatch``).
            timeout: seconds to wait for the first message when none is there (the
                ``receiveTimeoutMs`` option / 1000; 0.2 by default; may be 0: do not wait).

        Returns:
            The messages, in the order received; an empty list when none came in
            ``timeout`` (the runtime then plans no batch at this trigger).
        """

    @abstractmethod
    def acknowledge(self, ids: Sequence[str]) -> None:
        """Acknowledge these messages. Must tolerate IDs already acknowledged.

        Called in the driver's source runner after the snapshot that covers a batch is
        complete: once per batch with its IDs (and the redeliveries of it the runtime
        dropped), in batch order; and at once for a redelivery of a batch acknowledged
        before. After a restart it also gets the IDs of a batch stored by the crashed
        process, received by an earlier object or session: acknowledge them if the system
        can (a pull-based log can: ``XACK`` takes any pending ID), ignore them if it cannot
        (a broker redelivers them to this session, and the runtime drops and acknowledges
        the redeliveries). Never raise for an unknown or settled ID.

        A broker that acknowledges by a handle of one delivery (an AMQP delivery tag, a
        STOMP ``ack`` id, a JMS message object) must never be given an ID this session did
        not receive, nor a handle twice: AMQP closes the channel on an unknown or already
        acknowledged delivery tag (a channel error), requeueing every unacknowledged
        delivery of it. Keep this session's handles by message ID, acknowledge each once,
        never cumulatively (AMQP ``multiple=True``, JMS ``CLIENT_ACKNOWLEDGE``):
        :class:`epochal_sdk.DeliveryHandles` does that.

        When it returns, every acknowledgement must have been handed to the client on the
        live session (sent, or queued on a connection whose ``close`` sends it first); it
        need not be confirmed by the broker (AMQP's ack has no reply). One that never
        reached the broker costs no record: the message is redelivered to the next session
        and the runtime drops it by ID (it keeps the IDs of the last ``dedupeWindowBatches``
        batches) and acknowledges it again; at-least-once it is a duplicate, which
        at-least-once allows. Raise :class:`~epochal_sdk.RestartableError` when the session
        is known to be lost.

        Args:
            ids: message IDs (:attr:`Message.id`): one batch's, or fewer.
        """
