"""Key stability of idempotent sinks: order-independent digests, checked on replay."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from epochal.protocols.keys import KeyDigest, KeyStabilityError, check_and_record, prune
from epochal.state.store import SnapshotStore


def digest(*batches: pa.RecordBatch, columns: tuple[str, ...] = ("key",)) -> KeyDigest:
    d = KeyDigest()
    for batch in batches:
        d.add_batch(batch, columns)
    return d


def keys(*values: object, **extra: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": list(values), **extra})


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(str(tmp_path / "store"))


def test_digest_is_order_independent() -> None:
    one = digest(keys("a", "b", "c"))
    other = digest(keys("c", "a"), keys("b"))
    assert one == other
    assert one.count == 3
    assert one.as_dict() == {"count": 3, "total": one.total}
    assert 0 < one.total < 2**64


def test_digest_differs_for_different_keys() -> None:
    base = digest(keys("a", "b", "c"))
    assert digest(keys("a", "b", "d")) != base
    assert digest(keys("a", "b")) != base
    assert digest(keys("a", "b", "c", "c")) != base
    assert digest(keys(1, 2, 3)) != digest(keys("1", "2", "3"))
    assert KeyDigest() == KeyDigest(0, 0)


def test_digest_of_several_key_columns() -> None:
    one = digest(keys("a", "b", tenant=["x", "y"]), columns=("tenant", "key"))
    swapped = digest(keys("a", "b", tenant=["y", "x"]), columns=("tenant", "key"))
    reordered = digest(keys("b", "a", tenant=["y", "x"]), columns=("tenant", "key"))
    assert one != swapped
    assert one == reordered
    assert one != digest(keys("a", "b"))


def test_check_and_record(store: SnapshotStore) -> None:
    first = digest(keys("a", "b"))
    check_and_record(store, "map-1", 3, 1, first)
    key = "sinks/map-1/keys/000000000003-00001"
    assert store.read_json(key) == first.as_dict()
    assert store.manifest(key).count == 2
    # a replay with the same keys, in another order, is accepted
    check_and_record(store, "map-1", 3, 1, digest(keys("b"), keys("a")))
    # other partitions and batches are recorded separately
    check_and_record(store, "map-1", 3, 2, digest(keys("z")))
    check_and_record(store, "map-1", 4, 1, digest(keys("z")))
    assert store.read_json(key) == first.as_dict()


def test_unstable_keys_are_refused(store: SnapshotStore) -> None:
    check_and_record(store, "map-1", 3, 1, digest(keys("a", "b")))
    replay = digest(keys("a", "b-2024-01-01T00:00:01"))
    with pytest.raises(KeyStabilityError) as info:
        check_and_record(store, "map-1", 3, 1, replay)
    message = str(info.value)
    assert message.startswith(
        "sink map-1, batch 3, partition 1: the replay produced different keys"
    )
    assert f"digest {replay.total:x}" in message
    assert "stable keys" in message
    # the first record is kept
    assert (
        store.read_json("sinks/map-1/keys/000000000003-00001") == digest(keys("a", "b")).as_dict()
    )


def test_prune(store: SnapshotStore) -> None:
    for batch in (1, 2, 10, 11):
        for partition in (0, 1):
            check_and_record(store, "s", batch, partition, digest(keys(str(batch))))
    check_and_record(store, "other", 1, 0, digest(keys("x")))
    prune(store, "s", 10)
    assert store.list("sinks/s/keys") == [
        "sinks/s/keys/000000000010-00000",
        "sinks/s/keys/000000000010-00001",
        "sinks/s/keys/000000000011-00000",
        "sinks/s/keys/000000000011-00001",
    ]
    assert store.exists("sinks/other/keys/000000000001-00000")
    # pruned digests are recorded afresh
    check_and_record(store, "s", 1, 0, digest(keys("new")))
