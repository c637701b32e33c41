"""SnapshotStore: self-checking entries, verification, exclusive creation, the anchor that
fences a run whose state moved, records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.state.checkpoint import Checkpoint
from epochal.state.store import (
    MAGIC,
    EntryExistsError,
    SnapshotStore,
    StateMovedError,
    get_record,
    put_record,
)
from epochal_sdk import SnapshotError
from epochal_sdk.errors import FencedError


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
    raw = (tmp_path / "store" / "a" / "b").read_bytes()
    assert raw.startswith(MAGIC) and raw.endswith(b"\nhello")  # one file: header + data
    # no temporary files are left behind
    assert sorted(os.listdir(tmp_path / "store" / "a")) == ["b"]


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


def test_temporary_files_are_invisible(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("dir/kept", b"1")
    (tmp_path / "store" / "dir" / "kept.tmp-123").write_bytes(b"interrupted write")
    assert store.list("dir") == ["dir/kept"]
    assert store.verify() == (1, [])


def test_a_file_without_header_is_refused(store: SnapshotStore, tmp_path: Path) -> None:
    (tmp_path / "store" / "dir").mkdir(parents=True)
    (tmp_path / "store" / "dir" / "foreign").write_bytes(b"not written by epochal")
    with pytest.raises(SnapshotError, match=r"'dir/foreign'.*not an epochal entry"):
        store.read("dir/foreign")


def test_exclusive_write_keeps_the_first(store: SnapshotStore, tmp_path: Path) -> None:
    store.write_json("sinks/s/decisions/000000000001", {"by": "first"}, exclusive=True)
    with pytest.raises(EntryExistsError):
        store.write_json("sinks/s/decisions/000000000001", {"by": "second"}, exclusive=True)
    assert store.read_json("sinks/s/decisions/000000000001") == {"by": "first"}
    assert os.listdir(tmp_path / "store" / "sinks" / "s" / "decisions") == ["000000000001"]


def test_an_anchored_store_refuses_to_act_once_its_state_moved(tmp_path: Path) -> None:
    """The fence of a zombie: its state directory was moved by a take-over; every read or
    write through the old path fails instead of landing where nobody reads."""
    state = tmp_path / "epochs" / "1"
    state.mkdir(parents=True)
    store = SnapshotStore(str(state / "store"), anchor=str(state))
    store.write("k", b"before")
    state.rename(tmp_path / "epochs" / "2")
    for act in (
        lambda: store.write("k2", b"after"),
        lambda: store.read("k"),
        lambda: store.exists("k"),
        lambda: store.list(""),
    ):
        with pytest.raises(StateMovedError, match="another driver took this job over"):
            act()
    assert isinstance(StateMovedError("x"), FencedError)
    assert not state.exists()  # the write did not re-create the moved directory
    assert SnapshotStore(str(tmp_path / "epochs" / "2" / "store")).read("k") == b"before"


def test_list_is_sorted_and_direct_children_only(store: SnapshotStore) -> None:
    for key in ("p/000000000010", "p/000000000002", "p/000000000001", "p/sub/deep"):
        store.write(key, b"x")
    assert store.list("p") == ["p/000000000001", "p/000000000002", "p/000000000010"]
    assert store.list("p/sub") == ["p/sub/deep"]
    assert store.list("absent") == []


def test_corrupt_data_is_refused(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("sinks/s/decisions/000000000003", b'{"batch": 3}')
    path = tmp_path / "store" / "sinks" / "s" / "decisions" / "000000000003"
    flip_byte(path, len(path.read_bytes()) - 3)
    with pytest.raises(SnapshotError) as info:
        store.read("sinks/s/decisions/000000000003")
    message = str(info.value)
    assert "'sinks/s/decisions/000000000003'" in message
    assert "is corrupt: checksum" in message
    assert "Refusing to use it" in message


def test_truncated_data_is_refused(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("k", b"0123456789")
    path = tmp_path / "store" / "k"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(SnapshotError, match=r"'k'.*size 5 bytes, header says 10"):
        store.read("k")


def test_corrupt_header(store: SnapshotStore, tmp_path: Path) -> None:
    store.write("k", b"data")
    (tmp_path / "store" / "k").write_bytes(MAGIC + b'{"size": 4, "sha2\ndata')
    with pytest.raises(SnapshotError, match=r"'k'.*its header is corrupt"):
        store.read("k")
    (tmp_path / "store" / "k").write_bytes(MAGIC + json.dumps({"size": 4}).encode() + b"\nx")
    with pytest.raises(SnapshotError, match="header is corrupt"):
        store.manifest("k")


def test_verify_counts_and_reports(store: SnapshotStore, tmp_path: Path) -> None:
    assert store.verify() == (0, [])
    store.write("a/one", b"1")
    store.write("a/two", b"22")
    store.write("b/c/three", b"333")
    assert store.verify() == (3, [])
    assert store.verify("a") == (2, [])
    path = tmp_path / "store" / "a" / "two"
    flip_byte(path, len(path.read_bytes()) - 1)
    three = tmp_path / "store" / "b" / "c" / "three"
    three.write_bytes(three.read_bytes()[:-1])
    checked, problems = store.verify()
    assert checked == 3
    assert len(problems) == 2
    assert any("'a/two'" in p and "corrupt" in p for p in problems)
    assert any("'b/c/three'" in p and "size 2 bytes" in p for p in problems)


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


@pytest.mark.parametrize("uri", [False, True], ids=["path", "file-uri"])
def test_a_local_store_lists_reads_and_deletes_without_pyarrow(tmp_path: Path, uri: bool) -> None:
    """A local store (a path or a ``file://`` URI) goes through the os module, and with a path
    pyarrow is not imported at all: the Python processes Spark starts to plan or commit a
    query load epochal's data source layer and read and write the snapshot, and importing
    pyarrow costs each 0.1 s of CPU (a ``file://`` URI is parsed by ``pyarrow.fs``)."""
    root = tmp_path / "store"
    script = f"""
import sys
from epochal.state.store import SnapshotStore
import pyspark_epochal_map  # Spark's data source lookup imports this in each new session
store = SnapshotStore({(f"file://{root}" if uri else str(root))!r})
store.write("sinks/a/decisions/1", b"1")
store.write("sinks/b/done/1", b"2")
assert store.list_dirs("sinks") == ["a", "b"], store.list_dirs("sinks")
assert store.list_dirs("nothing") == []
assert store.read("sinks/b/done/1") == b"2"
assert store.verify() == (2, []), store.verify()
store.delete("sinks/a/decisions/1")
store.delete_tree("sinks/b")
assert store.list_dirs("sinks") == ["a"] and not store.exists("sinks/b/done/1")
assert {uri} or "pyarrow" not in sys.modules, "pyarrow was imported"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


def test_a_store_on_another_pyarrow_file_system() -> None:
    """A root that is neither local nor on an object store (here pyarrow's in-memory
    ``mock://`` file system) goes through ``pyarrow.fs``: the same entries, listings and
    deletes as on local disk, and Spark's checkpoint read the same way."""
    store = SnapshotStore("mock:///state")
    assert not store.local
    store.write("sinks/a/decisions/1", b"1")
    store.write("sinks/b/done/2", b"2", exclusive=True)
    with pytest.raises(EntryExistsError):
        store.write("sinks/b/done/2", b"3", exclusive=True)
    assert store.read("sinks/a/decisions/1") == b"1"
    assert store.list_dirs("sinks") == ["a", "b"]
    assert store.list("sinks/b/done") == ["sinks/b/done/2"]
    assert store.verify() == (2, [])
    store.delete("sinks/a/decisions/1")
    store.delete_tree("sinks/b")
    assert not store.exists("sinks/b/done/2") and store.list("sinks/a/decisions") == []
    checkpoint = Checkpoint("mock:///checkpoint")
    checkpoint.files.write("offsets/0", b"{}")
    assert checkpoint.batches("offsets") == [0] and checkpoint.exists("offsets/0")


def test_records_round_trip(store: SnapshotStore) -> None:
    assert get_record(store, "job.json") is None
    put_record(store, "job.json", {"name": "j", "run": 1, "tags": ["a"]})
    assert get_record(store, "job.json") == {"name": "j", "run": 1, "tags": ["a"]}
    put_record(store, "job.json", {"name": "j", "run": 2})
    assert get_record(store, "job.json") == {"name": "j", "run": 2}
    with pytest.raises(SnapshotError, match="not an epochal entry"):  # records are not entries
        store.read("job.json")


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
