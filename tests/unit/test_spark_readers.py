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
