"""MapStore: entries, journal, durability, concurrent processes and two-phase commit."""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal_map.store import MapStore, MapStoreError, partition_of


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "maps.sqlite"


@pytest.fixture
def store(path: Path) -> Iterator[MapStore]:
    with MapStore(path) as s:
        yield s


def all_events(store: MapStore, map: str) -> dict[int, list[tuple[int, str, str, int]]]:
    return {
        p: store.journal_read(map, p, 0, store.journal_end(map, p))
        for p in store.journal_partitions(map)
    }


def test_put_get_entries(store: MapStore) -> None:
    store.put("m", "a", "1")
    store.put_all("m", [("b", "2"), ("a", "3")])
    store.put("other", "a", "x")
    assert store.get("m", "a") == "3"
    assert store.get("m", "missing") is None
    assert store.get("nomap", "a") is None
    assert store.entries("m") == {"a": "3", "b": "2"}
    assert store.entries("other") == {"a": "x"}


def test_rejects_non_text(store: MapStore) -> None:
    with pytest.raises(TypeError, match="must be str"):
        store.put_all("m", [("a", 1)])  # type: ignore[list-item]
    assert store.entries("m") == {}


def test_file_is_wal_and_map_created_on_write(store: MapStore, path: Path) -> None:
    assert store.partition_count("m") is None
    assert store.journal_partitions("m") == []
    store.put("m", "a", "1")
    assert store.partition_count("m") == 4
    assert store.journal_partitions("m") == [0, 1, 2, 3]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_journal_sequences_are_dense_per_partition(store: MapStore) -> None:
    keys = [f"k{i}" for i in range(200)]
    store.append_events("m", [(k, "v") for k in keys])
    store.put_all("m", [(k, "v") for k in keys[:50]])  # same values again: events again
    events = all_events(store, "m")
    assert sum(len(e) for e in events.values()) == 250
    for partition, evs in events.items():
        assert [e[0] for e in evs] == list(range(len(evs)))
        assert all(partition_of(e[1], 4) == partition for e in evs)
    assert store.journal_read("m", 0, 2, 5) == events[0][2:5]


def test_journal_shows_only_committed_events(store: MapStore, path: Path) -> None:
    reader = MapStore(path)
    seen: list[tuple[int, dict[str, str]]] = []

    def items() -> Iterator[tuple[str, str]]:
        for i in range(3):
            yield f"k{i}", "v"
            # the writer's transaction is open here: another connection sees nothing of it
            seen.append((sum(reader.journal_end("m", p) for p in range(4)), reader.entries("m")))

    store.put_all("m", items())
    assert seen == [(0, {})] * 3
    assert sum(reader.journal_end("m", p) for p in range(4)) == 3
    reader.close()


def test_failed_write_leaves_nothing(store: MapStore) -> None:
    def items() -> Iterator[tuple[str, str]]:
        yield "a", "1"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.put_all("m", items())
    assert store.entries("m") == {}
    assert store.partition_count("m") is None


def test_durable_across_reopen_and_partitions_fixed(path: Path) -> None:
    with MapStore(path, partitions=3) as s:
        s.put_all("m", [(f"k{i}", str(i)) for i in range(30)])
        before = all_events(s, "m")
    with MapStore(path, partitions=8) as s:
        assert s.partition_count("m") == 3
        assert s.entries("m") == {f"k{i}": str(i) for i in range(30)}
        assert all_events(s, "m") == before
        s.put("m", "k0", "new")
        assert len(s.journal_partitions("m")) == 3
        s.put("fresh", "a", "1")
        assert s.partition_count("fresh") == 8


def _writer(path: str, tag: str, count: int) -> None:
    with MapStore(path) as s:
        for i in range(0, count, 2):
            s.put("m", f"{tag}-{i}", str(i))
            s.put_all("m", [(f"{tag}-{i + 1}", str(i + 1)), ("shared", tag)])


def test_concurrent_writers_in_two_processes(path: Path) -> None:
    count = 300
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), t, count)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    with MapStore(path) as s:
        entries = s.entries("m")
        assert {k: v for k, v in entries.items() if k != "shared"} == {
            f"{t}-{i}": str(i) for t in ("a", "b") for i in range(count)
        }
        assert entries["shared"] in ("a", "b")
        events = all_events(s, "m")
        assert sum(len(e) for e in events.values()) == 2 * (count + count // 2)
        for evs in events.values():
            assert [e[0] for e in evs] == list(range(len(evs)))


# -- two-phase commit ---------------------------------------------------------------------


def test_stage_is_invisible_and_durable_until_commit(path: Path) -> None:
    with MapStore(path) as s:
        s.stage("t1", "m", [("a", "1"), ("b", "2"), ("a", "3")])
        assert s.entries("m") == {}
        assert s.journal_end("m", partition_of("a", 4)) == 0
        assert s.transaction_state("t1") == "prepared"
    with MapStore(path) as s:  # phase 1 survives a restart
        assert s.in_doubt("t") == ["t1"]
        s.commit_staged("t1")
        assert s.entries("m") == {"a": "3", "b": "2"}
        assert s.transaction_state("t1") == "committed"
        assert s.in_doubt("t") == []
        ends = [s.journal_end("m", p) for p in range(4)]
        assert sum(ends) == 3
        s.commit_staged("t1")  # idempotent: no second application
        s.rollback_staged("t1")  # settled: does nothing
        assert [s.journal_end("m", p) for p in range(4)] == ends
        assert s.transaction_state("t1") == "committed"


def test_stage_again_replaces_rows(store: MapStore) -> None:
    store.stage("t1", "m", [("a", "1"), ("b", "2")])
    store.stage("t1", "m", [("c", "3")])
    store.commit_staged("t1")
    assert store.entries("m") == {"c": "3"}


def test_rollback_drops_and_refuses_late_commit(store: MapStore) -> None:
    store.stage("t1", "m", [("a", "1")])
    store.rollback_staged("t1")
    store.rollback_staged("t1")
    assert store.transaction_state("t1") == "rolled_back"
    assert store.in_doubt("") == []
    with pytest.raises(MapStoreError, match="'t1' was rolled back"):
        store.commit_staged("t1")
    with pytest.raises(MapStoreError, match="'t1' is already rolled_back"):
        store.stage("t1", "m", [("a", "1")])
    assert store.entries("m") == {}


def test_unknown_transactions(store: MapStore, path: Path) -> None:
    with pytest.raises(MapStoreError, match="'nope' is unknown") as err:
        store.commit_staged("nope")
    assert str(path) in str(err.value)
    store.rollback_staged("zombie")  # unknown: recorded as rolled back
    assert store.transaction_state("zombie") == "rolled_back"
    with pytest.raises(MapStoreError, match="rolled back"):
        store.commit_staged("zombie")
    with pytest.raises(MapStoreError, match="zombie"):
        store.stage("zombie", "m", [("a", "1")])


def test_in_doubt_by_prefix_is_literal(store: MapStore) -> None:
    ids = [
        "ep.job_1.s.0.0.0",
        "ep.job_1.s.0.1.0",
        "ep.jobX1.s.0.0.0",  # matches LIKE 'ep.job_1%'
        "ep.job_1.s2.0.0.0",
        "ep%job_1.s.0.0.0",
        "ep.job_1.s.1.0.0",
    ]
    for txn in ids:
        store.stage(txn, "m", [("k", txn)])
    store.commit_staged("ep.job_1.s.1.0.0")
    assert store.in_doubt("ep.job_1.s.") == ["ep.job_1.s.0.0.0", "ep.job_1.s.0.1.0"]
    assert store.in_doubt("ep%") == ["ep%job_1.s.0.0.0"]
    assert len(store.in_doubt("")) == 5
    assert store.in_doubt("ep.job_1.s.0.0.0.") == []
