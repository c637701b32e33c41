"""epochal's guarantees on a real Spark cluster with its snapshots on an object store.

Kafka → Spark standalone cluster (a master, two workers) → PostgreSQL, exactly-once, with
``--snapshot-dir s3://…`` (SeaweedFS): the job record, the lease, the snapshot store and
Spark's checkpoint (``s3a://``) all live on S3; only driver logs and run records are on the
supervisor's local disk. An independent reader counts the table by record ID at the end.

1. One job run goes through what clusters see:
   - a second supervisor, in another process with its own local disk ("another machine"),
     is refused while the first one's lease is fresh;
   - a worker is killed (SIGKILL, with its executor and Python workers) while one of the
     job's tasks runs on it: Spark runs the task again on the other worker, the job goes
     on; the worker is started again and rejoins;
   - the driver's whole process group is killed: the supervisor starts a new driver at a
     new lease epoch, which recovers from the checkpoint and the store on S3.
2. Split-brain protection: the driver and one of the two workers are killed; the restarts
   on half of the cluster are refused (QuorumNotMet) and commit nothing, until the worker
   is back; then the job completes.

Every one: 0 lost, 0 duplicated, no prepared transaction left in PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from epochal import JobStatus
from epochal.state.layout import LOCAL_DIR_ENV
from integration.cluster.conftest import ClusterJob, elapsed, python_env
from integration.harness import wait_until
from integration.harness.spark_cluster import SparkCluster

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
RESUME = [sys.executable, "-m", "epochal", "jobs", "resume"]


def _kill_driver(job: ClusterJob) -> dict[str, Any]:
    """SIGKILL the active driver's process group (its Python, its JVM, its PySpark
    daemons), as if its machine died; the driver entry of the record before the kill."""
    driver = dict(job.record().driver)
    assert driver.get("pid"), f"no active driver to kill: {job}"
    os.killpg(int(driver["pid"]), signal.SIGKILL)
    return driver


def _task_on(job: ClusterJob, worker_pid: int, from_batch: int) -> dict[str, Any] | None:
    """A task attempt that runs now (started, not ended) in the marking step on the
    executor of the worker with ``worker_pid``."""
    ended = {(m["batch"], m["partition"], m["attempt"], m["pid"]) for m in job.end_markers()}
    for marker in job.start_markers():
        key = (marker["batch"], marker["partition"], marker["attempt"], marker["pid"])
        if worker_pid in marker["chain"] and key not in ended and marker["batch"] >= from_batch:
            return marker
    return None


def _task_running(job: ClusterJob, from_batch: int, lost_worker: int) -> dict[str, Any] | None:
    """A task attempt of batch ``from_batch`` or later that runs now (started, not ended) in
    the marking step, on a worker other than the lost one (whose tasks never end)."""
    ended = {(m["batch"], m["partition"], m["attempt"], m["pid"]) for m in job.end_markers()}
    for marker in job.start_markers():
        key = (marker["batch"], marker["partition"], marker["attempt"], marker["pid"])
        alive = lost_worker not in marker["chain"]
        if alive and key not in ended and marker["batch"] >= from_batch:
            return marker
    return None


def _assert_exactly_once(job: ClusterJob, record: Any) -> None:
    assert record.status == JobStatus.COMPLETED, f"{record.failure}\n{job}"
    lost, duplicated = job.counted()
    assert not lost, f"lost {len(lost)} records {lost[:10]}: {job}"
    assert not duplicated, f"duplicated {len(duplicated)} records {list(duplicated)[:10]}"
    assert job.sink.in_doubt() == [], "prepared transactions left in PostgreSQL"


def _assert_state_on_s3(job: ClusterJob) -> None:
    """The job's state is on the object store, at its one shared prefix; nothing leaked to
    a local path named after the URI."""
    prefix = f"snapshots/{job.name}/"
    keys = job.bucket.keys(prefix)
    assert f"{prefix}job.json" in keys and f"{prefix}lease.json" in keys
    assert any(k.startswith(f"{prefix}state/checkpoint/commits/") for k in keys), keys[:20]
    assert any("/state/store/sinks/" in k and "/decisions/" in k for k in keys), keys[:20]
    assert not [k for k in keys if k.startswith(f"{prefix}epochs/")], "state outside state/"
    assert not Path(ROOT, "s3:").exists() and not Path("s3:").exists()
    assert job.job is not None and job.job.verify() == []


def test_exactly_once_through_a_lost_worker_and_a_killed_driver(
    cluster_job: Callable[..., ClusterJob], spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    spark_cluster.require_faults()
    job = cluster_job(records=1800, per_batch=100, task_seconds=0.3)  # batches to spare
    notes: list[str] = []
    started = time.monotonic()
    job.start()
    job.wait_for(lambda r: r.progress.get("batch", -1) >= 0, "the first batch", 300)
    notes.append(f"first batch committed after {elapsed(started)}")
    owner = job.jobdir.lease.read().owner

    # -- another supervisor, another "machine": refused while the lease is fresh ------------
    second = subprocess.Popen(
        [*RESUME, job.name, "--snapshot-dir", job.config.snapshot_dir],
        env=python_env(**{LOCAL_DIR_ENV: str(tmp_path / "host-b")}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )

    # -- a worker lost while a task of the job runs on it -------------------------------------
    victim = spark_cluster.workers[1]
    victim_pid = victim.pid
    assert victim_pid is not None
    task = job.wait_for(
        lambda r: _task_on(job, victim_pid, from_batch=1), "a task on worker 1", 300
    )
    spark_cluster.kill_worker(1)
    wait_until(lambda: spark_cluster.alive_workers == 1, 30, "the master to drop worker 1")
    lost_at = time.monotonic()

    def rerun() -> dict[str, Any] | None:
        for marker in job.end_markers():
            same = (marker["batch"], marker["partition"]) == (task["batch"], task["partition"])
            if same and victim_pid not in marker["chain"]:
                return marker
        return None

    again = job.wait_for(lambda r: rerun(), "the lost task to run again elsewhere", 180)
    assert again["attempt"] > task["attempt"], (task, again)
    notes.append(
        f"worker 1 killed in batch {task['batch']} (partition {task['partition']}, attempt "
        f"{task['attempt']}); attempt {again['attempt']} finished on worker 0 "
        f"{elapsed(lost_at)} later"
    )
    spark_cluster.start_worker(1)

    # -- the refused supervisor ----------------------------------------------------------------
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 2, output
    assert "is run by another supervisor" in output, output
    assert job.jobdir.lease.read().owner == owner
    notes.append("a second supervisor was refused while the lease was fresh")

    # -- the driver killed in the middle of a batch -------------------------------------------
    # (with a task of an uncommitted batch running, so the new driver has that batch to
    # commit however few batches the job had left when it got here)
    at = job.batch()
    running = job.wait_for(
        lambda r: _task_running(job, max(at, r.progress.get("batch", -1)) + 1, victim_pid),
        "a task of a batch after the last committed one",
        180,
    )
    killed = _kill_driver(job)
    notes.append(f"driver killed while batch {running['batch']} ran")
    killed_at = time.monotonic()
    restarted = job.wait_for(
        lambda r: next(
            (
                run
                for run in r.runs
                if int(run.get("epoch", 0)) > int(killed["epoch"]) and run.get("first_batch_at")
            ),
            None,
        ),
        "a new driver (a new lease epoch) to commit a batch",
        300,
    )
    notes.append(
        f"driver killed at epoch {killed['epoch']}; epoch {restarted['epoch']} committed "
        f"batch {restarted['first_batch']} {elapsed(killed_at)} later"
    )

    record = job.join(600)
    notes.append(f"job done after {elapsed(started)}")
    _assert_exactly_once(job, record)
    assert record.restarts >= 1
    assert next(r["kind"] for r in record.runs if r["epoch"] > killed["epoch"]) == "cold"
    _assert_state_on_s3(job)
    assert Path(job.jobdir.logs).is_dir() and str(tmp_path) in job.jobdir.logs
    print("\n".join(notes))


def test_a_restart_on_half_the_cluster_waits_for_the_quorum(
    cluster_job: Callable[..., ClusterJob],
    spark_cluster: SparkCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark_cluster.require_faults()
    monkeypatch.setenv("EPOCHAL_QUORUM_WAIT_SECONDS", "4")
    job = cluster_job(
        records=900,
        per_batch=100,
        task_seconds=0.3,
        split_brain_protection=True,
        max_restarts=20,
        # a driver on half of the cluster starts without waiting for the other executor
        spark_conf={"spark.scheduler.maxRegisteredResourcesWaitingTime": "3s"},
    )
    notes: list[str] = []
    job.start()
    job.wait_for(lambda r: r.progress.get("batch", -1) >= 1, "the first batches", 300)
    assert job.record().original_executors == 2

    spark_cluster.kill_worker(1)
    _kill_driver(job)
    at = job.batch()
    killed_at = time.monotonic()
    refused = job.wait_for(
        lambda r: "QuorumNotMet" in (r.failure or "") and r,
        "a restart refused for want of the quorum",
        240,
    )
    assert "first ran with 2 executors" in (refused.failure or "")
    notes.append(f"restart refused {elapsed(killed_at)} after the kill: {refused.failure}")
    assert job.batch() == at, "a batch was committed on half of the cluster"

    spark_cluster.start_worker(1)
    back_at, back_wall = time.monotonic(), time.time()
    record = job.join(600)
    _assert_exactly_once(job, record)
    assert job.batch() > at
    assert any(r.get("first_batch_at", 0) > back_wall for r in record.runs), record.runs
    notes.append(f"quorum back: job completed {elapsed(back_at)} after the worker rejoined")
    print("\n".join(notes))
