"""The acknowledging-source protocol, in one place.

For each batch the driver-side reader:

1. receives messages and drops those whose ID is already in a stored batch (redeliveries);
2. stores the batch (messages and IDs) in the snapshot store *before* the batch is planned;
3. lets Spark read the stored batch (a replay after a failure reads the same file);
4. acknowledges the batch's IDs only in ``commit(end)``, i.e. after the snapshot that covers
   it is complete, and records that it did.

Dropped redeliveries are acknowledged too (at once if their batch is already committed, else
with their batch). The IDs of the last ``window_batches`` batches (at most ``window_ids`` IDs)
form the dedupe window; it is rebuilt from the store after a restart. A redelivered message
older than the window is passed on and logged loudly, never dropped or passed silently.

Fencing (see :mod:`epochal.fence`): a stored batch is handed to Spark only if the fence still
holds after it was stored, and acknowledgements are sent only after a fence check, so a
driver that lost the job's lease neither plans nor acknowledges anything.
"""

from __future__ import annotations

import io
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from epochal.store import SnapshotStore
from epochal_sdk import AcknowledgingSource, Message

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


def encode_batch(messages: Sequence[Message], schema: pa.Schema) -> bytes:
    """A stored batch: the rows in the source schema plus the message IDs, as Arrow IPC."""
    columns = list(zip(*(m.row for m in messages), strict=True)) if messages else []
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
    return ipc.open_stream(io.BytesIO(data)).read_all().combine_chunks().to_batches()[0]


class AckProtocol:
    """Ack-after-snapshot with dedupe for one acknowledging source of one job."""

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
        self.store, self.source, self.source_id, self.schema = store, source, source_id, schema
        self.stats = DedupeStats(window_batches, window_ids)
        self.step = step or (lambda point, batch: None)
        self.fence = fence or (lambda doing: None)
        self.state = AckState()
        self._restore()

    # -- keys -------------------------------------------------------------------------------
    def batch_key(self, seq: int) -> str:
        """Where stored batch ``seq`` lives."""
        return f"sources/{self.source_id}/batches/{seq:012d}"

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
        while not kept:  # redeliveries alone are not "no new data": receive again
            received = self.source.receive(max_messages, timeout)
            if not received:
                break
            kept = [m for m in received if not self._is_duplicate(m)]
        if not kept:
            return start_seq
        seq = start_seq + 1
        self.store.write(self.batch_key(seq), encode_batch(kept, self.schema), count=len(kept))
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
        batch = decode_batch(self.store.read(self.batch_key(seq)))
        return batch.drop_columns([ID_COLUMN])

    # -- after the snapshot -----------------------------------------------------------------
    def commit(self, end_seq: int) -> int:
        """The snapshot covering batches up to ``end_seq`` is complete: acknowledge them.
        Returns how many IDs were acknowledged."""
        acked = 0
        self.step("ack_source.before_ack", end_seq)
        self.fence(f"acknowledging up to stored batch {end_seq}")
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
