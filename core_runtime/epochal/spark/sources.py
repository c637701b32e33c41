"""Stream readers for replayable and acknowledging sources."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from epochal.metrics import recording
from epochal.protocols.acking import AckProtocol, MemoryAcks, read_batch
from epochal.spark import features
from epochal.spark.common import Part, SparkTask, protocol_step
from epochal.state.checkpoint import Checkpoint
from epochal_sdk import AcknowledgingSource, Guarantee, ReplayableSource, Split

log = logging.getLogger("epochal.source")

if TYPE_CHECKING:  # checked against the newest pyspark
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as _AvailableNow
else:  # SupportsTriggerAvailableNow where pyspark has it (epochal.spark.features)
    _AvailableNow = features.trigger_available_now_base()


TASKS_KEY = "epochal.tasks"
"""In a replayable source's end offsets (Spark's offset log): how many tasks read the batch,
when small splits share tasks (:meth:`~epochal_sdk.ReplayableSource.min_records_per_task`).
A replay groups the batch's splits by it again, so every task reads what it read the first
time; a batch planned without it reads one split per task."""


class SplitPartition(InputPartition):
    """One task of a replayable source: the splits it reads (one, or several small ones)."""

    def __init__(self, splits: tuple[Split, ...]) -> None:
        super().__init__(tuple((s.partition, s.start, s.end) for s in splits))
        self.splits = splits


def task_count(source: ReplayableSource, start: dict, end: dict) -> int | None:
    """How many tasks a batch from ``start`` to ``end`` gets: enough for each to hold the
    source's :meth:`~epochal_sdk.ReplayableSource.min_records_per_task` records; None (one
    task per split) when the source asks for none, its offsets do not count records or every
    partition with data has enough for a task of its own."""
    least = source.min_records_per_task()
    if not least:
        return None
    total, with_data = 0, 0
    for partition, offset in end.items():
        if partition in start:
            try:
                records = max(0, int(offset) - int(start[partition]))
            except (TypeError, ValueError):
                return None
            total += records
            with_data += records > 0
    tasks = max(1, -(-total // least))
    return tasks if tasks < with_data else None


def group_splits(splits: list[Split], tasks: int | None) -> list[tuple[Split, ...]]:
    """The splits of a batch in ``tasks`` groups (None: one each), each a run of neighbours
    in the splits' order, balanced by their sizes (integer offsets; unknown sizes count one):
    a split goes to the group its middle record falls in. The same splits and count give the
    same groups, on any machine and release: replays depend on it."""
    if not tasks or tasks >= len(splits):
        return [(split,) for split in splits]
    sizes = [_size(split) for split in splits]
    total = sum(sizes)
    groups: list[list[Split]] = [[] for _ in range(tasks)]
    before = 0
    for split, size in zip(splits, sizes, strict=True):
        middle = before + size / 2
        groups[min(tasks - 1, int(middle * tasks / total))].append(split)
        before += size
    return [tuple(group) for group in groups if group]


def _size(split: Split) -> int:
    try:
        return max(1, int(split.end) - int(split.start))
    except (TypeError, ValueError):
        return 1


def _offsets(offsets: dict | None) -> dict | None:
    """A source's offsets without the runtime's own entry (:data:`TASKS_KEY`)."""
    if offsets is None or TASKS_KEY not in offsets:
        return offsets
    return {p: o for p, o in offsets.items() if p != TASKS_KEY}


class ReplayableReader(DataSourceStreamReader, _AvailableNow):
    """A :class:`ReplayableSource` as a Spark stream reader. Offsets are the source's
    per-partition offsets, so they live in Spark's offset log, i.e. in the snapshot."""

    def __init__(self, part: Part, schema: StructType) -> None:
        self.part = part
        self.schema = schema
        self._source: ReplayableSource | None = None
        self._until: dict | None = None
        self._planned: dict | None = None  # the last batch's end, as Spark's offset log has it

    def __getstate__(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "schema": self.schema,
            "_source": None,
            "_until": None,
            "_planned": None,
        }

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
        self._planned = dict(self.source.initial_offsets(partitions))
        return dict(self._planned)

    def getDefaultReadLimit(self) -> Any:
        return features.read_limit(self.source.max_records_per_batch())

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """The end of the next batch. Spark passes the batch's start and a read limit when it
        has admission control for Python sources (:data:`features.ADMISSION_CONTROL`);
        without it, it calls this without them and the batch reads everything available.
        A batch to run gets its number of tasks in its end (:data:`TASKS_KEY`)."""
        started = time.perf_counter()
        given = start
        with protocol_step(self.part, None, "plan the next batch (latest offsets)"):
            if start is None:
                start = _offsets(self._planned)
                latest = self._latest_without_limit()
            else:
                start = _offsets(start) or {}
                latest = self._latest(start, limit)
        if latest == start:  # no batch: the offsets Spark has stay as they are
            latest = given if given is not None else self._unchanged(latest)
        else:  # a batch will run: its tasks, and how long planning it took
            tasks = task_count(self.source, start or {}, latest)
            if tasks is not None:
                latest = {**latest, TASKS_KEY: tasks}
            took = time.perf_counter() - started
            values = {"plan_seconds": took, "plan_seconds_count": 1}
            recording.add(values, recording.connector_values(self.source.context.metrics.drain()))
            self.part.report("source", None, values)
        self.part.context.reach("source.after_plan")
        return latest

    def _unchanged(self, latest: dict) -> dict:
        """``latest``, the end of the last batch, as Spark's offset log has it (with its
        :data:`TASKS_KEY`): without a start to return (no admission control, pyspark 4.0
        and 4.1) an end that differs from the log's only by that key is a new offset to
        Spark, which would run an empty batch after every batch."""
        if self._planned is not None and _offsets(self._planned) == latest:
            return dict(self._planned)
        return latest

    def _latest_without_limit(self) -> dict:
        """The latest offsets of every partition; a partition not in the last batch planned
        here joins at its start, as in :meth:`_latest`. A reader that has planned nothing yet
        (a restarted query) takes every partition at its latest offset, and
        :meth:`partitions` starts one missing from the batch's start at its start."""
        if self._planned is None:
            return dict(self.source.latest_offsets(self.source.partitions()))
        return self._latest(_offsets(self._planned) or {}, None)

    def _latest(self, start: dict, limit: Any) -> dict:
        partitions = list(self._until) if self._until is not None else self.source.partitions()
        new = [p for p in partitions if p not in start]
        begin = {**start, **(self.source.initial_offsets(new) if new else {})}
        if self._until is not None:
            latest = {**begin, **self._until}
        else:
            latest = {**begin, **self.source.latest_offsets(partitions)}
        max_rows = features.max_rows(limit)
        if max_rows:
            latest = self.source.limit(begin, latest, max_rows)
        for partition in new:  # a new partition joins the offsets at its start: it is read
            latest[partition] = begin[partition]  # from the next batch, the same on a replay
        return latest

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        tasks = end.get(TASKS_KEY)
        self._planned = dict(end)
        start, end = _offsets(start) or {}, _offsets(end) or {}
        missing = [p for p in end if p not in start]  # only without admission control
        if missing:
            start = {**self.source.initial_offsets(missing), **start}
        splits = self.source.splits(start, end)
        return [SplitPartition(group) for group in group_splits(splits, tasks)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa  # a task's: the planning processes need no pyarrow

        splits: tuple[Split, ...] = partition.splits  # type: ignore[attr-defined]
        task = SparkTask.current()
        batch = task.batch if task is not None else None
        source = self.part.build_source(self.part.connector_context(task=task))
        names = tuple(self.schema.fieldNames())
        values = {"records_in": 0.0, "bytes_in": 0.0}
        try:
            with (
                protocol_step(self.part, batch, f"read {_named(splits)}"),
                recording.timed(values, "read"),
            ):
                rows = source.read(splits[0]) if len(splits) == 1 else source.read_splits(splits)
                for item in rows:
                    if isinstance(item, pa.RecordBatch):
                        values["records_in"] += item.num_rows
                        values["bytes_in"] += item.nbytes
                    else:
                        values["records_in"] += 1
                        if isinstance(item, dict):  # a dict row: in the schema's column order
                            item = tuple(item.get(name) for name in names)
                    yield item
        finally:
            source.close()
        recording.add(values, recording.connector_values(source.context.metrics.drain()))
        values["records_committed"] = values["records_in"]  # this task's share, once
        index = task.partition if task is not None else None
        self.part.report("source", batch, values, task_side=True, task=index)
        self.part.context.reach("source.after_read", batch)

    def commit(self, end: dict) -> None:
        self.part.context.reach("source.after_commit")

    def stop(self) -> None:
        if self._source is not None:
            self._source.close()


def _named(splits: tuple[Split, ...]) -> str:
    """What a task reads, for its errors: its partitions (the first few)."""
    names = [split.partition for split in splits]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"partition{'s' if len(names) > 1 else ''} {shown}"


class StoredBatchPartition(InputPartition):
    """One stored batch of an acknowledging source (read back from the snapshot store), or,
    in at-least-once mode, the batch's rows themselves."""

    def __init__(self, seq: int, payload: bytes | None = None) -> None:
        super().__init__(seq)
        self.seq = seq
        self.payload = payload


class AcknowledgingReader(DataSourceStreamReader, _AvailableNow):
    """An :class:`AcknowledgingSource` as a Spark stream reader.

    Offsets are ``{"seq": n}``: the number of the last batch. The protocol, in both modes, is
    :mod:`epochal.protocols.acking` (:class:`~epochal.protocols.acking.AckProtocol`
    exactly-once, :class:`~epochal.protocols.acking.MemoryAcks` at-least-once); this class
    only connects it to Spark's calls.
    """

    def __init__(self, part: Part, schema: StructType) -> None:
        self.part = part
        self.schema = schema
        self._acks: AckProtocol | MemoryAcks | None = None
        self._source: AcknowledgingSource | None = None
        self._limits: tuple[int, float] | None = None
        self._commit_log: CommitLogCursor | None = None
        self._planned: dict | None = None  # the end of the last batch planned here

    def __getstate__(self) -> dict[str, Any]:
        return {"part": self.part, "schema": self.schema}

    @property
    def exactly_once(self) -> bool:
        return self.part.guarantee == Guarantee.EXACTLY_ONCE

    def _options(self) -> tuple[int, float]:
        if self._limits is None:
            opts = self.part.connector_options()
            limit = opts.int("maxRecordsPerBatch", 10_000, minimum=1)
            timeout = opts.float("receiveTimeoutMs", 200.0, minimum=0.0) / 1000.0
            self._limits = (limit, timeout)
        return self._limits

    @property
    def source(self) -> AcknowledgingSource:
        if self._source is None:
            self._source = self.part.build_source()
            limit, _ = self._options()
            self._source.open(max_unacknowledged=limit * 2)
        return self._source

    @property
    def acks(self) -> AckProtocol | MemoryAcks:
        """The protocol of this source's mode."""
        if self._acks is None:
            arrow_schema = features.arrow_schema(self.schema)
            context = self.part.context
            if not self.exactly_once:
                self._acks = MemoryAcks(
                    self.source, arrow_schema, step=context.reach, fence=context.check_fence
                )
                return self._acks
            opts = self.part.connector_options()
            protocol = AckProtocol(
                context.store(self.part.connector),
                self.source,
                self.part.part_id,
                arrow_schema,
                window_batches=opts.int("dedupeWindowBatches", 100, minimum=1),
                window_ids=opts.int("dedupeWindowIds", 1_000_000, minimum=1),
                step=context.reach,
                fence=context.check_fence,
            )
            log.info("%s: dedupe window %s", self.part.label, protocol.stats.as_dict())
            self._acks = protocol
        return self._acks

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read until a receive comes back empty."""

    def initialOffset(self) -> dict:
        self._planned = self._offset(0)
        return self._offset(0)

    def _offset(self, seq: int) -> dict:
        """``{"seq": n, "source": <part id>}``: the source id makes the offset recognisable in
        Spark's offset log (see :meth:`stop`)."""
        return {"seq": seq, "source": self.part.part_id}

    def getDefaultReadLimit(self) -> Any:
        return features.read_limit(self._options()[0])

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """Receive and store the next batch. Spark passes the batch's start and a read limit
        when it has admission control for Python sources; without it (see
        :mod:`epochal.spark.features`) the start is the end of the last batch this reader
        planned, or, in a restarted query, this source's offset in the newest committed
        batch, and the batch holds up to ``maxRecordsPerBatch`` messages either way."""
        max_messages, timeout = self._options()
        max_messages = features.max_rows(limit) or max_messages
        begin = int((start if start is not None else self._start())["seq"])
        started = time.perf_counter()
        with protocol_step(self.part, None, f"receive + store batch {begin + 1}"):
            self._settle(begin)
            end = self.acks.next_batch(begin, max_messages, timeout)
        if end != begin:
            self._report({"plan_seconds": time.perf_counter() - started, "plan_seconds_count": 1})
        return self._offset(end)

    def _start(self) -> dict:
        """Where the next batch starts when Spark does not say (no admission control)."""
        if self._planned is not None:
            return self._planned
        if self._commit_log is None:
            self._commit_log = CommitLogCursor(self.part)
        return self._commit_log.latest() or self._offset(0)

    def _report(self, values: dict[str, float]) -> None:
        """Leave what the protocol measured (and the connector counted) for the metrics."""
        recording.add(values, self.acks.drain_measured())
        recording.add(values, recording.connector_values(self.source.context.metrics.drain()))
        if any(values.values()):
            self.part.report("source", None, values)

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
        self._planned = dict(end)
        return [
            StoredBatchPartition(seq, self.acks.payload(seq))
            for seq in self.acks.batches(int(start["seq"]), int(end["seq"]))
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        seq = partition.seq  # type: ignore[attr-defined]
        payload = partition.payload  # type: ignore[attr-defined]
        store = self.part.context.store(self.part.connector) if payload is None else None
        rows = read_batch(store, self.part.part_id, seq, payload)
        yield rows
        task = SparkTask.current()  # this task's share of the batch, once
        if task is not None:
            values = {"records_committed": float(rows.num_rows)}
            self.part.report("source", task.batch, values, task_side=True, task=task.partition)

    def commit(self, end: dict) -> None:
        with protocol_step(self.part, None, f"acknowledge up to stored batch {end['seq']}"):
            self.acks.commit(int(end["seq"]))
        self._report({})

    def stop(self) -> None:
        if self._source is not None:
            self._source.close()


class CommitLogCursor:
    """This source's offset in the newest batch of Spark's commit log, read from the run's
    checkpoint (on local disk or an object store). It lists the commit log once, then only
    looks for the next batch's entry, so a ``latestOffset`` costs a stat (one HEAD request
    on S3), not a directory listing."""

    def __init__(self, part: Part) -> None:
        self.part = part
        self.checkpoint = part.context.checkpoint
        self.files = Checkpoint(self.checkpoint) if self.checkpoint else None
        self.batch: int | None = None
        self.offset: dict | None = None

    def latest(self) -> dict | None:
        """The offset of this source in the newest committed batch (None when unknown)."""
        if self.files is None:
            return None
        if self.batch is None:
            batches = self.files.batches("commits")
            newest = max(batches) if batches else None
        else:
            newest = self.batch
            while self.files.exists(f"commits/{newest + 1}"):
                newest += 1
        if newest is None or newest == self.batch:
            return self.offset
        self.batch, self.offset = newest, self._offset_of(newest)
        return self.offset

    def _offset_of(self, batch: int) -> dict | None:
        assert self.files is not None
        data = self.files.read(f"offsets/{batch}")
        if data is None:
            return None
        for line in data.decode(errors="replace").splitlines()[2:]:
            try:
                offset = json.loads(line)
            except ValueError:
                continue
            if isinstance(offset, dict) and offset.get("source") == self.part.part_id:
                return offset
        return None
