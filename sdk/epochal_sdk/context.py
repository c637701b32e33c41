"""What the runtime tells a connector about where it runs, and where it counts things.

Every source and sink object has a :class:`ConnectorContext` (``self.context``): the job, the
part's id, the run, Spark's query id, and inside a task the batch, the Spark partition, the
attempt and the schema it writes, with the ids derived from them (transaction, writer,
record). A connector never reads the runtime's environment or Spark's task context for
these: the runtime builds the context and hands it over with the options.

:class:`~epochal_sdk.context.Metrics` is the context's metrics handle: what a connector counts
there (rows it
skipped, round trips, retries) shows up in the part's per-batch metrics next to what the
runtime measures itself (records and bytes in and out, commit-phase latencies, ...).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from epochal_sdk.guarantees import Guarantee
from epochal_sdk.ids import RecordId, TransactionId, WriterId, transaction_prefix
from epochal_sdk.schema import Field

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class Metrics:
    """A connector's own counters and timings for one part (thread-safe, picklable).

    Names are lowercase ``snake_case`` (``rows_skipped``, ``round_trips``); the runtime shows
    them as ``epochal_connector_<name>`` (counters) and ``epochal_connector_<name>_seconds``
    (timings), labelled with the job, the part and the connector. Values are summed per
    batch: a counter counts, a timing adds up seconds and how many were taken.

    Example::

        self.context.metrics.count("rows_skipped", skipped)
        with self.context.metrics.timer("flush"):
            self._flush()
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}

    def count(self, name: str, value: float = 1) -> None:
        """Add ``value`` to the counter ``name``.

        Args:
            name: the counter, lowercase ``snake_case`` (``rows_skipped``).
            value: how much to add (a count: records, round trips, retries).

        Raises:
            ValueError: ``name`` is not lowercase ``snake_case``.
        """
        self._add(_checked(name), float(value))

    def observe(self, name: str, seconds: float) -> None:
        """Record one timing of ``name`` (seconds): its sum and its count grow.

        Args:
            name: the timing, lowercase ``snake_case`` (``round_trip``); shown as
                ``epochal_connector_<name>_seconds``.
            seconds: how long it took, in seconds.
        """
        key = _checked(name)
        self._add(f"{key}_seconds", float(seconds))
        self._add(f"{key}_seconds_count", 1.0)

    @contextlib.contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """Time the block as one :meth:`observe` of ``name`` (also when it raises).

        Args:
            name: the timing, lowercase ``snake_case``.
        """
        started = time.perf_counter()
        try:
            yield
        finally:
            self.observe(name, time.perf_counter() - started)

    def values(self) -> dict[str, float]:
        """What was recorded so far (a copy).

        Returns:
            Counters by name; a timing as ``<name>_seconds`` (the sum) and
            ``<name>_seconds_count``.
        """
        with self._lock:
            return dict(self._values)

    def drain(self) -> dict[str, float]:
        """What was recorded so far, and start again from nothing (the runtime calls this
        when it reports a batch).

        Returns:
            The same as :meth:`values`.
        """
        with self._lock:
            out, self._values = self._values, {}
        return out

    def _add(self, key: str, value: float) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def __getstate__(self) -> dict[str, Any]:
        return {"_values": self.values()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._values = dict(state.get("_values", {}))

    def __repr__(self) -> str:
        return f"Metrics({self.values()!r})"


def _checked(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"metric name {name!r}: use lowercase letters, digits and '_', starting with a "
            "letter (e.g. 'rows_skipped')"
        )
    return name


@dataclass(frozen=True)
class ConnectorContext:
    """Where a source or sink object runs; ``self.context`` of every source and sink, and the
    ``task`` a transactional sink's :meth:`~epochal_sdk.TransactionalSink.begin` and an
    idempotent sink's :meth:`~epochal_sdk.IdempotentSink.open` get.

    Outside a job (a script or a unit test that builds a source by hand) every field has its
    default: job ``default``, run 0, no query, no batch. A test that drives a sink by hand
    builds a task's context with the first fields in order:
    ``ConnectorContext("job", "my-sink", batch, partition, attempt, schema, run=1)``.

    What it holds where the code runs: in a task on an executor, the batch, the Spark
    partition, the attempt (and a sink's schema); in a sink's commit worker on the driver,
    the batch it commits; in the driver's source runner and planner, no batch and no
    partition. The runtime builds a new context for every object it builds; a connector
    never changes one (it is frozen) and never builds one in a job.

    Attributes:
        job: the job's name.
        part_id: this source's or sink's id in the job (``epochal.id``, else the connector
            name and a hash of its options, secrets left out): it names the part's snapshot
            entries and is in its transaction ids.
        batch: the micro-batch (snapshot epoch) a task or a commit works on; None while
            planning and recovering.
        partition: the Spark partition of a task; None on the driver.
        attempt: the task attempt (0 for the first); 0 on the driver.
        schema: the columns a sink's task writes (empty for a source, and on the driver).
        run: the job run; it grows at every query start (cold, in place, standby), so a new
            run never reuses an old transaction id.
        query_id: Spark's streaming query id: the same across the runs of one checkpoint,
            new when a job starts over with a fresh checkpoint ("" when it is not known, e.g.
            while a query is planned for the first time).
        guarantee: the part's effective guarantee (the job's, lowered by options and by what
            the connector said it can give); exactly-once before it is known.
        metrics: where the connector counts its own things (see
            :class:`~epochal_sdk.context.Metrics`).
        incarnation: the job's incarnation (see :mod:`epochal_sdk.ids`): new when a job is
            created anew under a name, the same for all its runs; in every id below, so a
            successor under the same name never reuses a predecessor's id ("" for a job
            recorded without one, and outside a job).
    """

    job: str = "default"
    part_id: str = ""
    batch: int | None = None
    partition: int | None = None
    attempt: int = 0
    schema: tuple[Field, ...] = ()
    run: int = 0
    query_id: str = ""
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    metrics: Metrics = field(default_factory=Metrics, compare=False, repr=False)
    incarnation: str = ""

    @property
    def in_task(self) -> bool:
        """Whether this object runs in a Spark task (an executor), not on the driver: True
        when :attr:`partition` is set."""
        return self.partition is not None

    @property
    def transaction_prefix(self) -> str:
        """The prefix of every transaction id of this part
        (``ep.<job>.<incarnation>.<part id>``, see ``transaction_prefix``):
        what :class:`~epochal_sdk.RecoveryScope` and the ids below start with."""
        return transaction_prefix(self.job, self.part_id, self.incarnation)

    @property
    def txn(self) -> TransactionId:
        """This task attempt's transaction id
        (``<prefix>.<batch>.<partition>.<run>.<attempt>``; ``str(task.txn)`` is the text):
        unique per task attempt, stable across retries of the same step, never random. In a
        task only."""
        batch, partition = self._task("a transaction id")
        return TransactionId(self.transaction_prefix, batch, partition, self.run, self.attempt)

    @property
    def writer_id(self) -> WriterId:
        """This task's writer, ``<prefix>.<partition>``: the same for every batch, run and
        attempt (for systems that fence writers by a fixed id, like Kafka's
        ``transactional.id``). In a task only."""
        _, partition = self._task("a writer id")
        return WriterId(self.transaction_prefix, partition)

    def record_id(self, position: int) -> str:
        """The id of the ``position``-th record (from 0) this task writes: the same on every
        replay of the batch (see :class:`~epochal_sdk.ids.RecordId`). In a task only."""
        batch, partition = self._task("a record id")
        return str(RecordId(self.job, self.part_id, batch, partition, position, self.incarnation))

    def _task(self, what: str) -> tuple[int, int]:
        if self.batch is None or self.partition is None:
            raise ValueError(
                f"{what} exists only in a task (a context with a batch and a partition); "
                f"this one has batch {self.batch}, partition {self.partition}"
            )
        return self.batch, self.partition
