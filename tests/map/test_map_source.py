"""MapJournalSource: partitions, offsets, exact and repeatable reads, limits, errors."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pyarrow as pa
import pytest

from epochal_map import MapJournalSource, MapStore
from epochal_map.source import arrow_schema
from epochal_sdk import ConfigError, Options, SnapshotError, Split


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "maps.sqlite"


def source(path: Path, **options: str) -> MapJournalSource:
    return MapJournalSource(Options("map", {"path": str(path), "map": "m", **options}))


def fill(path: Path, count: int, partitions: int = 4, start: int = 0) -> None:
    with MapStore(path, partitions) as s:
        s.append_events("m", [(f"k{i}", f"v{i}") for i in range(start, start + count)])


def read_all(src: MapJournalSource, split: Split) -> pa.Table:
    return pa.Table.from_batches(list(src.read(split)), schema=arrow_schema())


def test_construction_is_lazy_and_picklable(path: Path) -> None:
    src = source(path)
    assert not path.exists()
    fill(path, 3)
    assert src.partitions() == ["0", "1", "2", "3"]
    copy = pickle.loads(pickle.dumps(src))  # the open store is not shipped
    assert copy.partitions() == ["0", "1", "2", "3"]
    src.close()
    copy.close()


def test_schema_and_guarantee() -> None:
    src = source(Path("unused.sqlite"))
    assert src.schema() == (
        "key string, value string, partition int, sequence bigint, event_time timestamp"
    )
    assert src.max_guarantee().label == "exactly-once"


def test_offsets_earliest_and_latest(path: Path) -> None:
    fill(path, 40, partitions=3)
    earliest, latest = source(path), source(path, startingPosition="latest")
    parts = earliest.partitions()
    assert parts == ["0", "1", "2"]
    ends = earliest.latest_offsets(parts)
    assert sum(ends.values()) == 40
    assert earliest.initial_offsets(parts) == {"0": 0, "1": 0, "2": 0}
    assert latest.initial_offsets(parts) == ends
    fill(path, 10, start=40)
    assert sum(latest.latest_offsets(parts).values()) == 50


def test_read_exact_range_twice(path: Path) -> None:
    before = time.time()
    fill(path, 100)
    src = source(path)
    with MapStore(path) as store:
        for p, end in src.latest_offsets(src.partitions()).items():
            split = Split(p, 2, end - 1)
            first, second = read_all(src, split), read_all(src, split)
            assert first.equals(second)
            assert first.schema == arrow_schema()
            assert first["sequence"].to_pylist() == list(range(2, end - 1))
            assert set(first["partition"].to_pylist()) == {int(p)}
            expected = store.journal_read("m", int(p), 2, end - 1)
            assert first["key"].to_pylist() == [e[1] for e in expected]
            assert first["value"].to_pylist() == [e[2] for e in expected]
            stamps = [t.timestamp() for t in first["event_time"].to_pylist()]
            assert all(before - 1 <= t <= time.time() + 1 for t in stamps)


def test_read_in_chunks(path: Path) -> None:
    fill(path, 25_000, partitions=1)
    batches = list(source(path).read(Split("0", 0, 25_000)))
    assert [b.num_rows for b in batches] == [10_000, 10_000, 5_000]
    assert list(source(path).read(Split("0", 7, 7))) == []


def test_read_beyond_the_journal_fails(path: Path) -> None:
    fill(path, 8, partitions=1)
    with pytest.raises(SnapshotError, match=r"holds 3 of the events 5\.\.9"):
        list(source(path).read(Split("0", 5, 10)))


def test_limit_over_the_journal(path: Path) -> None:
    fill(path, 100)
    src = source(path, maxRecordsPerBatch="10")
    parts = src.partitions()
    start, latest = src.initial_offsets(parts), src.latest_offsets(parts)
    seen = 0
    while start != latest:
        end = src.limit(start, latest, src.max_records_per_batch() or 0)
        rows = sum(read_all(src, split).num_rows for split in src.splits(start, end))
        assert 0 < rows <= 10
        seen += rows
        start = end
    assert seen == 100


def test_check_missing_map(path: Path) -> None:
    with pytest.raises(ConfigError, match="map 'm' does not exist in") as err:
        source(path).check()
    assert str(path) in str(err.value)
    assert "Write to it first or check the name" in str(err.value)
    assert not path.exists()  # checking does not create the file
    fill(path, 1)
    source(path).check()
    with pytest.raises(ConfigError, match="'other' does not exist"):
        MapJournalSource(Options("map", {"path": str(path), "map": "other"})).check()


def test_option_errors(path: Path) -> None:
    with pytest.raises(ConfigError, match="'map': is required"):
        MapJournalSource(Options("map", {"path": str(path)}))
    with pytest.raises(ConfigError, match="startingPosition"):
        source(path, startingPosition="middle")
    with pytest.raises(ConfigError, match="maxRecordsPerBatch"):
        fill(path, 1)
        source(path, maxRecordsPerBatch="0").check()


def test_default_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPOCHAL_MAP_PATH", str(tmp_path / "env.sqlite"))
    assert MapJournalSource(Options("map", {"map": "m"})).target.path == str(
        tmp_path / "env.sqlite"
    )
    monkeypatch.delenv("EPOCHAL_MAP_PATH")
    monkeypatch.chdir(tmp_path)
    assert MapJournalSource(Options("map", {"map": "m"})).target.path == str(
        tmp_path / "epochal-map.sqlite"
    )
