"""Broken variants ("mutants") of the reference connectors: the bugs each contract invites,
one per class, each changing ONE thing of the map connector (replayable source, transactional
and idempotent sink) or of the test queue (``testqueue``, an acknowledging source). The
first line of each class's docstring names the bug and the guarantee it breaks.

Each mutant is a connector of its own (``mutant-<base>-<bug>``), so that Spark's Python
workers can build it: load them with ``EPOCHAL_PLUGINS=tests.conformance.mutants``. The bug
catalogue (:mod:`tests.conformance.catalogue`) runs the kit against every one of them and shows
which case catches it. Needs ``epochal-map`` (installed next to the kit).
"""

from __future__ import annotations

import datetime
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from epochal.testing.broker import TestQueueSource
from epochal_map.sink import MapSink, MapTransaction, MapWriter
from epochal_map.source import MapJournalSource, to_batch
from epochal_map.store import MapStore
from epochal_sdk import (
    ConnectorContext,
    IdempotentWriter,
    Message,
    Prepared,
    RecoveryScope,
    Split,
    Transaction,
    TransactionId,
)
from epochal_sdk.connector import Connector
from epochal_sdk.hookspecs import hookimpl
from epochal_sdk.sinks import Sink
from epochal_sdk.sources import Source


# -- replayable source (the map's journal) -----------------------------------------------------
class ShuffledReadSource(MapJournalSource):
    """read yields a split's rows in another order each time (as a query without ORDER BY):
    a replay is not the same batch (exactly-once broken for order-dependent results)."""

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        batches = list(super().read(split))
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        order = list(range(table.num_rows))
        random.shuffle(order)
        yield from table.take(order).to_batches()


class ReadToEndSource(MapJournalSource):
    """read ignores split.end and reads to the partition's current end: a replay returns
    other records, and the next batch reads them again (duplicates under exactly-once)."""

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        end = self.store.journal_end(self.target.map, int(split.partition))
        yield from super().read(Split(split.partition, split.start, end))


class EndInclusiveSource(MapJournalSource):
    """read takes split.end as inclusive (an off-by-one): the first record of the next batch
    is read twice (duplicates under exactly-once)."""

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        partition = int(split.partition)
        events = self.store.journal_read(
            self.target.map, partition, int(split.start), int(split.end) + 1
        )
        if events:
            yield to_batch(partition, events)


class StartExclusiveSource(MapJournalSource):
    """read takes split.start as exclusive (an off-by-one): the first record of every split
    is never read (records lost)."""

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        partition = int(split.partition)
        events = self.store.journal_read(
            self.target.map, partition, int(split.start) + 1, int(split.end)
        )
        if events:
            yield to_batch(partition, events)


class GroupedReadSource(MapJournalSource):
    """read_splits reads the first split of a task given several and skips the rest (a
    batching read that keeps only its first request): the other small partitions of the
    batch are never read (records lost)."""

    def read_splits(self, splits: Sequence[Split]) -> Iterator[pa.RecordBatch]:
        yield from self.read(splits[0])


class ReadTimeSource(MapJournalSource):
    """read stamps each row with the time of the read instead of the event's: a replay is a
    different batch (exactly-once broken for windows, joins and dedupe by row)."""

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        for batch in super().read(split):
            now = datetime.datetime.now(datetime.UTC)
            stamps = pa.array([now] * batch.num_rows, type=batch.schema.field("event_time").type)
            index = batch.schema.get_field_index("event_time")
            yield batch.set_column(index, "event_time", stamps)


class FirstLookEndSource(MapJournalSource):
    """latest_offsets answers with the journal's end at the object's first look (a reader
    that lists what there is once, as a table source that caches its file listing): records
    that arrive while the job runs are never planned by its driver (lost for as long as it
    runs; a job at a processing-time trigger never catches up)."""

    _ends: dict[str, int] | None = None

    def latest_offsets(self, partitions: Sequence[str]) -> dict[str, int]:
        if self._ends is None:
            self._ends = dict(super().latest_offsets(self.partitions()))
        return {p: self._ends.get(p, 0) for p in partitions}


# -- acknowledging source (the test queue) -----------------------------------------------------
class AckOnReceiptSource(TestQueueSource):
    """receive acknowledges what it returns (ack on receipt, before the snapshot): a driver
    that dies before the batch is stored loses those messages (at-most-once)."""

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        got = super().receive(max_messages, timeout)
        self.acknowledge([m.id for m in got])
        return got


class DropRedeliveredSource(TestQueueSource):
    """receive acknowledges and drops messages flagged redelivered (as if the runtime had them
    already): what a driver received but never stored before dying is lost (at-most-once)."""

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        got = super().receive(max_messages, timeout)
        again = [m.id for m in got if m.redelivered]
        if again:
            self.acknowledge(again)
        return [m for m in got if not m.redelivered]


class SessionIdSource(TestQueueSource):
    """a message's ID includes the consumer session (a delivery tag): after a restart its
    redelivery has a new ID, the runtime cannot drop it (duplicates under exactly-once)."""

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        got = super().receive(max_messages, timeout)
        return [Message(f"{self.session}/{m.id}", m.row, m.redelivered) for m in got]

    def acknowledge(self, ids: Sequence[str]) -> None:
        super().acknowledge([i.rpartition("/")[2] for i in ids])


class IgnoredAckSource(TestQueueSource):
    """acknowledge does nothing: every message comes back at each restart and the queue never
    drains (duplicates once they leave the dedupe window)."""

    def acknowledge(self, ids: Sequence[str]) -> None:
        return None


class CumulativeAckSource(TestQueueSource):
    """acknowledge settles every message delivered to the session so far, not only the IDs
    it is given (as JMS CLIENT_ACKNOWLEDGE): received, unstored ones die with a crash
    (at-most-once)."""

    def acknowledge(self, ids: Sequence[str]) -> None:
        assert self.broker is not None, "open() first"
        if not ids:
            return
        delivered = self.broker.conn.execute(
            "SELECT id FROM messages WHERE queue = ? AND session = ? AND state = 'delivered'",
            (self.queue, self.session),
        ).fetchall()
        super().acknowledge([row[0] for row in delivered])


class StrictAckSource(TestQueueSource):
    """acknowledge refuses IDs already acknowledged (an unknown delivery tag): the runtime
    acknowledges again after a restart, which then fails every time (the job never recovers)."""

    def acknowledge(self, ids: Sequence[str]) -> None:
        assert self.broker is not None, "open() first"
        for message_id in ids:
            row = self.broker.conn.execute(
                "SELECT state FROM messages WHERE queue = ? AND id = ?", (self.queue, message_id)
            ).fetchone()
            if row is None or row[0] != "delivered":
                raise RuntimeError(f"message {message_id} is not waiting for an acknowledgement")
        super().acknowledge(ids)


class AckOnCloseSource(TestQueueSource):
    """close acknowledges every message delivered to its session, the ones it prefetched and
    never handed over included (a consumer that settles its session when it is closed): they
    are lost when a job is stopped or its source restarted (at-most-once)."""

    PREFETCH = 5

    def open(self, max_unacknowledged: int) -> None:
        super().open(max_unacknowledged + self.PREFETCH)
        self.prefetched: list[Message] = []

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        if len(self.prefetched) < max_messages + self.PREFETCH:
            self.prefetched += super().receive(max_messages + self.PREFETCH, timeout)
        handed, self.prefetched = self.prefetched[:max_messages], self.prefetched[max_messages:]
        return handed

    def close(self) -> None:
        if self.broker is not None:
            pending = [
                row[0]
                for row in self.broker.conn.execute(
                    "SELECT id FROM messages WHERE queue = ? AND session = ? "
                    "AND state = 'delivered'",
                    (self.queue, self.session),
                )
            ]
            self.broker.ack(self.queue, self.session, pending)
        super().close()


# -- transactional sink (the map, two-phase commit) --------------------------------------------
class CommitOnAbortTransaction(MapTransaction):
    """Writes what it holds when it is aborted."""

    def abort(self) -> None:
        if self.items:
            self.sink.store.put_all(self.sink.target.map, self.items)
        super().abort()


class CommitOnAbortSink(MapSink):
    """abort writes the transaction's rows where readers see them instead of dropping them:
    a task stopped or failed before it prepared leaves its rows, which the batch's next
    attempt writes again (duplicates under exactly-once)."""

    def begin(self, task: ConnectorContext) -> Transaction:
        return CommitOnAbortTransaction(self, str(task.txn))


class VisiblePrepareTransaction(MapTransaction):
    """Applies the rows in ``prepare`` and stages nothing."""

    def prepare(self) -> dict[str, str]:
        self.sink.store.put_all(self.sink.target.map, self.items)
        self.sink.store.stage(self.transaction_id, self.sink.target.map, [])
        self.items = []
        return self.sink._data()


class VisiblePrepareSink(MapSink):
    """prepare writes the rows where readers see them (it commits instead of staging): a
    failed attempt's or an undecided batch's rows stay (duplicates under exactly-once)."""

    def begin(self, task: ConnectorContext) -> Transaction:
        return VisiblePrepareTransaction(self, str(task.txn))


class CarriedRowsTransaction(MapTransaction):
    """Stages nothing: the prepared handle carries the rows."""

    def prepare(self) -> dict[str, Any]:
        items = [list(item) for item in self.items]
        self.sink.store.stage(self.transaction_id, self.sink.target.map, [])
        self.items = []
        return {**self.sink._data(), "items": items}


class RecommitSink(MapSink):
    """commit applies the transaction's rows every time it is called (it never looks whether
    it committed already): a phase 2 retried after a crash writes the batch twice (duplicates
    under exactly-once)."""

    def begin(self, task: ConnectorContext) -> Transaction:
        return CarriedRowsTransaction(self, str(task.txn))

    def commit(self, prepared: Prepared) -> None:
        items = [(str(k), str(v)) for k, v in (prepared.data or {}).get("items", [])]
        self.store.put_all(self.target.map, items)
        self.store.commit_staged(prepared.transaction_id)


class KeptRollbackSink(MapSink):
    """rollback does nothing: a failed attempt's or an undecided batch's transaction stays
    prepared, its rows staged, in doubt forever (a lingering transaction)."""

    def rollback(self, prepared: Prepared) -> None:
        return None


class BlindInDoubtSink(MapSink):
    """in_doubt finds nothing: recovery never rolls back what a dead attempt or run prepared,
    which stays in doubt forever (a lingering transaction)."""

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        return []


class RunOnlyInDoubtSink(MapSink):
    """in_doubt answers only a run's look-up (``scope.run`` set), as a sink that builds the
    ids to probe from the asking run does: the operator's settling before ``jobs cancel``
    deletes a job (no run asks) finds nothing, and what the dead run prepared stays in doubt
    forever (a lingering transaction)."""

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        return super().in_doubt(scope) if scope.run is not None else []


class TodaysWritersInDoubtSink(MapSink):
    """in_doubt looks only among the transactions of the writers a job of two tasks has
    (Spark partitions 0 and 1), as a sink that probes its transactional ids by task index up
    to the parallelism it was built for does: after the job's parallelism changed, what the
    writers that are gone prepared stays in doubt forever (a lingering transaction)."""

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        found = super().in_doubt(scope)
        return [p for p in found if TransactionId.of(p.transaction_id).partition < 2]


_IN_MEMORY: dict[str, tuple[str, list[tuple[str, str]]]] = {}
"""What :class:`MemoryPrepareSink`'s transactions prepared, in this process only."""


class MemoryPrepareTransaction(MapTransaction):
    """Keeps its rows in this process's memory at ``prepare``."""

    def prepare(self) -> dict[str, str]:
        _IN_MEMORY[self.transaction_id] = (self.sink.target.map, list(self.items))
        self.items = []
        return self.sink._data()

    def abort(self) -> None:
        self.items = []
        _IN_MEMORY.pop(self.transaction_id, None)


class MemoryPrepareSink(MapSink):
    """prepare keeps the rows in the process's memory instead of staging them durably: the
    driver's commit, in another process, finds nothing to commit (records lost)."""

    def begin(self, task: ConnectorContext) -> Transaction:
        return MemoryPrepareTransaction(self, str(task.txn))

    def commit(self, prepared: Prepared) -> None:
        found = _IN_MEMORY.pop(prepared.transaction_id, None)
        if found is not None:
            self.store.put_all(*found)

    def rollback(self, prepared: Prepared) -> None:
        _IN_MEMORY.pop(prepared.transaction_id, None)

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        return [Prepared(t, self._data()) for t in _IN_MEMORY if t.startswith(scope.head)]


class SkipEmptyTransaction(MapTransaction):
    """Stages nothing when it holds no rows."""

    def prepare(self) -> dict[str, str]:
        if not self.items:
            return self.sink._data()
        return super().prepare()


class SkipEmptyPrepareSink(MapSink):
    """prepare of a task that got no rows records no transaction: the commit of its batch
    fails (unknown transaction) at every restart (the job never recovers)."""

    def begin(self, task: ConnectorContext) -> Transaction:
        return SkipEmptyTransaction(self, str(task.txn))


# -- idempotent sink (the map, upsert by key) --------------------------------------------------
class AppendingWriter(MapWriter):
    """Writes each record under a key of its own."""

    def flush(self) -> None:
        store, name = self.sink.store, self.sink.target.map
        taken: set[str] = set()
        items = []
        for key, value in self.items:
            candidate, n = key, 0
            while candidate in taken or store.get(name, candidate) is not None:
                n += 1
                candidate = f"{key}#{n}"
            taken.add(candidate)
            items.append((candidate, value))
        if items:
            store.put_all(name, items)
        self.items = []


class AppendingSink(MapSink):
    """the upsert appends: writing a key again adds an entry instead of replacing the old
    one, so a replayed batch is there twice (duplicates under exactly-once)."""

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        return AppendingWriter(self)


class TimeKeyedWriter(MapWriter):
    """Puts the time of the write into each key."""

    def flush(self) -> None:
        stamp = time.time_ns()
        if self.items:
            self.sink.store.put_all(
                self.sink.target.map, [(f"{k}@{stamp}", v) for k, v in self.items]
            )
        self.items = []


class UnstableKeySink(MapSink):
    """the key written carries the time of the write (an unstable key): a replayed batch
    writes new entries instead of overwriting its first ones (duplicates under exactly-once)."""

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        return TimeKeyedWriter(self)


ASYNC_FLUSH_DELAY = 5.0
"""Seconds :class:`BackgroundFlushSink`'s writes lag behind its ``flush``."""


class BackgroundFlushWriter(MapWriter):
    """Hands its rows to a thread that writes them a moment later."""

    def flush(self) -> None:
        items, self.items = self.items, []
        if not items:
            return
        path, name = self.sink.target.path, self.sink.target.map
        timer = threading.Timer(ASYNC_FLUSH_DELAY, _write_later, (path, name, items))
        timer.daemon = True
        timer.start()


def _write_later(path: str, name: str, items: list[tuple[str, str]]) -> None:
    with MapStore(path) as store:
        store.put_all(name, items)


class BackgroundFlushSink(MapSink):
    """flush returns before the rows are written (a thread writes them a moment later): a task
    killed right after its flush loses them (at-least-once broken)."""

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        return BackgroundFlushWriter(self)


class LastBatchWriter(MapWriter):
    """Replaces its buffer with each Arrow batch."""

    def write(self, batch: pa.RecordBatch) -> None:
        self.items = self.sink.to_items(batch)
        self.rows = batch.num_rows


class LastBatchSink(MapSink):
    """write replaces its buffer instead of adding to it: a task given several Arrow batches
    keeps only the last one (records lost)."""

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        return LastBatchWriter(self)


class ShiftedValueWriter(MapWriter):
    """Pairs each key with the next record's value."""

    def flush(self) -> None:
        if self.items:
            keys = [k for k, _ in self.items]
            values = [v for _, v in self.items]
            self.sink.store.put_all(
                self.sink.target.map, list(zip(keys, values[1:] + values[:1], strict=True))
            )
        self.items = []


class ShiftedValueSink(MapSink):
    """the upsert pairs each key with the next record's value (an off-by-one between two
    columns): every key is there once, with another record's value (wrong values)."""

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        return ShiftedValueWriter(self)


class FirstValueWriter(MapWriter):
    """Writes only the keys the map does not hold yet."""

    def flush(self) -> None:
        store, name = self.sink.store, self.sink.target.map
        new = [(k, v) for k, v in self.items if store.get(name, k) is None]
        if new:
            store.put_all(name, new)
        self.items = []


class FirstValueSink(MapSink):
    """the upsert keeps a key's first value (an INSERT that ignores conflicts): an update
    never shows (a running aggregate stops at its first value)."""

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        return FirstValueWriter(self)


class LocalTimeSink(MapSink):
    """the transaction writes a timestamp as the wall-clock time of its zone, the zone dropped
    (a naive datetime): every record is there once, its instant shifted for any reader not in
    that zone (wrong values)."""

    def to_items(self, batch: pa.RecordBatch, first_row: int = 0) -> list[tuple[str, str]]:
        columns = {
            name: [v.replace(tzinfo=None) if v is not None else None for v in column.to_pylist()]
            for name, column in zip(batch.schema.names, batch.columns, strict=True)
            if pa.types.is_timestamp(column.type) and column.type.tz
        }
        if columns:
            for name, values in columns.items():
                index = batch.schema.get_field_index(name)
                batch = batch.set_column(index, name, pa.array(values, pa.timestamp("us")))
        return super().to_items(batch, first_row)


class NullAsTextSink(MapSink):
    """the upsert writes a null as the text ``None`` (``str()`` of every value): every key is
    there once, its nulls turned into strings (wrong values)."""

    def to_items(self, batch: pa.RecordBatch, first_row: int = 0) -> list[tuple[str, str]]:
        items = []
        for key, value in super().to_items(batch, first_row):
            record = json.loads(value) if value.startswith("{") else None
            if isinstance(record, dict):
                value = json.dumps({k: "None" if v is None else v for k, v in record.items()})
            items.append((key, value))
        return items


# -- the mutants as connectors -----------------------------------------------------------------
def _connector(name: str, part: type[Source] | type[Sink]) -> type[Connector]:
    is_source = issubclass(part, Source)
    summary = (part.__doc__ or "").strip().split("\n")[0]
    return type(
        f"Connector_{part.__name__}",
        (Connector,),
        {
            "__doc__": f"``{name}``: {summary}",
            "__module__": __name__,
            "name": name,
            "description": (part.__doc__ or "").strip(),
            "source_class": part if is_source else None,
            "sink_class": None if is_source else part,
        },
    )


MUTANT_PARTS: dict[str, tuple[str, type[Source] | type[Sink]]] = {
    # name: (contract, class)
    "mutant-map-shuffled-read": ("replayable", ShuffledReadSource),
    "mutant-map-read-to-end": ("replayable", ReadToEndSource),
    "mutant-map-end-inclusive": ("replayable", EndInclusiveSource),
    "mutant-map-start-exclusive": ("replayable", StartExclusiveSource),
    "mutant-map-read-time": ("replayable", ReadTimeSource),
    "mutant-map-grouped-read": ("replayable", GroupedReadSource),
    "mutant-map-first-look-end": ("replayable", FirstLookEndSource),
    "mutant-testqueue-ack-on-receipt": ("acknowledging", AckOnReceiptSource),
    "mutant-testqueue-drop-redelivered": ("acknowledging", DropRedeliveredSource),
    "mutant-testqueue-session-ids": ("acknowledging", SessionIdSource),
    "mutant-testqueue-ack-ignored": ("acknowledging", IgnoredAckSource),
    "mutant-testqueue-cumulative-ack": ("acknowledging", CumulativeAckSource),
    "mutant-testqueue-strict-ack": ("acknowledging", StrictAckSource),
    "mutant-testqueue-ack-on-close": ("acknowledging", AckOnCloseSource),
    "mutant-map-visible-prepare": ("transactional", VisiblePrepareSink),
    "mutant-map-recommit": ("transactional", RecommitSink),
    "mutant-map-kept-rollback": ("transactional", KeptRollbackSink),
    "mutant-map-blind-in-doubt": ("transactional", BlindInDoubtSink),
    "mutant-map-todays-writers-in-doubt": ("transactional", TodaysWritersInDoubtSink),
    "mutant-map-run-only-in-doubt": ("transactional", RunOnlyInDoubtSink),
    "mutant-map-memory-prepare": ("transactional", MemoryPrepareSink),
    "mutant-map-skip-empty-prepare": ("transactional", SkipEmptyPrepareSink),
    "mutant-map-local-time": ("transactional", LocalTimeSink),
    "mutant-map-commit-on-abort": ("transactional", CommitOnAbortSink),
    "mutant-map-append": ("idempotent", AppendingSink),
    "mutant-map-unstable-key": ("idempotent", UnstableKeySink),
    "mutant-map-background-flush": ("idempotent", BackgroundFlushSink),
    "mutant-map-last-batch": ("idempotent", LastBatchSink),
    "mutant-map-first-value": ("idempotent", FirstValueSink),
    "mutant-map-shifted-value": ("idempotent", ShiftedValueSink),
    "mutant-map-null-as-text": ("idempotent", NullAsTextSink),
}
"""Every mutant: its connector name, the contract it breaks and its source or sink class."""

CONNECTORS: dict[str, type[Connector]] = {
    name: _connector(name, part) for name, (_, part) in MUTANT_PARTS.items()
}
"""The mutants as connectors, by name."""


def bug_of(name: str) -> str:
    """The bug of mutant ``name``: its class's docstring, on one line."""
    return " ".join((MUTANT_PARTS[name][1].__doc__ or "").split())


@hookimpl
def register_connectors(register: Callable[[type], None]) -> None:
    """Register every mutant (``EPOCHAL_PLUGINS=tests.conformance.mutants``)."""
    for connector in CONNECTORS.values():
        register(connector)
