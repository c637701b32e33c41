"""Snapshots on object storage: the S3 backend of the snapshot store, the lease and the job
record swapped with conditional writes, the checkpoint read from S3.

The first tests need no server (paths, settings). The others (marked ``integration``) run
against a real S3 server, SeaweedFS from the integration harness, with conditional writes
(``If-None-Match``, ``If-Match``) as AWS S3 has them. The races make every contender read the
same version before any of them writes (a barrier after the read), so they fail if the
compare-and-swap is replaced by a plain write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from epochal.config import JobConfig
from epochal.state import jobs, layout, objectstore
from epochal.state.checkpoint import Checkpoint
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.lease import swaps
from epochal.state.lease.fence import (
    LEASE_RECORD,
    Fence,
    checkpoint_location,
    state_dir,
    state_location,
)
from epochal.state.lease.record import new_owner
from epochal.state.lease.swaps import LeaseHeldError, LeaseLostError
from epochal.state.locks import JobError
from epochal.state.manifests import verify_job
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
from epochal_sdk import ConfigError, SnapshotError
from epochal_sdk.errors import FencedError
from integration.harness import HarnessError, PrerequisiteError
from integration.harness.s3 import S3Bucket, S3Server, new_bucket, start_s3

CONTENDERS = 4


# -- without a server ---------------------------------------------------------------------
def test_paths_on_an_object_store_and_locally() -> None:
    """An epoch's directory is itself locally; on S3 every epoch names the shared prefix,
    and Spark reaches it as s3a://."""
    assert objectstore.split_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    assert objectstore.split_uri("s3a://bucket") == ("bucket", "")
    assert objectstore.spark_uri("s3://bucket/a/b") == "s3a://bucket/a/b"
    assert objectstore.spark_uri("/tmp/x") == "/tmp/x"
    assert state_location("/tmp/snap/job/epochs/3") == "/tmp/snap/job/epochs/3"
    assert state_location("s3://b/snap/job/epochs/3") == "s3://b/snap/job/state"
    assert state_location("s3://b/snap/epochs/3/job") == "s3://b/snap/epochs/3/job"
    assert objectstore.epoch_of("s3://b/snap/job/epochs/12") == ("s3://b/snap/job", 12)
    assert checkpoint_location("/tmp/snap/job/epochs/3") == "/tmp/snap/job/epochs/3/checkpoint"
    assert (
        checkpoint_location(state_dir("s3://b/snap/job", 3)) == "s3a://b/snap/job/state/checkpoint"
    )


def test_credentials_in_the_uri_are_refused() -> None:
    with pytest.raises(ConfigError, match="environment"):
        objectstore.split_uri("s3://key:secret@bucket/prefix")
    with pytest.raises(ConfigError, match="bucket"):
        objectstore.split_uri("s3:///prefix")


def test_settings_and_spark_conf_come_from_the_environment() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    settings = objectstore.S3Settings.from_env(env)
    assert settings == objectstore.S3Settings("http://127.0.0.1:9000", "us-east-1", True)
    conf = objectstore.spark_conf(env)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    for secret in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        assert f"spark.executorEnv.{secret}" not in conf  # never copied: it would reach argv
    assert "id" not in conf.values() and "secret" not in conf.values()
    assert "spark.hadoop.fs.s3a.secret.key" not in conf  # S3A reads the variables itself
    on_aws = objectstore.S3Settings.from_env({"AWS_REGION": "eu-west-1"})
    assert on_aws == objectstore.S3Settings(None, "eu-west-1", False)
    assert objectstore.spark_conf({"HOME": "/root"}) == {}
    explicit = {"EPOCHAL_S3_ENDPOINT": "https://s3.example", "EPOCHAL_S3_PATH_STYLE": "false"}
    assert objectstore.S3Settings.from_env(explicit).path_style is False


def test_without_boto3_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    settings = objectstore.S3Settings("http://127.0.0.1:1", "us-east-1", True)
    with pytest.raises(ConfigError, match=r"epochal\[s3\]"):
        objectstore.client(settings)


def test_a_job_on_an_object_store_keeps_logs_and_run_records_on_local_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(layout.LOCAL_DIR_ENV, str(tmp_path / "local"))
    remote = JobDirectory("s3://bucket/snapshots", "job-1")
    assert remote.logs.startswith(str(tmp_path / "local"))
    assert remote.run_dir.startswith(str(tmp_path / "local"))
    assert remote.logs != JobDirectory("s3://bucket/other", "job-1").logs
    local = JobDirectory(str(tmp_path / "snap"), "job-1")
    assert local.logs == f"{tmp_path}/snap/job-1/logs"
    assert local.run_dir == f"{tmp_path}/snap/job-1/drivers"


# -- against a real S3 server -------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """The harness's S3 server (SeaweedFS, or ``$EPOCHAL_S3_ENDPOINT``) for this module."""
    try:
        server = start_s3()
    except PrerequisiteError as exc:
        pytest.fail(f"s3 server: missing prerequisite: {exc}", pytrace=False)
    except (HarnessError, TimeoutError) as exc:
        pytest.fail(f"s3 server could not be started: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.backend.close()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh bucket, deleted after the test."""
    bucket = new_bucket(s3_server, "objectstore")
    yield bucket
    s3_server.delete_bucket(bucket.name)


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The process environment a supervisor or a driver would have: AWS_* for the server."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(layout.LOCAL_DIR_ENV, str(tmp_path / "local"))


@pytest.fixture
def root(s3_bucket: S3Bucket, s3_env: None) -> str:
    return s3_bucket.url("snapshots").rstrip("/")


def _submit(snapshot_dir: str, name: str = "job") -> JobDirectory:
    jobdir = JobDirectory(snapshot_dir, name)
    config = JobConfig(snapshot_dir=snapshot_dir)
    jobdir.save(JobRecord(name=name, target="m:f", config=config.to_dict()))
    return jobdir


def _race(contenders: int, module: ModuleType, act: Callable[[int], Any]) -> list[Any]:
    """Run ``act(i)`` in ``contenders`` threads at once, every one of them held after its
    first read of a versioned record through ``module`` until all have read: they all decide
    on the same version."""
    read = module.get_versioned_record
    barrier = threading.Barrier(contenders)
    held = threading.local()

    def synchronised_read(*args: Any, **kwargs: Any) -> Any:
        result = read(*args, **kwargs)
        if not getattr(held, "done", False):
            held.done = True
            barrier.wait(timeout=30)
        return result

    outcomes: list[Any] = [None] * contenders

    def run(index: int) -> None:
        try:
            outcomes[index] = act(index)
        except Exception as exc:
            outcomes[index] = exc

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "get_versioned_record", synchronised_read)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(contenders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    return outcomes


@pytest.mark.integration
def test_store_entries_on_s3(root: str, s3_bucket: S3Bucket) -> None:
    """Entries round-trip, list, verify and delete on S3; a corrupt one is refused."""
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
    key = "snapshots/job/state/store/sources/a/batches/000000000002"
    client = s3_bucket.client()
    raw = client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read()
    client.put_object(Bucket=s3_bucket.name, Key=key, Body=raw[:-1] + b"X")
    with pytest.raises(SnapshotError, match="corrupt"):
        store.read("sources/a/batches/000000000002")
    assert len(store.verify()[1]) == 1
    store.delete("sinks/s/done/000000000001")
    assert store.list("sinks/s/done") == []
    store.delete_tree("sources")
    assert s3_bucket.keys("snapshots/job/state/store/sources/") == []


@pytest.mark.integration
def test_exclusive_writes_have_one_winner(root: str) -> None:
    """An exclusive entry is created once (If-None-Match): of writers racing for it exactly
    one wins and its bytes stay; a retry of our own write (a lost response) is no conflict."""
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

    objects = store.objects
    assert objects is not None
    etag = objects.put("own", b"mine", create_only=True)
    assert objects.put("own", b"mine", create_only=True) == etag  # the retried request
    with pytest.raises(objectstore.PreconditionFailedError):
        objects.put("own", b"theirs", create_only=True)


@pytest.mark.integration
def test_records_swap_with_compare_and_swap(root: str) -> None:
    """A versioned record is replaced only at the version that was read."""
    store = SnapshotStore(f"{root}/job")
    assert get_versioned_record(store, "r.json") == (None, None)
    first = put_versioned_record(store, "r.json", {"n": 1}, None)
    with pytest.raises(RecordChangedError):
        put_versioned_record(store, "r.json", {"n": 1.5}, None)  # it exists now
    second = put_versioned_record(store, "r.json", {"n": 2}, first)
    with pytest.raises(RecordChangedError):
        put_versioned_record(store, "r.json", {"n": 3}, first)  # a stale version
    assert get_versioned_record(store, "r.json") == ({"n": 2}, second)
    put_record(store, "plain.json", {"a": 1})
    assert get_record(store, "plain.json") == {"a": 1}


@pytest.mark.integration
def test_a_fresh_lease_refuses_a_second_supervisor_then_expires(root: str) -> None:
    """Two supervisors on two machines: the second is refused while the first renews, and
    takes the job over (a new epoch) once the lease expired; the first is then fenced."""
    first, second = _submit(root), JobDirectory(root, "job")
    a, b = new_owner(), new_owner()
    assert first.lease.acquire(a, ttl=60.0) == 1  # live for as long as this test can stall
    assert first.lease.renew(a, 1, ttl=60.0, tokens=[new_owner()])
    with pytest.raises(LeaseHeldError) as held:
        second.lease.acquire(b, ttl=2.0)
    assert 0 < held.value.wait <= 60.0
    # a restart of the first's driver, whose lease (2 s) then expires for real
    assert first.lease.advance(a, 1, ttl=2.0) == 2
    deadline = time.monotonic() + 10
    while True:
        try:
            taken = second.lease.acquire(b, ttl=2.0)
            break
        except LeaseHeldError:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.2)
    assert taken == 3
    assert not first.lease.renew(a, 2, ttl=2.0)
    with pytest.raises(LeaseLostError):
        first.lease.advance(a, 2, ttl=2.0)
    first.lease.release(a)  # not the owner: nothing happens
    assert second.lease.read().owner == b
    second.lease.release(b)
    assert second.lease.read().renewed == 0.0 and second.lease.epoch() == 3
    assert JobDirectory(root, "job").lease.acquire(a, ttl=2.0) == 4  # released: at once


@pytest.mark.integration
def test_supervisors_racing_for_a_job_one_wins(root: str) -> None:
    """Supervisors that all read the same lease (none, then an expired one) and try to take
    the job: exactly one gets the new epoch, every other one is refused."""
    _submit(root)
    owners = [new_owner() for _ in range(CONTENDERS)]

    def take(index: int) -> int:  # a TTL no stall of this machine outlasts: no loser may
        return JobDirectory(root, "job").lease.acquire(owners[index], ttl=600.0)  # see expiry

    outcomes = _race(CONTENDERS, swaps, take)
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, int)]
    assert len(winners) == 1, outcomes
    assert outcomes[winners[0]] == 1
    assert all(isinstance(o, LeaseHeldError) for i, o in enumerate(outcomes) if i != winners[0])
    lease = JobDirectory(root, "job").lease.read()
    assert lease is not None and lease.owner == owners[winners[0]] and lease.epoch == 1

    expired = dataclasses.replace(lease, renewed=time.time() - 3600)  # the winner died long ago
    put_record(SnapshotStore(f"{root}/job"), LEASE_RECORD, expired.to_record())
    outcomes = _race(CONTENDERS, swaps, take)
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, int)]
    assert len(winners) == 1, outcomes
    assert outcomes[winners[0]] == 2
    assert JobDirectory(root, "job").lease.read().owner == owners[winners[0]]


@pytest.mark.integration
def test_record_updates_are_never_lost(root: str) -> None:
    """Read-modify-writes of the job record that all read the same version: every update's
    fields survive (a loser of the swap applies its changes again to the record as it is
    now), as they would under the local lock."""
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

    jobdir = JobDirectory(root, "job")
    with jobdir.update() as outer:
        outer.run += 1
        with JobDirectory(root, "job").update() as inner:  # another writer meanwhile
            inner.restarts += 1
    record = jobdir.load()
    assert (record.run, record.restarts) == (1, 1)


@pytest.mark.integration
def test_a_fenced_run_cannot_write_the_shared_state(root: str) -> None:
    """On S3 the state of every epoch is one prefix; a run's store is anchored to its epoch
    and refuses to write or delete once the lease moved on, while the new owner sees
    everything the old one wrote before."""
    jobdir = _submit(root)
    owner = new_owner()
    epoch = jobdir.lease.acquire(owner, ttl=20.0)
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
    with pytest.raises(FencedError), jobdir.update(jobdir.fence(epoch)):
        pass
    new_state = state_dir(jobdir.path, new_epoch)
    new = SnapshotStore(f"{new_state}/store", anchor=new_state)
    assert new.read("sinks/s/decisions/000000000001") == b"decided before the take-over"
    assert not new.exists("sinks/s/decisions/000000000002")
    new.write("sinks/s/decisions/000000000002", b"the new owner's")
    assert old.read("sinks/s/decisions/000000000002") == b"the new owner's"  # reads: fine


@pytest.mark.integration
def test_checkpoint_and_verification_on_s3(root: str, s3_bucket: S3Bucket) -> None:
    """Spark's checkpoint files are read from S3 (through an epoch's name too), and
    verification catches a changed commit log entry."""
    jobdir = _submit(root)
    epoch = jobdir.lease.acquire(new_owner())
    client = s3_bucket.client()
    entries = {"offsets/0": b"v1\n{}\n{}", "offsets/1": b"v1\n{}\n{}", "commits/0": b"v1\n{}"}
    for name, body in entries.items():
        client.put_object(
            Bucket=s3_bucket.name, Key=f"snapshots/job/state/checkpoint/{name}", Body=body
        )
    checkpoint = Checkpoint(f"{state_dir(jobdir.path, epoch)}/checkpoint")
    assert checkpoint.spark_location == f"s3a://{s3_bucket.name}/snapshots/job/state/checkpoint"
    assert checkpoint.batches("offsets") == [0, 1] and checkpoint.batches("commits") == [0]
    assert checkpoint.read("commits/0") == b"v1\n{}" and checkpoint.read("commits/1") is None
    assert checkpoint.exists("offsets/1") and not checkpoint.exists("commits/1")

    digests = {
        log: hashlib.sha256(entries[f"{log}/0"]).hexdigest() for log in ("offsets", "commits")
    }
    jobdir.store.write_json("checkpoint/000000000000", digests)
    with jobdir.update() as record:
        record.progress = {"batch": 0}
    assert verify_job(jobdir) == []
    client.put_object(
        Bucket=s3_bucket.name, Key="snapshots/job/state/checkpoint/commits/0", Body=b"v1\n{x}"
    )
    assert verify_job(jobdir) == ["Spark's commits log entry for batch 0 is corrupt"]
    client.delete_object(Bucket=s3_bucket.name, Key="snapshots/job/state/checkpoint/commits/0")
    assert "no commit log" in verify_job(jobdir)[0]


@pytest.mark.integration
def test_jobs_are_listed_and_cancelled_on_s3(root: str, s3_bucket: S3Bucket) -> None:
    _submit(root, "one")
    _submit(root, "two")
    assert [r.name for r in jobs.list_jobs(root)] == ["one", "two"]
    two = JobDirectory(root, "two")
    two.store.write("k", b"v")
    two.delete_snapshots()
    assert s3_bucket.keys("snapshots/two/state/") == []
    assert two.exists()
    with pytest.raises(JobError, match="no job named"):
        JobDirectory(root, "three").load()


def _cursor_case(job_path: str, put: Callable[[str, bytes], None]) -> None:
    """The acknowledging source's view of Spark's commit log, on any file system."""
    from epochal.parts.job_context import JobContext
    from epochal.spark.common import Part
    from epochal.spark.sources import CommitLogCursor

    context = JobContext(job="job", job_dir=job_path, lease_epoch=4, supervised=True)
    cursor = CommitLogCursor(Part("jms", {}, "src-1", context))
    assert cursor.latest() is None  # no checkpoint yet

    def batch(number: int, seq: int) -> None:
        offsets = [{"seq": seq * 10, "source": "other"}, {"seq": seq, "source": "src-1"}]
        put(f"offsets/{number}", b"v1\n{}\n" + b"\n".join(json.dumps(o).encode() for o in offsets))
        put(f"commits/{number}", b'v1\n{"nextBatchWatermarkMs":0}')

    batch(0, 1)
    assert cursor.latest() == {"seq": 1, "source": "src-1"}
    batch(1, 3)
    batch(2, 4)
    assert cursor.latest() == {"seq": 4, "source": "src-1"}
    assert cursor.latest() == {"seq": 4, "source": "src-1"}


def test_commit_log_cursor_on_local_disk(tmp_path: Path) -> None:
    job = tmp_path / "job"
    checkpoint = job / "epochs" / "4" / "checkpoint"

    def put(name: str, data: bytes) -> None:
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).write_bytes(data)

    _cursor_case(str(job), put)


@pytest.mark.integration
def test_commit_log_cursor_on_s3(root: str, s3_bucket: S3Bucket) -> None:
    client = s3_bucket.client()

    def put(name: str, data: bytes) -> None:
        key = f"snapshots/job/state/checkpoint/{name}"
        client.put_object(Bucket=s3_bucket.name, Key=key, Body=data)

    _cursor_case(f"{root}/job", put)


@pytest.mark.integration
def test_a_missing_bucket_is_a_clear_error(s3_env: None) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        JobDirectory("s3://it-no-such-bucket-for-epochal/snapshots", "job").load()


def test_record_envelope_is_the_same_everywhere(tmp_path: Path) -> None:
    """Records written locally and on S3 share one format (a checksum over the body)."""
    store = SnapshotStore(str(tmp_path))
    put_record(store, "r.json", {"a": 1})
    envelope = json.loads((tmp_path / "r.json").read_text())
    assert json.loads(envelope["body"]) == {"a": 1}
    assert envelope["sha256"] == hashlib.sha256(envelope["body"].encode()).hexdigest()


@pytest.fixture(autouse=True)
def _fresh_clients() -> Iterator[None]:
    """Clients are cached per process and settings; a test's environment makes its own."""
    yield
    objectstore._CLIENTS.clear()
