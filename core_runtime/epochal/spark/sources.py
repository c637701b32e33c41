"""Stream readers for replayable and acknowledging sources."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from epochal.protocols.acking import AckProtocol, encode_batch
from epochal.spark.common import Part, protocol_step, task_batch_id
from epochal_sdk import AcknowledgingSource, Guarantee, Message, ReplayableSource, Split

log = logging.getLogger("epochal.source")


class SplitPartition(InputPartition):
    """One task of a replayable source: a split and the batch it belongs to."""

    def __init__(self, split: Split) -> None:
        super().__init__((split.partition, split.start, split.end))
        self.split = split


class ReplayableReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A :class:`ReplayableSource` as a Spark stream reader. Offsets are the source's
    per-partition offsets, so they live in Spark's offset log, i.e. in the snapshot."""

    def __init__(self, part: Part, schema: StructType) -> None:
        self.part = part
        self.schema = schema
        self._source: ReplayableSource | None = None
        self._until: dict | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"part": self.part, "schema": self.schema, "_source": None, "_until": None}

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to what is there now, in batches of the read limit."""
        self._until = dict(self.source.latest_offsets(self.source.partitions()))

    @property
    def source(self) -> ReplayableSource:
        if self._source is None:
            self._source = self.part.build_source()
        return self._source

    def initialOffset(self) -> dict:
        partitions = self.source.partitions()
        return dict(self.source.initial_offsets(partitions))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.source.max_records_per_batch()
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        with protocol_step(self.part, None, "plan the next batch (latest offsets)"):
            return self._latest(start, limit)

    def _latest(self, start: dict, limit: ReadLimit) -> dict:
        partitions = list(self._until) if self._until is not None else self.source.partitions()
        new = [p for p in partitions if p not in start]
        begin = {**start, **(self.source.initial_offsets(new) if new else {})}
        if self._until is not None:
            latest = {**begin, **self._until}
        else:
            latest = {**begin, **self.source.latest_offsets(partitions)}
        if isinstance(limit, ReadMaxRows):
            latest = self.source.limit(begin, latest, limit.max_rows)
        for partition in new:  # a new partition joins the offsets at its start: it is read
            latest[partition] = begin[partition]  # from the next batch, the same on a replay
        self.part.context.reach("source.after_plan")
        return latest

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [SplitPartition(s) for s in self.source.splits(start, end)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        split = partition.split  # type: ignore[attr-defined]
        source = self.part.build_source()
        try:
            with protocol_step(self.part, task_batch_id(), f"read partition {split.partition}"):
                yield from source.read(split)
        finally:
            source.close()
        self.part.context.reach("source.after_read", task_batch_id())

    def commit(self, end: dict) -> None:
        self.part.context.reach("source.after_commit")

    def stop(self) -> None:
        if self._source is not None:
            self._source.close()


class StoredBatchPartition(InputPartition):
    """One stored batch of an acknowledging source (read back from the snapshot store), or,
    in at-least-once mode, the batch's rows themselves."""

    def __init__(self, seq: int, payload: bytes | None = None) -> None:
        super().__init__(seq)
        self.seq = seq
        self.payload = payload


class AcknowledgingReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """An :class:`AcknowledgingSource` as a Spark stream reader.

    Offsets are ``{"seq": n}``: the number of the last stored batch. Exactly-once: batches are
    stored before they are planned and acknowledged in ``commit`` (see
    :mod:`epochal.protocols.acking`). At-least-once: batches stay in memory, a replay after a
    restart gets nothing, and the broker redelivers what was not acknowledged.
    """

    def __init__(self, part: Part, schema: StructType) -> None:
        self.part = part
        self.schema = schema
        self._protocol: AckProtocol | None = None
        self._source: AcknowledgingSource | None = None
        self._memory: dict[int, list[Message]] = {}
        self._last_seq = 0
        self._commit_log: CommitLogCursor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"part": self.part, "schema": self.schema}

    @property
    def exactly_once(self) -> bool:
        return self.part.guarantee == Guarantee.EXACTLY_ONCE

    def _options(self) -> tuple[int, float]:
        opts = self.part.connector_options()
        limit = opts.int("maxRecordsPerBatch", 10_000, minimum=1) or 10_000
        timeout = opts.float("receiveTimeoutMs", 200.0, minimum=0.0) / 1000.0
        return limit, timeout

    @property
    def source(self) -> AcknowledgingSource:
        if self._source is None:
            self._source = self.part.build_source()
            limit, _ = self._options()
            self._source.open(max_unacknowledged=limit * 2)
        return self._source

    @property
    def protocol(self) -> AckProtocol:
        if self._protocol is None:
            opts = self.part.connector_options()
            self._protocol = AckProtocol(
                self.part.context.store(self.part.connector),
                self.source,
                self.part.part_id,
                to_arrow_schema(self.schema, timezone="UTC"),
                window_batches=opts.int("dedupeWindowBatches", 100, minimum=1) or 100,
                window_ids=opts.int("dedupeWindowIds", 1_000_000, minimum=1) or 1_000_000,
                step=self.part.context.reach,
                fence=self.part.context.check_fence,
            )
            log.info("%s: dedupe window %s", self.part.label, self._protocol.stats.as_dict())
        return self._protocol

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read until a receive comes back empty."""

    def initialOffset(self) -> dict:
        return self._offset(0)

    def _offset(self, seq: int) -> dict:
        """``{"seq": n, "source": <part id>}``: the source id makes the offset recognisable in
        Spark's offset log (see :meth:`stop`)."""
        return {"seq": seq, "source": self.part.part_id}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._options()[0])

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        max_messages, timeout = self._options()
        if isinstance(limit, ReadMaxRows):
            max_messages = limit.max_rows
        begin = int(start["seq"])
        self._settle(begin)
        if self.exactly_once:
            with protocol_step(self.part, None, f"receive + store batch {begin + 1}"):
                return self._offset(self.protocol.next_batch(begin, max_messages, timeout))
        messages = self.source.receive(max_messages, timeout)
        if not messages:
            return self._offset(begin)
        self._last_seq = max(self._last_seq, begin) + 1
        self._memory[self._last_seq] = messages
        return self._offset(self._last_seq)

    def _settle(self, begin: int) -> None:
        """Acknowledge the batch that ends at ``begin`` if Spark's commit log has it.

        Spark commits a source's batch N only when it plans batch N+1 with new data, so the
        last batch before a quiet period (or the end of an available-now run, or a stop)
        would stay unacknowledged. ``latestOffset(start)`` is only called once the batch
        ending at ``start`` is committed; this checks it against the commit log itself.
        """
        if begin <= 0:
            return
        if self._commit_log is None:
            self._commit_log = CommitLogCursor(self.part)
        committed = self._commit_log.latest()
        if committed is not None and int(committed["seq"]) >= begin:
            self.commit(self._offset(begin))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        seqs = range(int(start["seq"]) + 1, int(end["seq"]) + 1)
        if self.exactly_once:
            return [StoredBatchPartition(seq) for seq in seqs]
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        return [
            StoredBatchPartition(seq, encode_batch(self._memory[seq], arrow_schema))
            for seq in seqs
            if seq in self._memory
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        seq = partition.seq  # type: ignore[attr-defined]
        payload = partition.payload  # type: ignore[attr-defined]
        if payload is None:
            from epochal.protocols.acking import ID_COLUMN, decode_batch

            store = self.part.context.store(self.part.connector)
            batch = decode_batch(store.read(f"sources/{self.part.part_id}/batches/{seq:012d}"))
        else:
            from epochal.protocols.acking import ID_COLUMN

            batch = ipc.open_stream(io.BytesIO(payload)).read_all().to_batches()[0]
        yield batch.drop_columns([ID_COLUMN])

    def commit(self, end: dict) -> None:
        with protocol_step(self.part, None, f"acknowledge up to stored batch {end['seq']}"):
            self._commit(end)

    def _commit(self, end: dict) -> None:
        seq = int(end["seq"])
        if self.exactly_once:
            self.protocol.commit(seq)
            return
        done = sorted(s for s in self._memory if s <= seq)
        self.part.context.reach("ack_source.before_ack", seq)
        if done:
            self.part.context.check_fence(f"acknowledging up to batch {seq}")
        for s in done:
            self.source.acknowledge([m.id for m in self._memory.pop(s)])
        if done:
            self.part.context.reach("ack_source.after_ack", seq)

    def stop(self) -> None:
        if self._source is not None:
            self._source.close()


class CommitLogCursor:
    """This source's offset in the newest batch of Spark's commit log, read from the run's
    checkpoint. It lists the commit log once, then only looks for the next batch's entry,
    so a ``latestOffset`` costs a stat, not a directory listing."""

    def __init__(self, part: Part) -> None:
        self.part = part
        self.checkpoint = part.context.checkpoint
        self.batch: int | None = None
        self.offset: dict | None = None

    def latest(self) -> dict | None:
        """The offset of this source in the newest committed batch (None when unknown)."""
        if not self.checkpoint or "://" in self.checkpoint:
            return None
        commits = f"{self.checkpoint}/commits"
        if self.batch is None:
            try:
                batches = [int(n) for n in os.listdir(commits) if n.isdigit()]
            except FileNotFoundError:
                return None
            newest = max(batches) if batches else None
        else:
            newest = self.batch
            while os.path.exists(f"{commits}/{newest + 1}"):
                newest += 1
        if newest is None or newest == self.batch:
            return self.offset
        self.batch, self.offset = newest, self._offset_of(newest)
        return self.offset

    def _offset_of(self, batch: int) -> dict | None:
        try:
            with open(f"{self.checkpoint}/offsets/{batch}") as fh:
                lines = fh.read().splitlines()[2:]
        except FileNotFoundError:
            return None
        for line in lines:
            try:
                offset = json.loads(line)
            except ValueError:
                continue
            if isinstance(offset, dict) and offset.get("source") == self.part.part_id:
                return offset
        return None
