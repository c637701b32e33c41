"""The lease of a query started without ``epochal run`` (a plain SparkSession under any
restarter): its driver takes the job's lease through a keeper process, with run numbers
from the job's record, and is fenced and stopped when another driver takes the job over.

Each "driver" here is a real process standing for a driver's JVM (a sleeping Python
process); the keeper watches it as it would a JVM, and kills it when the lease is lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from epochal.base import processes
from epochal.control.job_requests import request
from epochal.control.lease_keeper import Keeper
from epochal.control.supervisor import Supervisor
from epochal.ops.status import job_status
from epochal.parts.job_context import JobContext
from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.state.jobs import JobDirectory, JobStatus
from epochal.state.layout import JobLayout
from epochal.state.lease.record import SESSION
from epochal.state.lease.session import (
    LOST,
    STOPPED,
    WATCHER,
    DriverJvm,
    LeaseNotHeldError,
    hold,
    read_record,
    record_path,
    restart_keeper,
    update_record,
)
from epochal.state.locks import JobError
from epochal.state.store import StateMovedError
from epochal.testing import prepare_transaction
from epochal_map import MapSink
from epochal_sdk import ConfigError, ConnectorContext, Guarantee, Options, Prepared, RecoveryScope
from epochal_sdk.errors import FencedError
from epochal_sdk.ids import transaction_prefix
from epochal_sdk.schema import Field

TTL = 2.0
JOB = "plain"
SINK_ID = "map-out"
PREFIX = transaction_prefix(JOB, SINK_ID)
SCHEMA = (Field("key", "string"), Field("value", "string"))


def _wait(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def drivers() -> Iterator[Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]]:
    """Start stand-ins for driver JVMs; all are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[subprocess.Popen[bytes], DriverJvm]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        started.append(proc)
        _wait(lambda: processes.start_ticks(proc.pid), "the driver to start")
        return proc, DriverJvm(proc.pid, processes.start_ticks(proc.pid) or 0)

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()


def _context(snapshots: str, driver: DriverJvm) -> JobContext:
    """What a data source of the query builds on the driver (its options give the job)."""
    options = {"epochal.job": JOB, "epochal.snapshotDir": snapshots, "epochal.leaseTtl": "2s"}
    return JobContext.current(options).holding_the_lease(options, driver)


def _keeper(snapshots: str, driver: DriverJvm) -> int:
    return hold(JobLayout(snapshots, JOB), Guarantee.EXACTLY_ONCE, TTL, driver).keeper


def test_exactly_once_without_a_snapshot_directory_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        JobContext.current({"epochal.job": JOB}).holding_the_lease({})
    assert "epochal.snapshotDir" in str(info.value) and "at-least-once" in str(info.value)
    weaker = {"epochal.job": JOB, "epochal.guarantee": "at-least-once"}
    assert JobContext.current(weaker).holding_the_lease(weaker).lease_epoch == 0


def test_a_bad_job_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    options = {"epochal.job": "../../x", "epochal.snapshotDir": str(tmp_path)}
    with pytest.raises(ConfigError, match="not allowed"):
        JobContext.current(options)
    assert os.listdir(tmp_path) == []


def test_a_driver_holds_the_lease_and_its_successor_takes_over_at_once(
    tmp_path: Path, drivers: Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]
) -> None:
    snapshots = str(tmp_path / "snapshots")
    first_proc, first = drivers()
    context = _context(snapshots, first)
    assert (context.lease_epoch, context.run) == (1, 1)
    assert context.fence.active and context.state_dir == f"{snapshots}/{JOB}/epochs/1"
    jobdir = JobDirectory(snapshots, JOB)
    lease = jobdir.lease.read()
    assert lease is not None and lease.holder == SESSION and lease.pid == first.pid
    record = jobdir.load()  # the query wrote its own job record
    assert record.status == JobStatus.RUNNING and record.run == 1
    assert record.driver["holder"] == SESSION and record.driver["pid"] == first.pid
    assert _context(snapshots, first) == context  # every planner of the driver: the same

    shown = job_status(jobdir)
    assert shown["status"] == "RUNNING" and shown["lease"]["holder"] == SESSION

    first_proc.kill()  # the restarter's restart: the old driver is gone
    _wait(lambda: jobdir.lease.read().renewed == 0.0, "the keeper to release the lease")
    shown = job_status(jobdir)
    assert shown["status"] == "ORPHANED" and "restarter" in shown["hint"], shown
    with pytest.raises(JobError, match="start that application again"):
        Supervisor(jobdir).run()  # `epochal jobs resume`: no pipeline function to run
    for what in ("suspend", "cancel"):
        with pytest.raises(JobError, match="Stop that application"):
            request(jobdir, what)
    _, second = drivers()
    started = time.monotonic()
    successor = _context(snapshots, second)
    assert time.monotonic() - started < TTL, "a released lease is taken at once"
    assert (successor.lease_epoch, successor.run) == (2, 2)
    assert jobdir.load().runs[0]["outcome"] == "its driver ended"


def test_every_start_of_the_query_in_one_driver_after_the_first_takes_a_new_run(
    tmp_path: Path, drivers: Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]
) -> None:
    snapshots = str(tmp_path / "snapshots")
    _, driver = drivers()
    options = {"epochal.job": JOB, "epochal.snapshotDir": snapshots, "epochal.leaseTtl": "2s"}

    def start(query_run: str) -> JobContext:  # a start of the query (Spark's run id)
        return JobContext.current(options).holding_the_lease(options, driver, query_start=query_run)

    assert (_context(snapshots, driver).run, start("a").run) == (1, 1)  # the keeper's run
    assert _context(snapshots, driver).run == 1  # a batch's planner: no new run
    assert start("a").run == 1  # the same start claimed again (its foreachBatch writer)
    restarted = start("b")  # the query stopped and is started again in the same JVM
    assert (restarted.lease_epoch, restarted.run) == (1, 2)
    assert _context(snapshots, driver).run == 2  # every later planner of it: the new run
    assert start("b").run == 2
    assert start("c").run == 3
    record = JobDirectory(snapshots, JOB).load()
    assert record.run == 3 and [r["run"] for r in record.runs] == [1, 2, 3]
    assert [r.get("outcome") for r in record.runs] == [
        "its query stopped and was started again in the same driver",
        "its query stopped and was started again in the same driver",
        None,
    ]


def test_a_live_driver_keeps_the_job_from_a_second_one(
    tmp_path: Path, drivers: Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]
) -> None:
    snapshots = str(tmp_path / "snapshots")
    _, first = drivers()
    _context(snapshots, first)
    _, second = drivers()
    with pytest.raises(LeaseNotHeldError) as info:
        _context(snapshots, second)
    assert f"pid {first.pid}" in str(info.value) and "Stop the other driver" in str(info.value)
    assert JobDirectory(snapshots, JOB).lease.epoch() == 1


def test_a_paused_driver_is_fenced_then_stopped_when_another_takes_over(
    tmp_path: Path, drivers: Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]
) -> None:
    """The split brain of a restart policy: the driver is partitioned (its JVM and its
    keeper stopped), a new driver takes the job over once the lease expired and prepares a
    transaction; the old one wakes. Every step of the old run is refused (decision,
    recovery, its store), the new run's prepared transaction survives it, and the old
    keeper kills its driver. Without the fence of a plain session (epoch 0, as before) the
    zombie's recovery rolls the new driver's transaction back."""
    snapshots = str(tmp_path / "snapshots")
    options = {"path": str(tmp_path / "out.sqlite"), "map": "out", "mode": "transactional"}
    sink = MapSink(Options("map", options))
    old_proc, old = drivers()
    zombie = _context(snapshots, old)
    old_keeper = _keeper(snapshots, old)
    zombie_store = zombie.store("map")
    for pid in (old.pid, old_keeper):
        os.kill(pid, signal.SIGSTOP)

    _, new = drivers()
    owner = _context(snapshots, new)  # waits out the stopped driver's lease
    assert (owner.lease_epoch, owner.run) == (2, 2)
    newer = _prepare(sink, owner, batch=5)

    zombie_protocol = _protocol(sink, zombie)
    with pytest.raises(FencedError, match="holds lease epoch 1"):
        zombie_protocol.recover()
    with pytest.raises(FencedError):
        zombie_protocol.commit_batch(5, [_prepare(sink, zombie, batch=5)])
    with pytest.raises(StateMovedError):
        zombie_store.write_json("sinks/x/decisions/000000000005", {"by": "zombie"})
    assert newer.transaction_id in {p.transaction_id for p in sink.in_doubt(RecoveryScope(PREFIX))}

    os.kill(old_keeper, signal.SIGCONT)
    os.kill(old.pid, signal.SIGCONT)
    assert old_proc.wait(30) == -signal.SIGKILL, "the old keeper must stop its driver"
    _protocol(sink, owner).commit_batch(5, [newer])
    assert sink.in_doubt(RecoveryScope(PREFIX)) == []


def test_a_keeper_that_lost_the_lease_waits_for_the_query_fence_then_kills_as_last_resort(
    tmp_path: Path, drivers: Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]
) -> None:
    """The keeper's side of the fence that stops one query: a driver whose records a query
    fence watches (here this test, standing for the driver's fence: it notes the query
    stopped) is not killed when its lease is taken over; one whose fence does not answer
    within a quarter TTL is killed."""
    snapshots = str(tmp_path / "snapshots")
    layout = JobLayout(snapshots, JOB)
    for answers in (True, False):
        proc, driver = drivers()
        _context(snapshots, driver)
        record = record_path(layout, driver)
        held = update_record(record, **{WATCHER: os.getpid()})
        assert held is not None
        os.kill(int(held["keeper"]), signal.SIGSTOP)
        other_proc, other = drivers()
        _context(snapshots, other)  # takes the job over once the paused keeper's lease expired
        os.kill(int(held["keeper"]), signal.SIGCONT)
        _wait(lambda at=record: (read_record(at) or {}).get(LOST), "the lease marked lost")
        if answers:
            update_record(record, **{STOPPED: time.time()})
            keeper = int(held["keeper"])
            _wait(lambda pid=keeper: not processes.alive(pid), "the keeper to exit")
            assert proc.poll() is None, "the driver was killed although its query stopped"
        else:
            assert proc.wait(30) == -signal.SIGKILL, "the last resort: the driver's JVM killed"
        with pytest.raises(LeaseNotHeldError, match="this driver stopped the job's query"):
            _context(snapshots, driver)  # every later planner of the job in that driver
        proc.kill()
        other_proc.kill()  # the job's next holder in the loop takes it at once
        _wait(lambda: JobDirectory(snapshots, JOB).lease.read().renewed == 0.0, "a release")


def test_a_keeper_that_died_is_started_again_with_its_holding(
    tmp_path: Path, drivers: Callable[[], tuple[subprocess.Popen[bytes], DriverJvm]]
) -> None:
    """What the driver's query fence does when the job's keeper died alone: a keeper started
    again renews the lease at once under the same owner and epoch; the run goes on."""
    snapshots = str(tmp_path / "snapshots")
    _, driver = drivers()
    context = _context(snapshots, driver)
    record = record_path(JobLayout(snapshots, JOB), driver)
    dead = int((read_record(record) or {})["keeper"])
    os.kill(dead, signal.SIGKILL)
    _wait(lambda: not processes.alive(dead), "the keeper to die")
    jobdir = JobDirectory(snapshots, JOB)
    before = jobdir.lease.read().renewed
    started = restart_keeper(record)
    assert started and started != dead and int((read_record(record) or {})["keeper"]) == started
    _wait(lambda: jobdir.lease.read().renewed > before, "the new keeper to renew the lease")
    assert _context(snapshots, driver) == context and jobdir.lease.epoch() == 1


def _protocol(sink: MapSink, context: JobContext) -> TwoPhaseCommit:
    """The 2PC protocol as the context's driver runs it (its store, fence, run)."""
    store = context.store("map")
    return TwoPhaseCommit(
        store,
        sink,
        SINK_ID,
        PREFIX,
        run=context.run,
        fence=context.check_fence,
        lease_epoch=context.lease_epoch,
    )


def _prepare(sink: MapSink, context: JobContext, batch: int) -> Prepared:
    """A task of the context's run prepares one row."""
    task = ConnectorContext(context.job, SINK_ID, batch, 0, 0, SCHEMA, run=context.run)
    rows = pa.RecordBatch.from_pydict({"key": [f"k{context.run}"], "value": ["v"]})
    return prepare_transaction(sink, task, rows)


def test_a_lease_is_refused_where_it_cannot_be_swapped_atomically(tmp_path: Path) -> None:
    """A snapshot directory on a file system without a lock or a conditional write (here
    pyarrow's in-memory one; GCS through pyarrow alike) holds no lease: refused."""
    jobdir = JobDirectory("mock:///snapshots", JOB)
    with pytest.raises(JobError, match="cannot swap the job's lease atomically"):
        jobdir.lease.acquire("someone")
    keeper = Keeper(
        "mock:///snapshots",
        JOB,
        DriverJvm.current(),
        Guarantee.EXACTLY_ONCE,
        TTL,
        str(tmp_path / "record.json"),
    )
    assert not keeper.take()
    error = json.loads((tmp_path / "record.json").read_text())["error"]
    assert "POSIX path, on s3:// or on hdfs://" in error
