"""TwoPhaseCommit driven against the real map sink (SQLite) and a real snapshot store."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from epochal.config import JobConfig
from epochal.parts.job_context import JobContext
from epochal.protocols.two_phase import TwoPhaseCommit, batches_of
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.lease.fence import LEASE_RECORD
from epochal.state.lease.record import new_owner
from epochal.state.store import SnapshotStore, put_record
from epochal.testing import prepare_transaction
from epochal_map.sink import MapSink
from epochal_map.store import MapStore
from epochal_sdk import ConnectorContext, Options, Prepared
from epochal_sdk.errors import FencedError
from epochal_sdk.ids import transaction_prefix
from epochal_sdk.schema import Field

JOB = "orders-job_1"
SINK_ID = "map-0123456789"
PREFIX = transaction_prefix(JOB, SINK_ID)
SCHEMA = (Field("key", "string"), Field("value", "string"))


class CrashError(Exception):
    """Stands for the process dying at a protocol step."""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "maps.sqlite"


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(str(tmp_path / "job" / "store"))


def new_sink(path: Path) -> MapSink:
    return MapSink(Options("map", {"path": str(path), "map": "out", "mode": "transactional"}))


@pytest.fixture
def sink(path: Path) -> Iterator[MapSink]:
    s = new_sink(path)
    yield s
    s.close()


def prepare(
    sink: MapSink,
    batch: int,
    partition: int,
    rows: dict[str, str],
    *,
    attempt: int = 0,
    job: str = JOB,
    sink_id: str = SINK_ID,
    run: int = 1,
) -> Prepared:
    task = ConnectorContext(job, sink_id, batch, partition, attempt, SCHEMA, run=run)
    records = pa.RecordBatch.from_pydict({"key": list(rows), "value": list(rows.values())})
    return prepare_transaction(sink, task, records)


def entries(path: Path) -> dict[str, str]:
    with MapStore(path) as s:
        return s.entries("out")


def journal_size(path: Path) -> int:
    with MapStore(path) as s:
        return sum(s.journal_end("out", p) for p in s.journal_partitions("out"))


def state(path: Path, transaction_id: str) -> str | None:
    with MapStore(path) as s:
        return s.transaction_state(transaction_id)


def protocol(store: SnapshotStore, sink: MapSink, **kwargs) -> TwoPhaseCommit:
    return TwoPhaseCommit(store, sink, SINK_ID, PREFIX, **kwargs)


def test_prepared_rows_are_invisible_until_completed(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    p0 = prepare(sink, 1, 0, {"a": "1", "b": "2"})
    p1 = prepare(sink, 1, 1, {"c": "3"})
    tpc = protocol(store, sink)
    assert entries(path) == {}
    assert not tpc.is_decided(1)
    assert tpc.decide(1, [p0, p1]) == [p0, p1]
    assert tpc.is_decided(1)
    assert tpc.decision(1) == [p0, p1]
    assert entries(path) == {}  # deciding is not committing
    tpc.complete(1)
    assert entries(path) == {"a": "1", "b": "2", "c": "3"}
    assert journal_size(path) == 3
    assert store.exists(f"sinks/{SINK_ID}/done/000000000001")
    assert store.read_json(f"sinks/{SINK_ID}/decisions/000000000001")["transactions"] == [
        {"id": p0.transaction_id, "data": p0.data},
        {"id": p1.transaction_id, "data": p1.data},
    ]


def test_decide_twice_keeps_the_first_decision(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    first = prepare(sink, 4, 0, {"k": "first"})
    second = prepare(sink, 4, 0, {"k": "second"}, attempt=1)
    tpc = protocol(store, sink)
    tpc.decide(4, [first])
    assert tpc.decide(4, [second]) == [first]
    assert tpc.decision(4) == [first]
    tpc.complete(4)
    assert entries(path) == {"k": "first"}
    assert state(path, second.transaction_id) == "rolled_back"


def test_complete_twice_is_idempotent(path: Path, store: SnapshotStore, sink: MapSink) -> None:
    tpc = protocol(store, sink)
    tpc.commit_batch(2, [prepare(sink, 2, 0, {"x": "1", "y": "2"})])
    tpc.complete(2)
    tpc.commit_batch(2, [])
    assert entries(path) == {"x": "1", "y": "2"}
    assert journal_size(path) == 2


def test_crash_after_decision_is_finished_by_recovery(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    seen: list[tuple[str, int]] = []

    def step(point: str, batch: int) -> None:
        seen.append((point, batch))
        if point == "sink.after_decision":
            raise CrashError

    prepared = [prepare(sink, 3, 0, {"a": "1"}), prepare(sink, 3, 1, {"b": "2"})]
    with pytest.raises(CrashError):
        protocol(store, sink, step=step).commit_batch(3, prepared)
    assert seen == [("sink.before_decision", 3), ("sink.after_decision", 3)]
    assert entries(path) == {}

    # a new run: a fresh sink and protocol on the same files
    restarted = new_sink(path)
    try:
        report = protocol(store, restarted).recover()
    finally:
        restarted.close()
    assert report.completed_batches == [3]
    assert report.rolled_back == []
    assert entries(path) == {"a": "1", "b": "2"}
    assert journal_size(path) == 2
    assert "finished 1 decided batch(es) [3]" in str(report)
    # recovering again finds nothing to do
    restarted = new_sink(path)
    try:
        again = protocol(store, restarted).recover()
    finally:
        restarted.close()
    assert again.completed_batches == []
    assert again.rolled_back == []
    assert journal_size(path) == 2


def test_crash_in_the_middle_of_phase_two(path: Path, store: SnapshotStore, sink: MapSink) -> None:
    def step(point: str, batch: int) -> None:
        if point == "sink.mid_commit":
            raise CrashError

    prepared = [prepare(sink, 5, p, {f"k{p}": str(p)}) for p in range(3)]
    with pytest.raises(CrashError):
        protocol(store, sink, step=step).commit_batch(5, prepared)
    assert entries(path) == {"k0": "0"}  # the first transaction only
    report = protocol(store, sink).recover()
    assert report.completed_batches == [5]
    assert entries(path) == {"k0": "0", "k1": "1", "k2": "2"}
    assert journal_size(path) == 3  # k0 was not applied twice


def test_recover_rolls_back_undecided_transactions(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    tpc = protocol(store, sink)
    tpc.commit_batch(1, [prepare(sink, 1, 0, {"done": "1"})])
    undecided = [prepare(sink, 2, 0, {"lost": "1"}), prepare(sink, 2, 1, {"lost2": "1"})]
    other_job = prepare(sink, 2, 0, {"other": "1"}, job="orders-job_10")
    other_sink = prepare(sink, 2, 0, {"other": "2"}, sink_id="map-0123456789a")
    report = protocol(store, sink).recover()
    assert report.completed_batches == []
    assert sorted(report.rolled_back) == sorted(p.transaction_id for p in undecided)
    for p in undecided:
        assert state(path, p.transaction_id) == "rolled_back"
    assert state(path, other_job.transaction_id) == "prepared"
    assert state(path, other_sink.transaction_id) == "prepared"
    assert entries(path) == {"done": "1"}
    assert "rolled back 2 undecided transaction(s)" in str(report)


def test_complete_rolls_back_orphaned_attempts(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    failed = prepare(sink, 7, 0, {"k": "attempt-0"}, attempt=0)
    winner = prepare(sink, 7, 0, {"k": "attempt-1"}, attempt=1)
    next_batch = prepare(sink, 8, 0, {"n": "1"})
    batch_70 = prepare(sink, 70, 0, {"s": "1"})  # its id starts with the same digit
    protocol(store, sink).commit_batch(7, [winner])
    assert entries(path) == {"k": "attempt-1"}
    assert state(path, winner.transaction_id) == "committed"
    assert state(path, failed.transaction_id) == "rolled_back"
    assert state(path, next_batch.transaction_id) == "prepared"
    assert state(path, batch_70.transaction_id) == "prepared"


def test_abort_batch_rolls_back_undecided(path: Path, store: SnapshotStore, sink: MapSink) -> None:
    prepared = [prepare(sink, 9, 0, {"a": "1"}), prepare(sink, 9, 1, {"b": "1"})]
    protocol(store, sink).abort_batch(9, [prepared[0], None, prepared[1]])
    for p in prepared:
        assert state(path, p.transaction_id) == "rolled_back"
    assert entries(path) == {}
    assert not protocol(store, sink).is_decided(9)


def test_abort_batch_completes_a_decided_batch(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    prepared = [prepare(sink, 9, 0, {"a": "1"})]
    tpc = protocol(store, sink)
    tpc.decide(9, prepared)
    tpc.abort_batch(9, prepared)
    assert state(path, prepared[0].transaction_id) == "committed"
    assert entries(path) == {"a": "1"}


def test_prune_removes_old_done_batches_only(store: SnapshotStore, sink: MapSink) -> None:
    tpc = protocol(store, sink)
    for batch in range(1, 6):
        tpc.commit_batch(batch, [prepare(sink, batch, 0, {f"b{batch}": "1"})])
    tpc.decide(2_000, [])  # decided, never completed
    tpc.decide(0, [])  # an old batch decided but not done must survive too
    tpc.prune(4)
    decisions = store.list(f"sinks/{SINK_ID}/decisions")
    done = store.list(f"sinks/{SINK_ID}/done")
    assert [int(k.rsplit("/", 1)[1]) for k in decisions] == [0, 4, 5, 2_000]
    assert [int(k.rsplit("/", 1)[1]) for k in done] == [4, 5]
    assert tpc.is_decided(0)
    assert not tpc.is_decided(3)


@pytest.fixture
def leased(tmp_path: Path) -> JobDirectory:
    """A job whose lease a first driver holds at epoch 1."""
    jobdir = JobDirectory(str(tmp_path / "snapshots"), "orders")
    jobdir.save(JobRecord("orders", "m:f", JobConfig().to_dict()))
    jobdir.lease.acquire(new_owner())
    return jobdir


def run_protocol(jobdir: JobDirectory, sink: MapSink, epoch: int, run: int) -> TwoPhaseCommit:
    """The protocol as a driver run at ``epoch`` sees it (its anchored store, its fence)."""
    context = JobContext(job=JOB, job_dir=jobdir.path, lease_epoch=epoch, run=run, supervised=True)
    return protocol(
        context.store("map"), sink, run=run, fence=context.check_fence, lease_epoch=epoch
    )


def test_fenced_driver_decides_nothing(path: Path, leased: JobDirectory, sink: MapSink) -> None:
    """The fence check itself: the lease already shows the new epoch, the state has not been
    moved yet (the moment in between of a take-over). Without the check the zombie would
    decide and commit here."""
    prepared = [prepare(sink, 11, 0, {"z": "1"})]
    zombie = run_protocol(leased, sink, epoch=1, run=1)
    lease = leased.lease.read()
    taken = dataclasses.replace(lease, epoch=2, owner=new_owner())
    put_record(leased.files, LEASE_RECORD, taken.to_record())
    with pytest.raises(FencedError) as info:
        zombie.commit_batch(11, prepared)
    assert "holds lease epoch 1" in str(info.value)
    assert "at epoch 2" in str(info.value)
    assert not zombie.is_decided(11)
    assert state(path, prepared[0].transaction_id) == "prepared"
    assert entries(path) == {}
    put_record(leased.files, LEASE_RECORD, lease.to_record())
    leased.lease.acquire(new_owner(), force=True)  # the take-over completes: epoch 2
    # the owner of the current epoch recovers: the zombie's undecided transaction goes
    owner = run_protocol(leased, sink, epoch=2, run=2)
    assert not owner.is_decided(11)
    assert owner.recover().rolled_back == [prepared[0].transaction_id]
    replayed = [prepare(sink, 11, 0, {"z": "1"}, run=2)]
    owner.commit_batch(11, replayed)
    assert entries(path) == {"z": "1"}
    assert leased.store.read_json(f"sinks/{SINK_ID}/decisions/000000000011")["lease_epoch"] == 2


def test_a_decision_recorded_before_a_take_over_is_completed_by_the_new_owner(
    path: Path, leased: JobDirectory, sink: MapSink
) -> None:
    """The zombie recorded its decision, then lost the lease before phase 2: it commits
    nothing (the check after the record), the new owner's recovery commits it all."""
    prepared = [prepare(sink, 5, p, {f"k{p}": str(p)}) for p in range(2)]
    context = JobContext(job=JOB, job_dir=leased.path, lease_epoch=1, run=1, supervised=True)
    checks: list[str] = []

    def fence_then_lose_the_lease(doing: str) -> None:
        checks.append(doing)
        if len(checks) == 2:  # the check right after the decision was recorded
            leased.lease.acquire(new_owner(), force=True)
        context.check_fence(doing)

    zombie = protocol(context.store("map"), sink, run=1, fence=fence_then_lose_the_lease)
    with pytest.raises(FencedError):
        zombie.commit_batch(5, prepared)
    assert checks == ["batch 5: deciding the commit", "batch 5: decision recorded"]
    assert entries(path) == {}  # no phase 2 by the zombie
    report = run_protocol(leased, sink, epoch=2, run=2).recover()
    assert report.completed_batches == [5]
    assert entries(path) == {"k0": "0", "k1": "1"}


def test_recovery_never_touches_a_newer_run(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    """A zombie (run 1) recovering late must not roll back what the new owner's run 2
    prepared and is about to decide; its own earlier attempts it may."""
    newer = prepare(sink, 4, 0, {"new": "1"}, run=2)
    older = prepare(sink, 4, 0, {"old": "1"}, run=1)
    report = protocol(store, sink, run=2).recover()  # run 2 recovers runs before it
    assert report.rolled_back == [older.transaction_id]
    assert state(path, newer.transaction_id) == "prepared"
    assert protocol(store, sink, run=1).rollback_strays(4) == 0
    assert state(path, newer.transaction_id) == "prepared"


def test_a_zombie_with_moved_state_recovers_nothing(
    path: Path, leased: JobDirectory, sink: MapSink
) -> None:
    undecided = prepare(sink, 3, 0, {"u": "1"}, run=2)
    zombie = run_protocol(leased, sink, epoch=1, run=3)
    leased.lease.acquire(new_owner(), force=True)
    with pytest.raises(FencedError):
        zombie.recover()
    assert state(path, undecided.transaction_id) == "prepared"


def test_batches_of() -> None:
    ids = [f"{PREFIX}.{b}.0.1.0" for b in (3, 3, 12)]
    assert batches_of(Prepared(i) for i in ids) == {3, 12}


def test_recovery_does_not_touch_a_sink_whose_id_extends_this_one(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    theirs = prepare(sink, 0, 0, {"theirs": "1"}, job="j", sink_id="s.1")
    mine = TwoPhaseCommit(store, sink, "s", transaction_prefix("j", "s"))
    other = TwoPhaseCommit(store, sink, "s.1", transaction_prefix("j", "s.1"))
    other.decide(0, [theirs])  # decided, then the driver died before phase 2
    mine.recover()
    assert state(path, theirs.transaction_id) == "prepared"
    other.recover()
    assert entries(path) == {"theirs": "1"}


def test_rollback_strays_keeps_what_it_is_told(
    path: Path, store: SnapshotStore, sink: MapSink
) -> None:
    keep = prepare(sink, 12, 0, {"k": "1"}, attempt=1)
    strays = [prepare(sink, 12, 0, {"k": "0"}), prepare(sink, 12, 1, {"j": "0"})]
    later = prepare(sink, 120, 0, {"l": "0"})
    assert protocol(store, sink).rollback_strays(12, keep={keep.transaction_id}) == 2
    assert [state(path, p.transaction_id) for p in strays] == ["rolled_back", "rolled_back"]
    assert state(path, keep.transaction_id) == "prepared"
    assert state(path, later.transaction_id) == "prepared"
    assert protocol(store, sink).rollback_strays(12, keep={keep.transaction_id}) == 0


def test_recover_without_a_store_rolls_back_every_stray(path: Path, sink: MapSink) -> None:
    strays = [prepare(sink, 1, 0, {"a": "1"}), prepare(sink, 2, 0, {"b": "1"})]
    other_job = prepare(sink, 1, 0, {"c": "1"}, job="another")
    report = TwoPhaseCommit(None, sink, SINK_ID, PREFIX).recover()
    assert report.completed_batches == []
    assert sorted(report.rolled_back) == sorted(p.transaction_id for p in strays)
    assert state(path, other_job.transaction_id) == "prepared"
    assert entries(path) == {}
