"""The acknowledging-source protocol, in one place: exactly-once (:class:`AckProtocol`) and
at-least-once (:class:`MemoryAcks`), the stored batches' keys and format, and the reading of
a batch in a task (:func:`read_batch`). The Spark reader only calls these.

Exactly-once, for each batch the driver-side reader:

1. receives messages and drops those whose ID is already in a stored batch (redeliveries);
2. stores the batch (messages and IDs) in the snapshot store *before* the batch is planned;
3. lets Spark read the stored batch (a replay after a failure reads the same file);
4. acknowledges the batch's IDs only in ``commit(end)``, i.e. after the snapshot that covers
   it is complete, and records that it did.

Dropped redeliveries are acknowledged too (at once if their batch is already committed, else
with their batch). The IDs of the last ``window_batches`` batches (at most ``window_ids`` IDs)
form the dedupe window; it is rebuilt from the store after a restart. A redelivered message
older than the window is passed on and logged loudly, never dropped or passed silently.

At-least-once, batches stay in the driver's memory and travel to the tasks inside the plan;
a replay after a restart finds nothing, and the broker redelivers what was not acknowledged.

Fencing (see :mod:`epochal.state.lease.fence`): a stored batch is handed to Spark only if the fence
still holds after it was stored, and acknowledgements are sent only after a fence check (in both
modes), so a driver that lost the job's lease neither plans nor acknowledges anything. Crash
points: ``ack_source.after_receive`` (messages received, nothing stored or acknowledged: a
source that acknowledges on receipt loses them here), ``ack_source.after_store``
(exactly-once), ``ack_source.before_ack`` and ``ack_source.after_ack`` (both modes).
"""

from __future__ import annotations

import io
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochal.state.store import SnapshotStore
from epochal_sdk import AcknowledgingSource, Message

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("epochal.ack")

ID_COLUMN = "__epochal_message_id"
Step = Callable[[str, int], None]
FenceCheck = Callable[[str], None]


@dataclass
class DedupeStats:
    """What the dedupe window holds and has done (reported in metrics)."""

    window_batches: int
    window_ids: int
    ids_held: int = 0
    oldest_batch: int | None = None
    duplicates_dropped: int = 0
    redeliveries_outside_window: int = 0

    def as_dict(self) -> dict[str, Any]:
        """For logs and metrics."""
        return dict(self.__dict__)


@dataclass
class AckState:
    """In-memory state of the driver-side reader, rebuilt from the store on restart."""

    last_stored: int = 0
    last_acked: int = 0
    window: OrderedDict[str, int] = field(default_factory=OrderedDict)
    pending: dict[int, list[str]] = field(default_factory=dict)


def batch_key(source_id: str, seq: int) -> str:
    """Where stored batch ``seq`` of source ``source_id`` lives in the snapshot store."""
    return f"sources/{source_id}/batches/{seq:012d}"


def _tuple(row: tuple[Any, ...] | dict[str, Any], names: list[str]) -> tuple[Any, ...]:
    return tuple(row.get(n) for n in names) if isinstance(row, dict) else tuple(row)


def encode_batch(messages: Sequence[Message], schema: pa.Schema) -> bytes:
    """A stored batch: the rows in the source schema plus the message IDs, as Arrow IPC.
    Rows are tuples in schema order or dicts by column name."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    names = list(schema.names)
    rows = [_tuple(m.row, names) for m in messages]
    columns = list(zip(*rows, strict=True)) if messages else []
    arrays = [
        pa.array(list(columns[i]) if columns else [], type=schema.field(i).type)
        for i in range(len(schema))
    ]
    ids = pa.array([m.id for m in messages], type=pa.string())
    table = pa.RecordBatch.from_arrays(
        [*arrays, ids], schema=schema.append(pa.field(ID_COLUMN, pa.string()))
    )
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_batch(table)
    return sink.getvalue()


def decode_batch(data: bytes) -> pa.RecordBatch:
    """The inverse of :func:`encode_batch` (with the ID column)."""
    import pyarrow.ipc as ipc

    return ipc.open_stream(io.BytesIO(data)).read_all().combine_chunks().to_batches()[0]


def read_batch(
    store: SnapshotStore | None, source_id: str, seq: int, payload: bytes | None = None
) -> pa.RecordBatch:
    """The rows of batch ``seq`` as a task reads them (without the ID column): from the
    ``payload`` the plan carried (at-least-once), else from the store (exactly-once: a replay
    reads the same stored file)."""
    if payload is None:
        if store is None:
            raise RuntimeError(f"batch {seq} of source {source_id} has neither store nor payload")
        payload = store.read(batch_key(source_id, seq))
    return decode_batch(payload).drop_columns([ID_COLUMN])


class _Measured:
    """What a protocol measured since the reader last reported (see :mod:`epochal.metrics`)."""

    def __init__(self) -> None:
        self.measured: dict[str, float] = {}

    def _note(self, **values: float) -> None:
        for key, value in values.items():
            self.measured[key] = self.measured.get(key, 0.0) + float(value)

    def drain_measured(self) -> dict[str, float]:
        """What was measured since the last call (records, bytes, drops, acks, timings)."""
        out, self.measured = self.measured, {}
        return out


class AckProtocol(_Measured):
    """Ack-after-snapshot with dedupe for one acknowledging source of one job (exactly-once)."""

    exactly_once = True

    def __init__(
        self,
        store: SnapshotStore,
        source: AcknowledgingSource,
        source_id: str,
        schema: pa.Schema,
        *,
        window_batches: int = 100,
        window_ids: int = 1_000_000,
        step: Step | None = None,
        fence: FenceCheck | None = None,
    ) -> None:
        super().__init__()
        self.store, self.source, self.source_id, self.schema = store, source, source_id, schema
        self.stats = DedupeStats(window_batches, window_ids)
        self.step = step or (lambda point, batch: None)
        self.fence = fence or (lambda doing: None)
        self.state = AckState()
        self._restore()

    # -- keys -------------------------------------------------------------------------------
    def batch_key(self, seq: int) -> str:
        """Where stored batch ``seq`` lives."""
        return batch_key(self.source_id, seq)

    def _acked_key(self) -> str:
        return f"sources/{self.source_id}/acked"

    # -- restart ----------------------------------------------------------------------------
    def _restore(self) -> None:
        keys = self.store.list(f"sources/{self.source_id}/batches")
        for key in keys:
            seq = int(key.rsplit("/", 1)[1])
            ids = decode_batch(self.store.read(key)).column(ID_COLUMN).to_pylist()
            for message_id in ids:
                self.state.window[message_id] = seq
            self.state.last_stored = max(self.state.last_stored, seq)
        if self.store.exists(self._acked_key()):
            self.state.last_acked = int(self.store.read_json(self._acked_key())["seq"])
        self._trim_window()

    # -- planning ---------------------------------------------------------------------------
    def next_batch(self, start_seq: int, max_messages: int, timeout: float) -> int:
        """Store the next batch after ``start_seq`` and return its sequence number (or
        ``start_seq`` when nothing new arrived). Stored-but-unplanned batches are reused."""
        if self.state.last_stored > start_seq:
            return start_seq + 1  # left over from a run that crashed before planning it
        kept: list[Message] = []
        dropped = self.stats.duplicates_dropped
        outside = self.stats.redeliveries_outside_window
        while not kept:  # redeliveries alone are not "no new data": receive again
            received = self.source.receive(max_messages, timeout)
            if not received:
                break
            self.step("ack_source.after_receive", start_seq + 1)
            kept = [m for m in received if not self._is_duplicate(m)]
        self._note(
            dedupe_dropped=self.stats.duplicates_dropped - dropped,
            redeliveries_outside_window=self.stats.redeliveries_outside_window - outside,
        )
        if not kept:
            return start_seq
        seq = start_seq + 1
        data = encode_batch(kept, self.schema)
        started = time.perf_counter()
        self.store.write(self.batch_key(seq), data, count=len(kept))
        self._note(
            records_in=len(kept),
            bytes_in=len(data),
            store_seconds=time.perf_counter() - started,
            store_seconds_count=1,
        )
        self.fence(f"stored batch {seq}: handing it to Spark")
        for message in kept:
            self.state.window[message.id] = seq
        self.state.last_stored = seq
        self._trim_window()
        self.step("ack_source.after_store", seq)
        return seq

    def _is_duplicate(self, message: Message) -> bool:
        seq = self.state.window.get(message.id)
        if seq is None:
            if message.redelivered:
                self.stats.redeliveries_outside_window += 1
                log.warning(
                    "source %s: message %s was redelivered but is not in the dedupe window "
                    "(last %s batches, %s ids, oldest batch %s); passing it on: it MAY be a "
                    "duplicate. Widen dedupeWindowBatches if this repeats.",
                    self.source_id,
                    message.id,
                    self.stats.window_batches,
                    self.stats.window_ids,
                    self.stats.oldest_batch,
                )
            return False
        self.stats.duplicates_dropped += 1
        if seq <= self.state.last_acked:
            self.source.acknowledge([message.id])
        else:
            self.state.pending.setdefault(seq, []).append(message.id)
        return True

    def read(self, seq: int) -> pa.RecordBatch:
        """The rows of stored batch ``seq`` (without the ID column)."""
        return read_batch(self.store, self.source_id, seq)

    def batches(self, start_seq: int, end_seq: int) -> list[int]:
        """The stored batches a plan from ``start_seq`` (exclusive) to ``end_seq`` reads."""
        return list(range(start_seq + 1, end_seq + 1))

    def payload(self, seq: int) -> bytes | None:
        """Nothing: tasks read stored batches from the store."""
        return None

    # -- after the snapshot -----------------------------------------------------------------
    def commit(self, end_seq: int) -> int:
        """The snapshot covering batches up to ``end_seq`` is complete: acknowledge them.
        Returns how many IDs were acknowledged."""
        acked = 0
        self.step("ack_source.before_ack", end_seq)
        self.fence(f"acknowledging up to stored batch {end_seq}")
        started = time.perf_counter()
        first = max(self.state.last_acked, 0) + 1
        for seq in range(first, end_seq + 1):
            if not self.store.exists(self.batch_key(seq)):
                continue
            ids = decode_batch(self.store.read(self.batch_key(seq))).column(ID_COLUMN).to_pylist()
            ids += self.state.pending.pop(seq, [])
            self.source.acknowledge(ids)
            acked += len(ids)
        # redeliveries of the last committed batch after a restart
        for seq in [s for s in self.state.pending if s <= end_seq]:
            ids = self.state.pending.pop(seq)
            self.source.acknowledge(ids)
            acked += len(ids)
        if acked:
            self._note(acked=acked, ack_seconds=time.perf_counter() - started, ack_seconds_count=1)
        self.step("ack_source.after_ack", end_seq)
        if end_seq > self.state.last_acked:
            self.store.write_json(self._acked_key(), {"seq": end_seq})
            self.state.last_acked = end_seq
        self._prune()
        return acked

    def _trim_window(self) -> None:
        while len(self.state.window) > self.stats.window_ids:
            self.state.window.popitem(last=False)
        self._refresh_stats()

    def _prune(self) -> None:
        keep_from = self.state.last_acked - self.stats.window_batches + 1
        for key in self.store.list(f"sources/{self.source_id}/batches"):
            if int(key.rsplit("/", 1)[1]) < keep_from:
                self.store.delete(key)
        stale = [i for i, s in self.state.window.items() if s < keep_from]
        for message_id in stale:
            del self.state.window[message_id]
        self._refresh_stats()

    def _refresh_stats(self) -> None:
        self.stats.ids_held = len(self.state.window)
        self.stats.oldest_batch = next(iter(self.state.window.values()), None)


class MemoryAcks(_Measured):
    """At-least-once acknowledgements for one acknowledging source: batches stay in memory,
    travel to the tasks inside the plan, and are acknowledged once Spark committed them. A
    replay after a restart finds nothing; the broker redelivers what was not acknowledged."""

    exactly_once = False

    def __init__(
        self,
        source: AcknowledgingSource,
        schema: pa.Schema,
        *,
        step: Step | None = None,
        fence: FenceCheck | None = None,
    ) -> None:
        super().__init__()
        self.source, self.schema = source, schema
        self.step = step or (lambda point, batch: None)
        self.fence = fence or (lambda doing: None)
        self.memory: dict[int, list[Message]] = {}
        self.last_seq = 0

    def next_batch(self, start_seq: int, max_messages: int, timeout: float) -> int:
        """Receive the next batch after ``start_seq`` into memory; returns its sequence
        number (or ``start_seq`` when nothing arrived)."""
        messages = self.source.receive(max_messages, timeout)
        if not messages:
            return start_seq
        self.step("ack_source.after_receive", max(self.last_seq, start_seq) + 1)
        self.last_seq = max(self.last_seq, start_seq) + 1
        self.memory[self.last_seq] = messages
        self._note(records_in=len(messages))
        return self.last_seq

    def batches(self, start_seq: int, end_seq: int) -> list[int]:
        """The batches of a plan that this process still holds (none after a restart)."""
        return [seq for seq in range(start_seq + 1, end_seq + 1) if seq in self.memory]

    def payload(self, seq: int) -> bytes:
        """Batch ``seq`` as the task reads it (rows and IDs, Arrow IPC)."""
        data = encode_batch(self.memory[seq], self.schema)
        self._note(bytes_in=len(data))
        return data

    def commit(self, end_seq: int) -> int:
        """Spark committed the batches up to ``end_seq``: acknowledge what memory holds of
        them (after a fence check). Returns how many IDs were acknowledged."""
        done = sorted(s for s in self.memory if s <= end_seq)
        self.step("ack_source.before_ack", end_seq)
        if done:
            self.fence(f"acknowledging up to batch {end_seq}")
        started = time.perf_counter()
        acked = 0
        for seq in done:
            ids = [m.id for m in self.memory.pop(seq)]
            self.source.acknowledge(ids)
            acked += len(ids)
        if done:
            self._note(acked=acked, ack_seconds=time.perf_counter() - started, ack_seconds_count=1)
            self.step("ack_source.after_ack", end_seq)
        return acked
