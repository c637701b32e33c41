"""The stream reader adapters, called the way Spark calls them (no SparkSession needed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import LongType, StringType, StructField, StructType

from epochal.parts import registry
from epochal.parts.job_context import JobContext
from epochal.spark.common import Part
from epochal.spark.sources import TASKS_KEY, ReplayableReader, group_splits
from epochal_sdk import Split

SCHEMA = StructType([StructField("partition", StringType()), StructField("i", LongType())])


@pytest.fixture
def growing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "plugins.growing")
    registry.plugin_manager.cache_clear()
    path = tmp_path / "sizes.json"
    path.write_text(json.dumps({"0": 5}))
    yield path
    registry.plugin_manager.cache_clear()


def _reader(path: Path) -> ReplayableReader:
    part = Part("growing", {"path": str(path)}, "growing-test", JobContext())
    return ReplayableReader(part, SCHEMA)


def _rows(reader: ReplayableReader, start: dict, end: dict) -> list[tuple[str, int]]:
    return [row for p in reader.partitions(start, end) for row in reader.read(p)]


def test_a_new_partition_joins_at_its_start_and_is_read_from_the_next_batch(
    growing: Path,
) -> None:
    reader = _reader(growing)
    start = reader.initialOffset()
    assert start == {"0": 0}
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first == {"0": 5}
    growing.write_text(json.dumps({"0": 7, "1": 3}))
    second = reader.latestOffset(first, ReadAllAvailable())
    assert second == {"0": 7, "1": 0}  # partition 1 joins at its initial offset
    assert _rows(reader, first, second) == [("0", 5), ("0", 6)]
    third = reader.latestOffset(second, ReadAllAvailable())
    assert third == {"0": 7, "1": 3}
    assert _rows(reader, second, third) == [("1", 0), ("1", 1), ("1", 2)]


def test_the_read_limit_caps_a_batch_and_replays_read_the_same(growing: Path) -> None:
    growing.write_text(json.dumps({"0": 10, "1": 10}))
    reader = _reader(growing)
    start = reader.initialOffset()
    assert reader.getDefaultReadLimit() == ReadAllAvailable()
    end = reader.latestOffset(start, ReadMaxRows(6))
    assert end.pop(TASKS_KEY) == 1  # 6 records: both partitions in one task
    assert sum(end.values()) - sum(start.values()) == 6
    assert _rows(reader, start, end) == _rows(reader, start, end)
    assert len(_rows(reader, start, end)) == 6


def test_available_now_stops_at_what_was_there_when_it_began(growing: Path) -> None:
    reader = _reader(growing)
    reader.prepareForTriggerAvailableNow()
    growing.write_text(json.dumps({"0": 50}))
    assert reader.latestOffset({"0": 0}, ReadAllAvailable()) == {"0": 5}


# -- without admission control (pyspark before 4.2: ``latestOffset()`` gets no start) ----------


def test_without_admission_control_a_batch_starts_where_the_last_planned_one_ended(
    growing: Path,
) -> None:
    """Spark calls ``latestOffset()`` without a start or a limit: the reader continues from
    the end of the batch it planned last, and a new partition joins at its start as with
    admission control."""
    reader = _reader(growing)
    start = reader.initialOffset()
    first = reader.latestOffset()
    assert first == {"0": 5}
    assert _rows(reader, start, first) == [("0", i) for i in range(5)]
    growing.write_text(json.dumps({"0": 7, "1": 3}))
    second = reader.latestOffset()
    assert second == {"0": 7, "1": 0}
    assert _rows(reader, first, second) == [("0", 5), ("0", 6)]
    assert reader.latestOffset() == {"0": 7, "1": 3}


def test_without_admission_control_a_restarted_reader_reads_what_is_there(
    growing: Path,
) -> None:
    """A reader of a restarted query has planned nothing: it takes every partition at its
    latest offset, and a partition missing from the batch's start (it appeared while the
    query was down) is read from its start."""
    growing.write_text(json.dumps({"0": 7, "1": 3}))
    reader = _reader(growing)
    end = reader.latestOffset()
    assert end == {"0": 7, "1": 3}
    assert _rows(reader, {"0": 5}, end) == [("0", 5), ("0", 6), ("1", 0), ("1", 1), ("1", 2)]


def test_without_admission_control_a_quiet_trigger_returns_the_end_as_spark_logged_it(
    growing: Path,
) -> None:
    """A batch's end carries its task count (:data:`TASKS_KEY`) in Spark's offset log; with
    nothing new, ``latestOffset()`` must return that end as it is there, key and all: an end
    without it is a new offset to Spark, which then runs an empty batch after every batch
    (seen on pyspark 4.1: batch 2 ``{"0": 49, ...}`` after batch 1 ``{"0": 49, ...,
    "epochal.tasks": 1}``). The same after a replayed batch of a restarted query."""
    growing.write_text(json.dumps({f"p{n}": 10 for n in range(4)}))
    part = Part("growing", {"path": str(growing), "minRecordsPerTask": "20"}, "g", JobContext())
    reader = ReplayableReader(part, SCHEMA)
    start = reader.initialOffset()
    end = reader.latestOffset()
    assert end[TASKS_KEY] == 2
    assert len(reader.partitions(start, end)) == 2
    assert reader.latestOffset() == end  # quiet: the same end, so no batch
    replaying = ReplayableReader(part, SCHEMA)  # a restarted query runs its last batch again
    assert len(replaying.partitions(start, end)) == 2
    assert replaying.latestOffset() == end


# -- small splits share tasks (ReplayableSource.min_records_per_task) -------------------------


def test_a_batch_over_many_small_partitions_gets_few_tasks_and_a_replay_the_same_ones(
    growing: Path,
) -> None:
    sizes = {f"p{n:02d}": 40 + n for n in range(32)}  # 32 partitions, 1 904 records
    growing.write_text(json.dumps(sizes))
    part = Part("growing", {"path": str(growing), "minRecordsPerTask": "500"}, "g", JobContext())
    reader = ReplayableReader(part, SCHEMA)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {**sizes, TASKS_KEY: 4}  # ceil(1 904 / 500), kept in Spark's offset log
    tasks = reader.partitions(start, end)
    assert len(tasks) == 4
    groups = [[s.partition for s in task.splits] for task in tasks]  # type: ignore[attr-defined]
    assert [p for group in groups for p in group] == sorted(sizes)  # neighbours, in order
    assert all(6 <= len(group) <= 10 for group in groups)  # balanced by size
    rows = [row for task in tasks for row in reader.read(task)]
    assert sorted(rows) == sorted((p, i) for p, n in sizes.items() for i in range(n))

    # a replay after a restart, whatever the option says now, reads the same tasks
    changed = Part("growing", {"path": str(growing), "minRecordsPerTask": "0"}, "g", JobContext())
    replay = ReplayableReader(changed, SCHEMA)
    again = replay.partitions(start, end)
    assert [[s.partition for s in t.splits] for t in again] == groups  # type: ignore[attr-defined]
    assert [row for task in again for row in replay.read(task)] == rows
    # nothing new: Spark's offsets stay exactly as they are (no empty batch)
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    # the next batch is planned with the option as it is now: one task per split
    growing.write_text(json.dumps({p: n + 1 for p, n in sizes.items()}))
    assert TASKS_KEY not in replay.latestOffset(end, ReadAllAvailable())


def test_large_splits_keep_a_task_each_and_a_batch_planned_without_the_count_too(
    growing: Path,
) -> None:
    growing.write_text(json.dumps({"0": 600, "1": 600}))
    part = Part("growing", {"path": str(growing), "minRecordsPerTask": "500"}, "g", JobContext())
    reader = ReplayableReader(part, SCHEMA)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"0": 600, "1": 600}  # 2 tasks of 600: as many as partitions, no count
    assert len(reader.partitions(start, end)) == 2
    sizes = {str(n): 3 for n in range(8)}
    assert len(reader.partitions({p: 0 for p in sizes}, sizes)) == 8  # planned before groups


def test_groups_are_balanced_by_size_and_never_empty() -> None:
    splits = [Split(str(n), 0, size) for n, size in enumerate([1000, 1, 1, 1, 1000, 1])]
    groups = group_splits(splits, 2)
    assert [[s.partition for s in g] for g in groups] == [["0", "1", "2"], ["3", "4", "5"]]
    assert group_splits(splits, 40) == [(s,) for s in splits]
    assert group_splits(splits, None) == [(s,) for s in splits]
    assert all(group_splits(splits, n) for n in range(1, 7))
