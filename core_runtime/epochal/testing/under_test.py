"""What a connector package gives the kit: the source or sink under test
(:class:`SourceUnderTest`, :class:`SinkUnderTest`), as its suite's fixtures return them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from epochal.testing.record_ids import sql_record_ids
from epochal_sdk.schema import Field


class SourceUnderTest(ABC):
    """A source connector as the kit drives it.

    Class attributes:
        connector: the connector's name (``format("epochal.<connector>")``).
        id_expr: a SQL expression over the source's columns that gives each record's
            integer ID, e.g. ``"CAST(key AS BIGINT)"``; the kit counts lost and duplicated
            records by it.
        format: optional; the format the kit reads the source with: empty (the default) for
            ``epochal.<connector>``; a source that is not an epochal connector gives its own
            (Spark's Kafka source: ``"kafka"``). The contract checks, which drive an epochal
            connector's own objects, are skipped for such a source.
        route_by_key: optional (default False); route the rows by their ID
            (``repartition``) between the source and the sink in the copy pipeline. A
            source whose replays may give rows to other Spark partitions (Spark's Kafka
            source) needs it before a sink that settles each partition on its own
            (:meth:`~epochal_sdk.Sink.settles_each_partition`), or the job is refused.

    The kit adds ``maxRecordsPerBatch`` to :meth:`options`, and, for an epochal source,
    ``minRecordsPerTask`` of half a batch (a batch's splits go to two tasks, several small ones
    sharing one, as in a job over many partitions); the runtime's own options
    (``maxRecordsPerBatch``, ``minRecordsPerTask``, an acknowledging source's
    ``receiveTimeoutMs``) need not be in the connector's ``source_options``.
    """

    connector: ClassVar[str]
    id_expr: ClassVar[str]
    format: ClassVar[str] = ""
    """The format the kit reads the source with: empty for ``epochal.<connector>``; a source
    that is not an epochal connector (Spark's own Kafka source: ``"kafka"``) gives its own."""
    route_by_key: bool = False
    """Route the rows by their ID (``repartition``) between the source and the sink in the
    copy pipeline: a source whose replays may give rows to other Spark partitions (Spark's
    Kafka source) needs it before a sink that settles each partition on its own
    (:meth:`~epochal_sdk.sinks.Sink.settles_each_partition`), or the job is refused."""

    @abstractmethod
    def options(self) -> dict[str, str]:
        """Options for ``readStream.format("epochal.<connector>")``."""

    @abstractmethod
    def produce(self, ids: Sequence[int]) -> None:
        """Put records with these IDs into the source (before the job starts). Each record
        must carry its ID so that ``id_expr`` finds it; any other columns are up to you."""

    def unsettled(self) -> list[str]:
        """What the source system still holds that the job should have settled (e.g.
        unacknowledged messages, or messages delivered and not acknowledged); must be empty
        at the end. Report the system's state as it is now, without waiting.

        When the kit calls it: only after every source it opened is closed and every process
        that held messages has ended (a contract check's dying process, a scenario's killed
        drivers and workers, the job's last driver). A broker requeues a dead consumer's
        messages, and settles the acknowledgements of a closed one, asynchronously, after it
        notices the connection is gone; the kit therefore polls ``unsettled()`` until it
        returns nothing, for up to
        :data:`~epochal.testing.contract_checks.common.REQUEUE_WAIT` seconds, and fails with
        its last answer. Likewise, after a process died, the contract checks keep receiving
        until the dead process's messages came back (or that long after the records produced
        after its death arrived). A connector's ``unsettled()`` needs no wait of its own."""
        return []

    def record_ids(self, rows: list[dict[str, Any]]) -> list[int]:
        """The record ID of each row (a dict by column name, as the source gave it), for the
        contract checks, which read without Spark: ``id_expr`` evaluated by SQLite. Override
        it only when SQLite cannot evaluate ``id_expr`` (the checks then say so)."""
        return sql_record_ids(self.id_expr, rows)


class SinkUnderTest(ABC):
    """A sink connector as the kit drives it. The pipeline writes ``key`` and ``value``
    string columns (both the record ID in the copy pipeline); the typed checks
    (``2pc-types``, ``upsert-types``) write the kit's typed record
    (:mod:`epochal.testing.contract_checks.typed`: ``key`` and a column ``c_<type>`` per
    type).

    Class attributes:
        connector: the connector's name (``writeStream.format("epochal.<connector>")``).
        types: the kit types the sink maps (``("string", "bigint", "decimal", ...)``, of
            :data:`~epochal.testing.contract_checks.typed.KIT_TYPES`): each must read back
            by value through :meth:`committed_typed`, and each other kit type must be
            refused at ``check()``. ``()``: it maps none of the typed record's columns (a
            sink with fixed column names); None (the default): not said, the typed checks
            are skipped.
    """

    connector: ClassVar[str]
    types: ClassVar[tuple[str, ...] | None] = None
    """The kit types the sink maps; None: not said (the typed checks are skipped)."""

    @abstractmethod
    def options(self, mode: str) -> dict[str, str]:
        """Options for ``writeStream.format("epochal.<connector>")`` in ``mode``
        (``transactional`` or ``idempotent``)."""

    @abstractmethod
    def committed(self, mode: str) -> list[tuple[str, str]]:
        """What an independent reader sees, as (key, value) pairs, one per visible write
        (a transactional sink's committed records; an idempotent sink's entries)."""

    def in_doubt(self) -> list[str]:
        """Prepared, unsettled transactions left in the system (must be none at the end)."""
        return []

    def committed_typed(self, mode: str, schema: tuple[Field, ...]) -> list[dict[str, Any]]:
        """What an independent reader sees of the typed records written in ``mode``, one
        dict by column name per visible write (``key`` included), each value as Python gives
        that type: ``str``, ``int``, ``float``, ``Decimal``, ``datetime`` (with its zone for
        ``timestamp``, none for ``timestamp_ntz``), ``date``, ``bool``, ``bytes``, ``list``,
        ``dict`` (a struct, or a map), None for a null. Read them as the system keeps them and
        convert only what its representation demands (a JSON text parsed, a decimal string
        made a ``Decimal``): the check compares what you return with what was written. Return
        an empty list when nothing was written yet (the kit may ask before the first batch).

        Args:
            mode: the sink mode written in.
            schema: the typed record's columns (``key`` first), with their Spark types.
        """
        raise NotImplementedError(
            f"{type(self).__name__} lists types but does not implement committed_typed()"
        )
