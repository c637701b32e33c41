"""Job records, the job lease (fencing), listing, and cancel/suspend requests."""

from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochal.base import processes
from epochal.base.processes import RUN_TOKEN_ENV, new_run_token, processes_of, python_workers
from epochal.config import JobConfig
from epochal.control.job_requests import request, submit
from epochal.parts.job_context import JobContext
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus, list_jobs
from epochal.state.layout import JOB_RECORD, LEASE_RECORD
from epochal.state.lease.record import LEASE_TTL, new_owner
from epochal.state.lease.swaps import LeaseHeldError, LeaseLostError
from epochal.state.locks import JobError
from epochal.state.store import StateMovedError, get_record, put_record
from epochal_sdk.errors import FencedError

# `epochal.state.jobs` as an attribute is the `jobs()` function of epochal/__init__.py, which hides
# the module (see test_the_jobs_module_is_reachable_as_an_attribute)
JOBS = importlib.import_module("epochal.state.jobs")


@pytest.fixture
def snapshots(tmp_path: Path) -> str:
    return str(tmp_path / "snapshots")


def record(name: str, snapshot_dir: str, **kwargs) -> JobRecord:
    return JobRecord(name, "jobs:build", JobConfig(snapshot_dir=snapshot_dir).to_dict(), **kwargs)


def saved(snapshots: str, name: str = "orders", **kwargs) -> JobDirectory:
    jobdir = JobDirectory(snapshots, name)
    jobdir.save(record(name, snapshots, **kwargs))
    return jobdir


# -- records --------------------------------------------------------------------------------


def test_a_job_created_anew_gets_a_new_incarnation_and_its_runs_keep_it(snapshots: str) -> None:
    config = JobConfig(snapshot_dir=snapshots)
    first = submit("orders", "jobs:build", config).load().incarnation
    assert first and first == submit("orders", "jobs:build", config).load().incarnation
    with JobDirectory(snapshots, "orders").update() as current:  # a run keeps it
        current.run += 1
    assert JobDirectory(snapshots, "orders").load().incarnation == first
    replaced = submit("orders", "jobs:build", config, replace=True).load().incarnation
    assert replaced and replaced != first
    request(JobDirectory(snapshots, "orders"), "cancel")
    again = submit("orders", "jobs:build", config).load().incarnation
    assert again not in ("", first, replaced)


def test_a_job_recorded_without_an_incarnation_keeps_ids_without_one(snapshots: str) -> None:
    jobdir = saved(snapshots)
    data = get_record(jobdir.files, JOB_RECORD)
    del data["incarnation"]
    put_record(jobdir.files, JOB_RECORD, data)
    assert jobdir.load().incarnation == ""
    with jobdir.update() as current:
        current.run += 1
    assert jobdir.load().incarnation == ""


def test_save_and_load(snapshots: str) -> None:
    jobdir = JobDirectory(snapshots, "orders-daily_2")
    assert not jobdir.exists()
    rec = record("orders-daily_2", snapshots, progress={"batch": 4})
    before = time.time()
    jobdir.save(rec)
    assert jobdir.exists()
    loaded = jobdir.load()
    assert loaded.name == "orders-daily_2"
    assert loaded.target == "jobs:build"
    assert loaded.status is JobStatus.SUBMITTED
    assert loaded.progress == {"batch": 4}
    assert loaded.updated >= before
    assert loaded.job_config == JobConfig(snapshot_dir=snapshots)
    assert jobdir.path == f"{snapshots}/orders-daily_2"
    # never leased: the state of epoch 0
    assert jobdir.checkpoint == f"{snapshots}/orders-daily_2/epochs/0/checkpoint"
    assert jobdir.store.root == f"{snapshots}/orders-daily_2/epochs/0/store"
    assert os.path.isfile(f"{snapshots}/orders-daily_2/job.json")


def test_record_json_round_trip(snapshots: str) -> None:
    rec = record("j", snapshots, status=JobStatus.RUNNING, run=3, failure="x")
    data = rec.to_json()
    assert data["status"] == "RUNNING"
    assert JobRecord.from_json(data) == rec


def test_update_writes_the_change(snapshots: str) -> None:
    jobdir = saved(snapshots)
    with jobdir.update() as rec:
        rec.status = JobStatus.RUNNING
        rec.run += 1
    loaded = jobdir.load()
    assert loaded.status is JobStatus.RUNNING
    assert loaded.run == 1
    assert not os.path.exists(os.path.join(jobdir.path, ".record.lock"))


def test_update_that_fails_writes_nothing_and_unlocks(snapshots: str) -> None:
    jobdir = saved(snapshots)
    with pytest.raises(RuntimeError), jobdir.update() as rec:
        rec.status = JobStatus.FAILED
        raise RuntimeError("boom")
    assert jobdir.load().status is JobStatus.SUBMITTED
    with jobdir.update() as rec:  # not left locked
        rec.run = 5
    assert jobdir.load().run == 5


def test_update_breaks_a_stale_lock(snapshots: str) -> None:
    jobdir = saved(snapshots)
    lock = os.path.join(jobdir.path, ".record.lock")
    open(lock, "w").close()
    old = time.time() - 60
    os.utime(lock, (old, old))  # left by a killed process
    with jobdir.update() as rec:
        rec.run = 2
    assert jobdir.load().run == 2


def test_load_of_an_unknown_job(snapshots: str) -> None:
    with pytest.raises(JobError) as info:
        JobDirectory(snapshots, "nope").load()
    message = str(info.value)
    assert f"no job named 'nope' in {snapshots}" in message
    assert "epochal jobs list" in message


@pytest.mark.parametrize("name", ["", "a b", "a/b", "../etc", "a.b", "job:1", "x\n"])
def test_invalid_job_names(snapshots: str, name: str) -> None:
    with pytest.raises(JobError) as info:
        JobDirectory(snapshots, name)
    assert f"job name {name!r} is not allowed" in str(info.value)
    assert "letters, digits, '-' and '_'" in str(info.value)


def test_job_status_finished() -> None:
    finished = {s for s in JobStatus if s.finished}
    assert finished == {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}


def test_list_jobs(snapshots: str) -> None:
    assert list_jobs(snapshots) == []
    saved(snapshots, "second", created=200.0)
    saved(snapshots, "first", created=100.0)
    os.makedirs(f"{snapshots}/not-a-job/checkpoint")
    os.makedirs(f"{snapshots}/bad.name")
    Path(snapshots, "stray-file").write_text("x")
    assert [r.name for r in list_jobs(snapshots)] == ["first", "second"]


# -- lease ----------------------------------------------------------------------------------


def test_acquire_increments_the_epoch(snapshots: str) -> None:
    jobdir = saved(snapshots)
    owner = new_owner()
    assert jobdir.lease.read() is None
    assert jobdir.lease.epoch() == 0
    assert jobdir.lease.acquire(owner) == 1
    assert jobdir.lease.epoch() == 1
    assert jobdir.lease.acquire(owner) == 2  # the same owner may take it again
    lease = jobdir.lease.read()
    assert lease.owner == owner
    assert lease.pid == os.getpid()
    assert lease.host == socket.gethostname()
    assert lease.age() < 60


def test_a_second_owner_is_refused_while_the_lease_is_fresh(snapshots: str) -> None:
    jobdir = saved(snapshots)
    first, second = new_owner(), new_owner()
    assert first != second
    jobdir.lease.acquire(first)
    with pytest.raises(JobError) as info:
        jobdir.lease.acquire(second)
    message = str(info.value)
    assert f"pid {os.getpid()} on {socket.gethostname()}" in message
    assert "lease epoch 1" in message
    assert "--force" in message
    assert jobdir.lease.read().owner == first
    assert jobdir.lease.epoch() == 1


def test_force_takes_the_lease_and_fences_the_old_owner(snapshots: str) -> None:
    jobdir = saved(snapshots)
    first, second = new_owner(), new_owner()
    epoch = jobdir.lease.acquire(first)
    assert jobdir.lease.renew(first, epoch) is True
    taken = jobdir.lease.acquire(second, force=True)
    assert taken == epoch + 1
    assert jobdir.lease.renew(first, epoch) is False
    assert jobdir.lease.renew(second, taken) is True
    assert jobdir.lease.renew(second, epoch) is False  # a stale epoch of the same owner
    assert jobdir.lease.read().owner == second


def test_an_expired_lease_can_be_taken(snapshots: str) -> None:
    jobdir = saved(snapshots)
    first, second = new_owner(), new_owner()
    jobdir.lease.acquire(first)
    lease = dataclasses.replace(jobdir.lease.read(), renewed=time.time() - LEASE_TTL - 1)
    put_record(jobdir.files, LEASE_RECORD, lease.to_record())
    assert jobdir.lease.acquire(second) == 2
    assert jobdir.lease.renew(first, 1) is False


def test_the_lease_carries_its_own_ttl(snapshots: str) -> None:
    jobdir = saved(snapshots)
    jobdir.lease.acquire(new_owner(), ttl=2.0)
    assert jobdir.lease.read().ttl == 2.0
    lease = dataclasses.replace(jobdir.lease.read(), renewed=time.time() - 2.5)
    put_record(jobdir.files, LEASE_RECORD, lease.to_record())
    assert jobdir.lease.acquire(new_owner()) == 2


def test_taking_the_lease_over_moves_the_state_to_the_new_epoch(snapshots: str) -> None:
    """The zombie's view: its state directory (and so every path it holds) is gone once
    another owner took over; what it wrote before is in the new owner's state."""
    jobdir = saved(snapshots)
    first, second = new_owner(), new_owner()
    epoch = jobdir.lease.acquire(first)
    zombie = JobContext(job="orders", job_dir=jobdir.path, lease_epoch=epoch, supervised=True)
    zombie_store = zombie.store("test")
    zombie_store.write_json("sinks/s/decisions/000000000001", {"by": "zombie, before"})
    os.makedirs(f"{jobdir.checkpoint}/commits")
    Path(jobdir.checkpoint, "commits", "1").write_text("v1")
    zombie.check_fence("deciding")  # still the owner

    taken = jobdir.lease.acquire(second, force=True)

    assert taken == epoch + 1
    assert jobdir.checkpoint == f"{jobdir.path}/epochs/{taken}/checkpoint"
    assert Path(jobdir.checkpoint, "commits", "1").read_text() == "v1"
    assert jobdir.store.read_json("sinks/s/decisions/000000000001") == {"by": "zombie, before"}
    assert sorted(os.listdir(f"{jobdir.path}/epochs")) == [str(taken)]
    with pytest.raises(FencedError, match=f"holds lease epoch {epoch}.*at epoch {taken}"):
        zombie.check_fence("deciding batch 2")
    with pytest.raises(StateMovedError):
        zombie_store.write_json("sinks/s/decisions/000000000002", {"by": "zombie, after"})
    assert not jobdir.store.exists("sinks/s/decisions/000000000002")
    JobContext(job="orders", job_dir=jobdir.path, lease_epoch=taken, supervised=True).check_fence(
        "the new owner decides"
    )


def test_a_dead_owner_on_this_host_is_taken_over_at_once(snapshots: str) -> None:
    """The seeds' split-brain rule: the old one stops before the new one starts. A
    supervisor known dead (same host, its pid gone) is not waited for; what is left of its
    driver run (processes carrying its token) is killed before the new epoch starts."""
    jobdir = saved(snapshots)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    token = new_run_token()
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, RUN_TOKEN_ENV: token},
    )
    try:
        jobdir.lease.acquire(new_owner())
        lease = dataclasses.replace(jobdir.lease.read(), pid=dead.pid, tokens=(token,))
        put_record(jobdir.files, LEASE_RECORD, lease.to_record())
        assert jobdir.lease.takeover_wait(lease) == 0
        assert jobdir.lease.acquire(new_owner()) == 2  # no wait, no --force
        assert orphan.wait(10) == -signal.SIGKILL
        assert processes_of(token) == []
    finally:
        orphan.kill()


def test_a_live_owner_elsewhere_must_expire(snapshots: str) -> None:
    jobdir = saved(snapshots)
    jobdir.lease.acquire(new_owner())
    lease = dataclasses.replace(jobdir.lease.read(), host="another-machine", pid=1)
    put_record(jobdir.files, LEASE_RECORD, lease.to_record())
    with pytest.raises(LeaseHeldError) as info:
        jobdir.lease.acquire(new_owner())
    assert 0 < info.value.wait <= LEASE_TTL


def test_advance_epoch_keeps_the_owner_and_fences_its_previous_driver(snapshots: str) -> None:
    jobdir = saved(snapshots)
    owner = new_owner()
    epoch = jobdir.lease.acquire(owner)
    jobdir.store.write_json("k", {"v": 1})
    assert jobdir.lease.advance(owner, epoch) == epoch + 1
    assert jobdir.store.read_json("k") == {"v": 1}
    assert jobdir.lease.read().owner == owner
    with pytest.raises(LeaseLostError):
        jobdir.lease.advance(owner, epoch)  # a stale epoch
    with pytest.raises(LeaseLostError):
        jobdir.lease.advance(new_owner(), epoch + 1)


def test_release_keeps_the_epoch_and_frees_the_lease(snapshots: str) -> None:
    jobdir = saved(snapshots)
    first, second = new_owner(), new_owner()
    jobdir.lease.acquire(first)
    jobdir.lease.release(second)  # not the owner: nothing happens
    assert jobdir.lease.read().renewed > 0
    jobdir.lease.release(first)
    assert jobdir.lease.read().renewed == 0.0
    assert jobdir.lease.epoch() == 1
    assert jobdir.lease.acquire(second) == 2


# -- requests without a live supervisor ------------------------------------------------------


def fill_snapshots(jobdir: JobDirectory) -> None:
    os.makedirs(f"{jobdir.checkpoint}/commits")
    Path(jobdir.checkpoint, "commits", "0").write_text("v1")
    jobdir.store.write_json("sinks/s/done/000000000000", {"batch": 0})
    os.makedirs(f"{jobdir.path}/faults")


def test_cancel_without_a_live_lease(snapshots: str) -> None:
    jobdir = saved(snapshots, status=JobStatus.SUSPENDED)
    fill_snapshots(jobdir)
    final = request(jobdir, "cancel")
    assert final.status is JobStatus.CANCELLED
    assert final.requested is None
    assert jobdir.load().status is JobStatus.CANCELLED
    assert not os.path.exists(jobdir.checkpoint)
    assert not os.path.exists(f"{jobdir.path}/store")
    assert not os.path.exists(f"{jobdir.path}/faults")
    assert jobdir.exists()  # the record stays


def test_suspend_without_a_live_lease(snapshots: str) -> None:
    jobdir = saved(snapshots, status=JobStatus.RESTARTING)
    fill_snapshots(jobdir)
    final = request(jobdir, "suspend")
    assert final.status is JobStatus.SUSPENDED
    assert final.requested is None
    assert jobdir.store.exists("sinks/s/done/000000000000")  # snapshots are kept


def test_requests_with_a_live_lease_are_left_to_the_supervisor(snapshots: str) -> None:
    jobdir = saved(snapshots, status=JobStatus.RUNNING)
    fill_snapshots(jobdir)
    jobdir.lease.acquire(new_owner())
    final = request(jobdir, "cancel")
    assert final.status is JobStatus.RUNNING
    assert final.requested == "cancel"
    assert jobdir.store.exists("sinks/s/done/000000000000")


def test_a_released_lease_is_not_live(snapshots: str) -> None:
    jobdir = saved(snapshots, status=JobStatus.RUNNING)
    owner = new_owner()
    jobdir.lease.acquire(owner)
    jobdir.lease.release(owner)
    assert request(jobdir, "suspend").status is JobStatus.SUSPENDED


def test_suspend_of_a_finished_job_is_refused(snapshots: str) -> None:
    jobdir = saved(snapshots, status=JobStatus.COMPLETED)
    with pytest.raises(JobError, match="job 'orders' is COMPLETED; nothing to suspend"):
        request(jobdir, "suspend")
    assert jobdir.load().requested is None
    assert request(jobdir, "cancel").status is JobStatus.CANCELLED


def test_lease_record_is_a_checked_record(snapshots: str) -> None:
    jobdir = saved(snapshots)
    jobdir.lease.acquire(new_owner())
    assert get_record(jobdir.files, "lease.json")["epoch"] == 1


def test_the_jobs_module_is_reachable_as_an_attribute() -> None:
    import epochal
    import epochal.state.jobs as jobs_module

    assert jobs_module is JOBS
    assert epochal.state.jobs.JobDirectory is JOBS.JobDirectory


def test_python_workers_are_the_runs_pyspark_processes_not_its_jvms() -> None:
    """The kit's and the soak's "kill a Python worker" must not hit a JVM: a driver's or an
    executor's class path names pyspark too."""
    token = new_run_token()
    env = {**os.environ, RUN_TOKEN_ENV: token}
    sleep = "import time; time.sleep(60)"
    worker = subprocess.Popen([sys.executable, "-c", sleep, "pyspark.daemon"], env=env)
    jvm_like = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 60", "-cp", "/site-packages/pyspark/jars/*"], env=env
    )
    try:
        both = {worker.pid, jvm_like.pid}
        deadline = time.monotonic() + 10
        while not both <= set(processes_of(token)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert both <= set(processes_of(token))
        assert python_workers(token) == [worker.pid]
    finally:
        worker.kill()
        jvm_like.kill()
        worker.wait()
        jvm_like.wait()


def test_kill_run_leaves_a_killed_child_to_the_process_that_started_it() -> None:
    """A supervisor waits for its driver with subprocess.Popen; had kill_run() reaped the
    killed child, Popen would read exit status 0 (ECHILD) and the supervisor would take the
    killed driver for one that finished its job (the job marked COMPLETED after a kill)."""
    token = new_run_token()
    env = {**os.environ, RUN_TOKEN_ENV: token}
    children = [subprocess.Popen(["sleep", "60"], env=env) for _ in range(40)]
    try:
        deadline = time.monotonic() + 10
        while len(processes_of(token)) < len(children) and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(3):  # a child that dies before kill_run looks again must stay unreaped
            processes.kill_run(token)
        assert [child.wait(10) for child in children] == [-signal.SIGKILL] * len(children)
    finally:
        for child in children:
            child.kill()
            child.wait()
