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
from epochal.spark.sources import ReplayableReader

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
