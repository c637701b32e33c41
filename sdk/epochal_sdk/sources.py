"""Source contracts: replayable sources and acknowledging sources.

A connector author implements one of these and never touches Spark. The runtime turns it into
a Spark streaming source, stores what the snapshot needs and decides when to acknowledge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from epochal_sdk.context import ConnectorContext, context_property
from epochal_sdk.guarantees import Guarantee
from epochal_sdk.options import Options
from epochal_sdk.schema import column_names

if TYPE_CHECKING:
    import pyarrow

Offset = Any
"""A position in one partition: a JSON value (an int for most sources)."""

Offsets = dict[str, Offset]
"""Positions by partition id. Stored in Spark's offset log, i.e. in the snapshot."""

Rows = Iterator["tuple[Any, ...] | dict[str, Any] | pyarrow.RecordBatch"]
"""What ``read`` yields: tuples in the order of :meth:`Source.schema`'s columns, dicts by
column name (missing columns are null), or Arrow record batches in the schema (much
faster)."""


@dataclass(frozen=True)
class Split:
    """A range of one partition that one Spark task reads: ``start`` inclusive, ``end``
    exclusive, both as returned by the source's offsets."""

    partition: str
    start: Offset
    end: Offset


class Source(ABC):
    """What every source has: options, a schema and the strongest guarantee it can give."""

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        self.options = options

    context: ConnectorContext = context_property(
        """Where this source object runs: job, part id, run, query id, and in a read task the
        batch, partition and attempt, plus the metrics handle (see
        :class:`~epochal_sdk.ConnectorContext`). Handed over by the runtime with the
        options; never read the environment or Spark for these."""
    )

    @abstractmethod
    def schema(self) -> str:
        """The columns this source produces, as a Spark DDL string (``"id bigint, v string"``)."""

    def columns(self) -> tuple[str, ...]:
        """The column names of :meth:`schema`, in order: the order of a tuple row."""
        return column_names(self.schema())

    def max_guarantee(self) -> Guarantee:
        """The strongest guarantee this source can give with these options and this server."""
        return self.MAX_GUARANTEE

    def guarantee_reason(self) -> str:
        """Why :meth:`max_guarantee` is below exactly-once, if it is (shown when the runtime
        refuses or downgrades the job). Empty by default."""
        return ""

    def check(self) -> None:
        """Called on the driver at the start of every run, before its first batch: fail here,
        with a clear error, on bad options, a missing topic or table, an unreachable server
        (raise :func:`~epochal_sdk.errors.unreachable`: it fails a job that starts and
        restarts a job that ran)."""

    def close(self) -> None:
        """Release connections. Called when the source is no longer needed."""


class ReplayableSource(Source):
    """A source that can re-read any range of its partitions exactly (Kafka, a journal, a
    table read by a monotonic column).

    Offsets live in the snapshot; after a failure the runtime re-reads the ranges of the batches
    that were not committed. ``read`` must return the same records for the same split every
    time it is called: that is what makes the source exactly-once.

    One instance is created on the driver to plan batches and one in each task to read, so
    open connections lazily and keep no state between ``read`` calls.

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
        """The current partition ids. New ids are picked up at the next batch."""

    @abstractmethod
    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        """Where a new job (or a newly discovered partition) starts reading."""

    @abstractmethod
    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        """The end of the data available now in each partition (exclusive)."""

    @abstractmethod
    def read(self, split: Split) -> Rows:
        """Yield exactly the records of ``split``, in order, every time it is called: tuples
        in :meth:`columns` order, dicts by column name, or Arrow record batches. Raise
        :class:`~epochal_sdk.DataGoneError` when records of the range are gone."""

    def max_records_per_batch(self) -> int | None:
        """The read limit per batch (admission control), usually from an option."""
        return self.options.int("maxRecordsPerBatch", None, minimum=1)

    def limit(self, start: Offsets, latest: Offsets, max_records: int) -> Offsets:
        """End offsets that cover at most ``max_records`` records from ``start``.

        The default works for integer offsets that count records; it shares the limit evenly
        between the partitions that have data. Override it for other offsets.
        """
        pending = {p: max(0, int(latest[p]) - int(start.get(p, latest[p]))) for p in latest}
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
        """The tasks of one batch: by default one split per partition that has data."""
        return [
            Split(p, start[p], end[p]) for p in sorted(end) if p in start and start[p] != end[p]
        ]


@dataclass(frozen=True)
class Message:
    """One message of an acknowledging source.

    Args:
        id: a stable ID: the same message redelivered carries the same ID.
        row: the message as a tuple in the source's schema order, or a dict by column name.
        redelivered: the broker says it delivered this message before.
    """

    id: str
    row: tuple[Any, ...] | dict[str, Any]
    redelivered: bool = False
    headers: dict[str, str] = field(default_factory=dict, compare=False)


class AcknowledgingSource(Source):
    """A source that redelivers what is not acknowledged (a JMS queue, a STOMP destination).

    The runtime keeps one instance open on the driver for the life of a query. It stores each
    batch's messages and IDs in the snapshot before the batch is planned, acknowledges only
    after the snapshot that covers them is complete, and drops redelivered IDs it has already
    stored. The connector only receives and acknowledges.
    """

    @abstractmethod
    def open(self, max_unacknowledged: int) -> None:
        """Connect and subscribe. Never hold more than ``max_unacknowledged`` unacknowledged
        messages (size the broker's prefetch from it)."""

    @abstractmethod
    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` seconds for the first."""

    @abstractmethod
    def acknowledge(self, ids: Sequence[str]) -> None:
        """Acknowledge these messages. Must tolerate IDs already acknowledged."""
