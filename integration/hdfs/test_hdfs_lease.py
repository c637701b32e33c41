"""Snapshots and the job's lease on HDFS: entries, exclusive writes, the compare-and-swap of
records and the lease's take-over races, against a real NameNode and DataNode (the
``hdfs_server`` fixture) through WebHDFS.

The races are those of ``tests/unit/test_objectstore.py`` on S3: every contender reads the same
version before any of them writes (a barrier after the read), so they fail if the
compare-and-swap is replaced by a plain write. Needs the machine's Spark/JVM lock
(``flock /work/spark.lock``): the NameNode and the DataNode are JVMs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from epochal.state import jobs, webhdfs
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.lease.fence import Fence, state_dir
from epochal.state.lease.record import new_owner
from epochal.state.objectstore import PreconditionFailedError
from epochal.state.store import (
    EntryExistsError,
    RecordChangedError,
    SnapshotStore,
    StateMovedError,
    get_record,
    get_versioned_record,
    put_record,
    put_versioned_record,
)
from epochal_sdk import SnapshotError
from epochal_sdk.errors import FencedError
from integration.harness.hdfs import HdfsServer
from tests.unit.test_objectstore import (  # the object store's lease races, run on HDFS (root)
    CONTENDERS,
    _race,
    _submit,
    test_a_fresh_lease_refuses_a_second_supervisor_then_expires,  # noqa: F401
    test_supervisors_racing_for_a_job_one_wins,  # noqa: F401
)

pytestmark = pytest.mark.integration


@pytest.fixture
def root(hdfs_server: HdfsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh snapshot directory on the HDFS, with its WebHDFS settings in the environment."""
    for name, value in hdfs_server.env().items():
        monkeypatch.setenv(name, value)
    yield hdfs_server.url(f"snapshots-{new_owner()[:12]}")


def _objects(root: str) -> webhdfs.HdfsStore:
    objects = SnapshotStore(root).objects
    assert isinstance(objects, webhdfs.HdfsStore)
    return objects


def test_store_entries_on_hdfs(root: str, hdfs_server: HdfsServer) -> None:
    """Entries round-trip, list, verify and delete on HDFS; a corrupt one is refused; no
    temporary file is left beside them."""
    store = SnapshotStore(f"{root}/job/state/store")
    store.write("sinks/s/decisions/000000000001", b"one", count=1)
    store.write_json("sinks/s/done/000000000001", {"ok": True})
    store.write("sources/a/batches/000000000002", b"two")
    assert store.read("sinks/s/decisions/000000000001") == b"one"
    assert store.read_json("sinks/s/done/000000000001") == {"ok": True}
    assert store.exists("sources/a/batches/000000000002")
    assert not store.exists("sources/a/batches/000000000003")
    assert store.manifest("nothing") is None
    assert store.list("sinks/s/decisions") == ["sinks/s/decisions/000000000001"]
    assert store.list_dirs("sinks/s") == ["decisions", "done"]
    assert store.verify() == (3, [])
    path = root.split("/", 3)[3] + "/job/state/store/sources/a/batches"
    assert hdfs_server.list_files(path) == ["000000000002"]  # no temporary file left
    objects = _objects(root)
    key = f"{path}/000000000002"
    raw = objects.get(key).data
    objects.put(key, raw[:-1] + b"X")
    with pytest.raises(SnapshotError, match="corrupt"):
        store.read("sources/a/batches/000000000002")
    assert len(store.verify()[1]) == 1
    store.delete("sinks/s/done/000000000001")
    assert store.list("sinks/s/done") == []
    store.delete_tree("sources")
    assert store.list_dirs() == ["sinks"]


def test_exclusive_writes_have_one_winner(root: str) -> None:
    """An exclusive entry is created once (a rename that refuses an existing target): of
    writers racing for it exactly one wins and its bytes stay; a retry of our own write is no
    conflict."""
    store = SnapshotStore(f"{root}/job/state/store")
    winners: list[int] = []
    barrier = threading.Barrier(CONTENDERS)

    def write(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            store.write_json("sinks/s/decisions/000000000007", {"writer": index}, exclusive=True)
            winners.append(index)
        except EntryExistsError:
            pass

    threads = [threading.Thread(target=write, args=(i,)) for i in range(CONTENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(winners) == 1, winners
    assert store.read_json("sinks/s/decisions/000000000007") == {"writer": winners[0]}

    objects = _objects(root)
    key = root.split("/", 3)[3] + "/own"
    version = objects.put(key, b"mine", create_only=True)
    assert objects.put(key, b"mine", create_only=True) == version  # the retried request
    with pytest.raises(PreconditionFailedError):
        objects.put(key, b"theirs", create_only=True)


def test_records_swap_with_compare_and_swap(root: str) -> None:
    """A versioned record is replaced only at the version that was read; a version never
    comes back."""
    store = SnapshotStore(f"{root}/job")
    assert get_versioned_record(store, "r.json") == (None, None)
    first = put_versioned_record(store, "r.json", {"n": 1}, None)
    with pytest.raises(RecordChangedError):
        put_versioned_record(store, "r.json", {"n": 1.5}, None)  # it exists now
    second = put_versioned_record(store, "r.json", {"n": 2}, first)
    with pytest.raises(RecordChangedError):
        put_versioned_record(store, "r.json", {"n": 3}, first)  # a stale version
    assert get_versioned_record(store, "r.json") == ({"n": 2}, second)
    third = put_versioned_record(store, "r.json", {"n": 2}, second)  # same bytes: new version
    assert len({first, second, third}) == 3
    put_record(store, "plain.json", {"a": 1})
    assert get_record(store, "plain.json") == {"a": 1}
    assert store.list("") == ["/plain.json", "/r.json"]  # claims and staged files are hidden


def test_a_writer_stopped_between_its_claim_and_its_rename_is_finished_by_the_next(
    root: str,
) -> None:
    """A writer that won the claim of a version and stopped before moving its bytes over the
    record: the next writer of that version finishes the winner's swap, loses, reads again
    and swaps the winner's record."""
    objects = _objects(root)
    key = root.split("/", 3)[3] + "/r.json"
    first = objects.put(key, b"one", create_only=True)
    with pytest.MonkeyPatch.context() as patch:  # the winner stops right after its claim
        patch.setattr(objects, "_finish", lambda path, claim, version: True)
        objects.put(key, b"two (stopped winner)", if_match=first)
    assert objects.get(key).data == b"one"  # not moved yet
    with pytest.raises(PreconditionFailedError):
        objects.put(key, b"three (loser)", if_match=first)
    current = objects.get(key)
    assert current.data == b"two (stopped winner)" and current.etag != first
    objects.put(key, b"four", if_match=current.etag)
    assert objects.get(key).data == b"four"


def test_record_updates_are_never_lost(root: str) -> None:
    """Read-modify-writes of the job record that all read the same version: every update's
    fields survive."""
    _submit(root)
    changes: list[Callable[[JobRecord], None]] = [
        lambda r: setattr(r, "failure", "writer 0"),
        lambda r: setattr(r, "requested", "suspend"),
        lambda r: setattr(r, "supervisor", {"pid": 2}),
        lambda r: setattr(r, "original_executors", 3),
    ]

    def update(index: int) -> None:
        with JobDirectory(root, "job").update() as record:
            changes[index](record)

    outcomes = _race(len(changes), jobs, update)
    assert outcomes == [None] * len(changes)
    record = JobDirectory(root, "job").load()
    assert (record.failure, record.requested) == ("writer 0", "suspend")
    assert (record.supervisor, record.original_executors) == ({"pid": 2}, 3)


def test_a_fenced_run_cannot_write_the_shared_state(root: str) -> None:
    """A run's store is anchored to its lease epoch and refuses to write or delete once the
    lease moved on, while the new owner sees everything the old one wrote before."""
    jobdir = _submit(root)
    epoch = jobdir.lease.acquire(new_owner(), ttl=20.0)
    old_state = state_dir(jobdir.path, epoch)
    old = SnapshotStore(f"{old_state}/store", anchor=old_state)
    old.write("sinks/s/decisions/000000000001", b"decided before the take-over")
    assert jobdir.store.read("sinks/s/decisions/000000000001") == b"decided before the take-over"
    assert Fence(jobdir.path, epoch).check("deciding") is None

    new_epoch = JobDirectory(root, "job").lease.acquire(new_owner(), force=True)
    assert new_epoch == epoch + 1
    with pytest.raises(StateMovedError):
        old.write("sinks/s/decisions/000000000002", b"zombie")
    with pytest.raises(StateMovedError):
        old.delete("sinks/s/decisions/000000000001")
    with pytest.raises(FencedError):
        Fence(jobdir.path, epoch).check("deciding")
    new_state = state_dir(jobdir.path, new_epoch)
    new = SnapshotStore(f"{new_state}/store", anchor=new_state)
    assert new.read("sinks/s/decisions/000000000001") == b"decided before the take-over"
    assert not new.exists("sinks/s/decisions/000000000002")


def test_jobs_are_listed_and_cancelled_on_hdfs(root: str) -> None:
    _submit(root, "one")
    _submit(root, "two")
    assert [r.name for r in jobs.list_jobs(root)] == ["one", "two"]
    two = JobDirectory(root, "two")
    two.store.write("k", b"v")
    two.delete_snapshots()
    assert not two.store.exists("k")
    assert two.exists()


def test_a_namenode_restart_is_waited_out(
    root: str, hdfs_server: HdfsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals go on across a NameNode restart: a renewal made while it is down waits for it
    instead of failing; nothing written before is lost. The product waits
    ``webhdfs.RETRY_SECONDS`` per call (a supervisor's next round tries again, up to half the
    TTL); here one call may wait 120 s, since how long a restarted NameNode stays in startup
    mode depends on the machine's load, not on epochal (a call that does not wait fails at once
    with the NameNode down)."""
    monkeypatch.setattr(webhdfs, "RETRY_SECONDS", 120.0)
    jobdir = _submit(root)
    owner = new_owner()
    epoch = jobdir.lease.acquire(owner, ttl=300.0)
    jobdir.store.write("before", b"written before the restart")
    outcome: list[Any] = []
    down = threading.Event()

    def renew_while_down() -> None:
        down.wait(30)
        try:
            outcome.append(jobdir.lease.renew(owner, epoch, ttl=300.0))
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=renew_while_down)
    thread.start()
    hdfs_server.restart_namenode(down=1.0, on_stopped=down.set)
    thread.join(timeout=150)
    assert outcome == [True], outcome
    assert jobdir.store.read("before") == b"written before the restart"
    assert jobdir.lease.read().epoch == epoch
