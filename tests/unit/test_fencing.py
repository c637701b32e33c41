"""The mechanisms that keep a driver from outliving its supervisor or its lease, each in a
real process that is really killed: the lease watchdog (the lease moved, the lease was not
renewed), the parent-death signal, the end of a whole driver run (PySpark-like daemons in
their own process groups included), and the failure table."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from epochal.base.processes import RUN_TOKEN_ENV, kill_run, new_run_token, processes_of
from epochal.config import JobConfig
from epochal.control.failures import FENCED, KINDS, Failure, classify, identify
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.lease.record import new_owner
from epochal.state.locks import JobError
from epochal.state.store import put_record

ROOT = Path(__file__).resolve().parents[2]

WATCHDOG = """
import os, sys, time
from epochal.driver.guards import LeaseWatchdog
from epochal.state.jobs import JobDirectory
jobdir = JobDirectory(sys.argv[1], "orders")
LeaseWatchdog(jobdir, int(sys.argv[2]), os.getppid()).start()
print("watching", flush=True)
time.sleep(60)
print("outlived the watchdog", flush=True)
"""


@pytest.fixture
def leased(tmp_path: Path) -> tuple[JobDirectory, str]:
    snapshots = str(tmp_path / "snapshots")
    jobdir = JobDirectory(snapshots, "orders")
    jobdir.save(JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict()))
    owner = new_owner()
    jobdir.lease.acquire(owner, ttl=4.0)
    return jobdir, owner


def _watch(jobdir: JobDirectory, epoch: int, token: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, jobdir.snapshot_dir, str(epoch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, RUN_TOKEN_ENV: token},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "watching"
    return proc


def test_a_driver_stops_itself_when_the_lease_moves_to_another_epoch(
    leased: tuple[JobDirectory, str],
) -> None:
    jobdir, owner = leased
    token = new_run_token()
    helper = subprocess.Popen(  # a process of the same driver run (a PySpark daemon, say)
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, RUN_TOKEN_ENV: token},
        start_new_session=True,
    )
    driver = _watch(jobdir, 1, token)
    for _ in range(3):  # renewed: it keeps running
        time.sleep(0.5)
        assert jobdir.lease.renew(owner, 1, ttl=4.0)
    assert driver.poll() is None
    jobdir.lease.acquire(new_owner(), force=True)  # another supervisor: epoch 2
    assert driver.wait(10) == -signal.SIGKILL
    assert helper.wait(10) == -signal.SIGKILL  # its whole run went with it
    assert "fenced: the job's lease moved from epoch 1 to 2" in driver.stderr.read()


def test_a_driver_stops_itself_before_its_lease_could_expire(
    leased: tuple[JobDirectory, str],
) -> None:
    """The supervisor stopped renewing (it died, or it is paused): the driver stops within
    half the time-to-live, so it is gone before anyone may take the job over."""
    jobdir, _ = leased
    driver = _watch(jobdir, 1, new_run_token())
    started = time.monotonic()
    assert driver.wait(10) == -signal.SIGKILL
    assert time.monotonic() - started < 4.0  # the ttl: gone before a take-over
    assert "was not renewed" in driver.stderr.read()


def test_a_driver_dies_with_its_supervisor(tmp_path: Path) -> None:
    """The parent-death signal: a supervisor SIGKILLed takes its driver with it at once."""
    supervisor = textwrap.dedent(
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", '''
        import os, signal, time
        from epochal.base.processes import die_with_parent
        assert die_with_parent(signal.SIGKILL)
        print(os.getpid(), flush=True)
        time.sleep(60)
        '''], stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip(), flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    driver_pid = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while _alive(driver_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(driver_pid)


def test_kill_run_ends_every_process_of_the_run_wherever_it_went() -> None:
    """PySpark's daemons put themselves in their own process groups (a killpg of the driver's
    group misses them) and their workers can be re-parented: the run token finds them all."""
    token = new_run_token()
    env = {**os.environ, RUN_TOKEN_ENV: token}
    script = textwrap.dedent(
        """
        import os, subprocess, sys, time
        os.setpgid(0, 0)  # like pyspark.daemon
        for _ in range(2):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("up", flush=True)
        time.sleep(60)
        """
    )
    daemon = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    assert daemon.stdout is not None and daemon.stdout.readline().strip() == b"up"
    assert len(processes_of(token)) == 3
    killed = kill_run(token)
    assert len(set(killed)) >= 3
    assert processes_of(token) == []
    assert processes_of(new_run_token()) == []


def test_a_stopped_process_is_killed_too() -> None:
    token = new_run_token()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, RUN_TOKEN_ENV: token},
    )
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGSTOP)
    kill_run(token)
    assert proc.wait(5) == -signal.SIGKILL


@pytest.mark.parametrize(
    ("text", "restartable", "in_place"),
    [
        # a killed driver-side source runner: Spark's own message is empty, the cause is EOF
        (
            "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception:  SQLSTATE: "
            "XXKST (no cause message)\ncaused by: java.io.EOFException: UnknownException: ",
            True,
            True,
        ),
        (
            "terminated with exception: Python worker exited unexpectedly (crashed). SQLSTATE: "
            "XXKST",
            True,
            True,
        ),
        ("epochal_sdk.errors.FencedError: this run holds lease epoch 1", True, False),
        ("epochal.state.store.StateMovedError: the state directory is gone", True, False),
        ("py4j.protocol.Py4JNetworkError: Answer from Java side is empty", True, False),
        ("[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log", True, False),
        ("ZeroDivisionError: division by zero", False, False),
        # a sink that lost its server while Spark set up the batch's writer (Spark wraps it)
        (
            "org.apache.spark.sql.AnalysisException: [PYTHON_DATA_SOURCE_ERROR] Failed to "
            "initialize Python data source writer: Traceback ...\nepochal_sdk.errors."
            "RestartableError: jdbc: lost the server [epochal:restartable]",
            True,
            True,
        ),
        ("org.apache.spark.sql.AnalysisException: [UNRESOLVED_COLUMN] nope", False, False),
        (
            "AnalysisException: Failed to initialize Python data source writer: "
            "epochal_sdk.errors.GuaranteeError: the sink cannot keep exactly-once",
            False,
            False,
        ),
    ],
)
def test_failures_are_classified_by_what_spark_raises(
    text: str, restartable: bool, in_place: bool
) -> None:
    kind = identify(text)
    assert (classify(text) is Failure.RESTARTABLE) is restartable
    assert kind.in_place is in_place


def test_a_fenced_run_is_restartable_never_fatal() -> None:
    assert FENCED.failure is Failure.RESTARTABLE
    assert KINDS[0] is FENCED  # checked first: a fence wraps no user error


def test_the_failure_table_in_the_docs_names_every_kind() -> None:
    docs = (ROOT / "docs" / "explanation" / "guarantees.md").read_text()
    for kind in KINDS:
        assert kind.name in docs, f"docs/explanation/guarantees.md lacks the failure {kind.name!r}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_lease_ttl_is_part_of_the_lease(leased: tuple[JobDirectory, str]) -> None:
    jobdir, _ = leased
    lease = jobdir.lease.read()
    assert lease.ttl == 4.0
    expired = dataclasses.replace(lease, renewed=time.time() - 5)
    put_record(jobdir.files, "lease.json", expired.to_record())
    assert jobdir.lease.takeover_wait(jobdir.lease.read()) == 0


def test_a_stale_lease_record_written_back_by_a_paused_holder_changes_nothing(
    leased: tuple[JobDirectory, str],
) -> None:
    """Holder B read the lease under the lock and was paused before it wrote its renewal; the
    lock went stale, C broke it and took the job over (epoch 2); B woke and wrote its epoch-1
    record over C's. B stays fenced, C keeps the job and writes its own record again at its
    next renewal, and the next take-over gets a new epoch, never C's again."""
    zombie, zombie_owner = leased
    stale = zombie.lease.read()
    holder = JobDirectory(zombie.snapshot_dir, "orders")
    owner = new_owner()
    assert holder.lease.acquire(owner, force=True) == 2
    put_record(zombie.files, "lease.json", stale.to_record())  # B's late write
    assert zombie.lease.read().epoch == 1
    assert not zombie.fence(1).holds(zombie.lease.read().epoch)  # B's state moved: still fenced
    assert not zombie.lease.renew(zombie_owner, 1)
    holder.fence(2).check("C's step while the stale record is there")
    assert holder.lease.renew(owner, 2)  # C's own record again
    assert holder.lease.read().held_by(owner, 2)
    assert JobDirectory(zombie.snapshot_dir, "orders").lease.acquire(new_owner(), force=True) == 3


def test_a_holder_whose_lock_was_broken_writes_nothing_and_leaves_the_new_lock(
    leased: tuple[JobDirectory, str],
) -> None:
    jobdir, _ = leased
    lock = Path(jobdir.path, ".lease.lock")
    with jobdir.locked("lease") as still_locked:
        still_locked()  # ours
        lock.write_bytes(b"another holder's token")  # broken as stale and taken meanwhile
        with pytest.raises(JobError, match="lock was taken from this process"):
            still_locked()
    assert lock.read_bytes() == b"another holder's token"
