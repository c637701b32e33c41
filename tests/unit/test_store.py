"""SnapshotStore: entries with manifests, verification, exclusive creation, records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from epochal.store import MANIFEST, SnapshotStore, get_record, put_record
from epochal_sdk import SnapshotError


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(str(tmp_path / "store"))


def flip_byte(path: Path, index: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def test_write_read_exists(store: SnapshotStore, tmp_path: Path) -> None:
    assert not store.exists("a/b")
    assert store.manifest("a/b") is None
    manifest = store.write("a/b", b"hello", count=2)
    assert store.exists("a/b")
    assert store.read("a/b") == b"hello"
    assert manifest.size == 5
    assert manifest.count == 2
    assert store.manifest("a/b") == manifest
    assert (tmp_path / "store" / "a" / "b").read_bytes() == b"hello"
    assert (tmp_path / "store" / "a" / f"b{MANIFEST}").exists()
    # no temporary files are left behind
    assert sorted(os.listdir(tmp_path / "store" / "a")) == ["b", f"b{MANIFEST}"]


def test_overwrite_replaces_the_entry(store: SnapshotStore) -> None:
    store.write("k", b"one")
    store.write("k", b"second value")
    assert store.read("k") == b"second value"
    assert store.manifest("k").size == len(b"second value")


def test_json_entries(store: SnapshotStore) -> None:
    store.write_json("j/x", {"b": [1, 2], "a": None}, count=2)
    assert store.read_json("j/x") == {"a": None, "b": [1, 2]}
    assert store.manifest("j/x").count == 2


def test_read_of_a_missing_entry(store: SnapshotStore) -> None:
    with pytest.raises(SnapshotError, match="snapshot entry 'nope' is missing from"):
        store.read("nope")


def test_a_data_file_without_manifest_is_invisible(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("dir/kept", b"1")
    (tmp_path / "store" / "dir" / "torn").write_bytes(b"interrupted write")
    (tmp_path / "store" / "dir" / "kept.tmp-123").write_bytes(b"tmp")
    assert not store.exists("dir/torn")
    assert store.list("dir") == ["dir/kept"]
    with pytest.raises(SnapshotError, match="missing"):
        store.read("dir/torn")
    assert store.verify() == (1, [])


def test_list_is_sorted_and_direct_children_only(store: SnapshotStore) -> None:
    for key in ("p/000000000010", "p/000000000002", "p/000000000001", "p/sub/deep"):
        store.write(key, b"x")
    assert store.list("p") == ["p/000000000001", "p/000000000002", "p/000000000010"]
    assert store.list("p/sub") == ["p/sub/deep"]
    assert store.list("absent") == []


def test_corrupt_data_is_refused(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("sinks/s/decisions/000000000003", b'{"batch": 3}')
    flip_byte(tmp_path / "store" / "sinks" / "s" / "decisions" / "000000000003", 3)
    with pytest.raises(SnapshotError) as info:
        store.read("sinks/s/decisions/000000000003")
    message = str(info.value)
    assert "'sinks/s/decisions/000000000003'" in message
    assert "is corrupt: checksum" in message
    assert "Refusing to use it" in message


def test_truncated_data_is_refused(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("k", b"0123456789")
    (tmp_path / "store" / "k").write_bytes(b"01234")
    with pytest.raises(SnapshotError, match=r"'k'.*size 5 bytes, manifest says 10"):
        store.read("k")


def test_missing_data_with_manifest(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("k", b"data")
    (tmp_path / "store" / "k").unlink()
    assert store.exists("k")
    with pytest.raises(SnapshotError, match=r"'k'.*the manifest exists but the data is missing"):
        store.read("k")


def test_corrupt_manifest(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("k", b"data")
    (tmp_path / "store" / f"k{MANIFEST}").write_bytes(b'{"size": 4, "sha2')
    with pytest.raises(SnapshotError, match=r"'k'.*its manifest is corrupt"):
        store.read("k")
    (tmp_path / "store" / f"k{MANIFEST}").write_text(json.dumps({"size": 4}))
    with pytest.raises(SnapshotError, match="manifest is corrupt"):
        store.manifest("k")


def test_verify_counts_and_reports(store: SnapshotStore, tmp_path: Path) -> None:
    assert store.verify() == (0, [])
    store.write("a/one", b"1")
    store.write("a/two", b"22")
    store.write("b/c/three", b"333")
    assert store.verify() == (3, [])
    assert store.verify("a") == (2, [])
    flip_byte(tmp_path / "store" / "a" / "two")
    (tmp_path / "store" / "b" / "c" / "three").unlink()
    checked, problems = store.verify()
    assert checked == 3
    assert len(problems) == 2
    assert any("'a/two'" in p and "corrupt" in p for p in problems)
    assert any("'b/c/three'" in p and "data is missing" in p for p in problems)


def test_delete_and_delete_tree(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("x/1", b"1")
    store.write("x/2", b"2")
    store.write("y/1", b"1")
    store.delete("x/1")
    store.delete("x/1")  # idempotent
    store.delete("never/written")
    assert not store.exists("x/1")
    assert not (tmp_path / "store" / "x" / "1").exists()
    assert store.list("x") == ["x/2"]
    store.delete_tree("x")
    assert store.list("x") == []
    assert store.exists("y/1")
    store.delete_tree("x")  # gone already: nothing to do
    store.delete_tree()
    assert not (tmp_path / "store").exists()
    assert store.verify() == (0, [])


def test_records_round_trip(store: SnapshotStore) -> None:
    assert get_record(store, "job.json") is None
    put_record(store, "job.json", {"name": "j", "run": 1, "tags": ["a"]})
    assert get_record(store, "job.json") == {"name": "j", "run": 1, "tags": ["a"]}
    put_record(store, "job.json", {"name": "j", "run": 2})
    assert get_record(store, "job.json") == {"name": "j", "run": 2}
    # records are not entries
    assert not store.exists("job.json")


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # torn write
        lambda raw: raw.replace(b'\\"run\\": 2', b'\\"run\\": 3'),  # body changed
        lambda raw: b"[]",  # not an envelope
        lambda raw: b"",
    ],
    ids=["torn", "changed", "wrong-shape", "empty"],
)
def test_damaged_records_are_detected(store: SnapshotStore, tmp_path: Path, damage) -> None:
    put_record(store, "lease.json", {"owner": "o", "run": 2})
    path = tmp_path / "store" / "lease.json"
    damaged = damage(path.read_bytes())
    assert damaged != path.read_bytes()
    path.write_bytes(damaged)
    with pytest.raises(SnapshotError, match=r"record 'lease.json' in .* is corrupt"):
        get_record(store, "lease.json")
