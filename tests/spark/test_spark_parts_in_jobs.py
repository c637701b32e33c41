"""Spark's own sources and sinks count in a job's guarantee (issue 25), the mixes that need no
server: a socket source, Spark's console sink, a ``foreachBatch`` function without and with
the declaration that it is idempotent.

Supervised jobs (``Job.submit``, warm drivers of the kit's pool): the driver reads the whole
query before it starts it; a part below the job's guarantee refuses the job (FAILED, the
message names the part and what to do, no restart, no batch), a part it allows is recorded
with the guarantee it runs with, and the job's effective guarantee is the weakest. Plain
sessions (``epochal.register(spark)``, one SparkSession for the module): a query with an
epochal part is checked when it starts; under exactly-once it is refused before its first
batch, below it a warning names the part. The Kafka mixes (Spark's Kafka sink, Spark's Kafka
source into epochal's sinks) are in ``integration/kafka/test_spark_kafka_parts.py``.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epochal import Job, JobConfig, JobStatus
from epochal.base import processes
from epochal.base.fault_plan import FaultPlan
from epochal.metrics import timeline
from epochal.metrics.exposition import render_prometheus
from epochal.ops.status import job_status
from epochal.parts.records import read_parts
from epochal.parts.spark_plan import (
    IDEMPOTENT_FOREACH_BATCH,
    session_driver,
    session_verdict_path,
)
from epochal.state.jobs import JobDirectory
from epochal.state.layout import FAULTS, JobLayout
from epochal.state.lease.session import DriverJvm, hold, read_record, record_path
from epochal.state.manifests import MANIFESTS, verify_job
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_map import MapStore
from epochal_map.testing import MapSinkUnderTest
from epochal_sdk import Guarantee, TransactionId
from tests.spark.sessions import plain_session

pytestmark = pytest.mark.spark

PIPELINES = "spark_parts_pipelines"


def _config(tmp_path: Path, **changes: object) -> JobConfig:
    settings: dict[str, Any] = {
        "snapshot_dir": str(tmp_path / "snapshots"),
        "available_now": True,
        "restart_backoff": 0.2,
        "master": LOCAL,
        "spark_conf": dict(TEST_SPARK_CONF),
    }
    settings.update(changes)
    return JobConfig(**settings)


def _output(path: str) -> dict[str, str]:
    with MapStore(path) as store:
        return store.entries("output")


def _refused(name: str, pipeline: str, tmp_path: Path, map_path: str) -> str:
    """Submit an exactly-once job that must be refused at submit; its failure text."""
    record = Job.submit(name, f"{PIPELINES}:{pipeline}", _config(tmp_path)).join(300)
    assert record.status == JobStatus.FAILED, record.failure
    assert record.restarts == 0
    assert record.failure is not None and "GuaranteeError" in record.failure
    assert "the job asks for exactly-once. Refusing to start" in record.failure
    assert "--allow-downgrade" in record.failure
    assert record.progress == {}  # no batch ran
    assert _output(map_path) == {}
    return record.failure


# --- supervised jobs: refused at submit ------------------------------------------------------


def test_a_socket_source_is_refused_at_submit(tmp_path: Path, map_path: str) -> None:
    failure = _refused("socket", "socket_to_map", tmp_path, map_path)
    assert "source 'socket' (Spark's socket source (localhost:9)) can give at most none" in failure
    assert "not replayable" in failure and "--guarantee none" in failure


def test_sparks_console_sink_is_refused_at_submit(tmp_path: Path, map_path: str) -> None:
    failure = _refused("console", "map_to_console", tmp_path, map_path)
    assert "sink 'console' (Spark's console sink) can give at most none" in failure


def test_foreach_batch_is_refused_unless_allowed_and_then_runs_at_least_once(
    tmp_path: Path, map_path: str
) -> None:
    failure = _refused("undeclared", "map_to_foreach_batch", tmp_path, map_path)
    assert "sink 'foreachBatch' (a foreachBatch function) can give at most at-least-once" in (
        failure
    )
    assert f".option('{IDEMPOTENT_FOREACH_BATCH}', 'true')" in failure

    job = Job.submit(
        "downgraded", f"{PIPELINES}:map_to_foreach_batch", _config(tmp_path, allow_downgrade=True)
    )
    record = job.join(300)
    assert record.status == JobStatus.COMPLETED, record.failure
    assert len(_output(map_path)) == 200
    assert record.effective_guarantee == "at-least-once"
    sink = _spark_part(job, "sink")
    assert (sink.connector, sink.guarantee) == ("spark:foreachBatch", "at-least-once")
    assert "not declared idempotent" in sink.reason


# --- supervised jobs: what runs is recorded ----------------------------------------------------


def test_foreach_batch_declared_idempotent_runs_exactly_once_and_is_recorded(
    tmp_path: Path, map_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPOCHAL_TEST_IDEMPOTENT", "1")
    job = Job.submit("declared", f"{PIPELINES}:map_to_foreach_batch", _config(tmp_path))
    record = job.join(300)
    assert record.status == JobStatus.COMPLETED, record.failure
    assert _output(map_path) == {str(i): f"v{i}" for i in range(200)}
    assert record.effective_guarantee == "exactly-once"

    sink = _spark_part(job, "sink")
    assert (sink.connector, sink.guarantee, sink.contract) == (
        "spark:foreachBatch",
        "exactly-once",
        "spark",
    )
    assert sink.target == {"label": "a foreachBatch function, declared idempotent"}
    parts = read_parts(job.jobdir.store)
    epochal_source = [p for p in parts.values() if p.kind == "source"]
    assert [(p.connector, p.guarantee) for p in epochal_source] == [("map", "exactly-once")]

    exposition = render_prometheus(job.jobdir)
    assert (
        f'epochal_part_guarantee{{job="declared",part="{sink.part_id}",kind="sink",'
        'connector="spark:foreachBatch",guarantee="exactly-once"} 2'
    ) in exposition


def _spark_part(job: Job, kind: str) -> Any:
    """The one part record of ``kind`` that Spark's side of the query left."""
    found = [
        p for p in read_parts(job.jobdir.store).values() if p.kind == kind and ":" in p.connector
    ]
    assert len(found) == 1, found
    return found[0]


# --- plain sessions -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session() -> Iterator[Any]:
    """A plain SparkSession of this process (:func:`tests.spark.sessions.plain_session`),
    epochal's connectors registered (and with them the check of each query's parts when it
    starts)."""
    from epochal.spark.datasource import register

    pythonpath = os.environ.get("PYTHONPATH", "")
    spark = plain_session(
        "test_spark_parts_in_jobs", "ERROR", **{"spark.executorEnv.PYTHONPATH": pythonpath}
    )
    register(spark)
    yield spark
    spark.stop()


def _session_events(spark: Any, map_path: str, **job: str) -> Any:
    reader = (
        spark.readStream.format("epochal.map")
        .option("path", map_path)
        .option("map", "input")
        .option("maxRecordsPerBatch", "100")
    )
    return reader.options(**job).load().selectExpr("key", "value")


def test_a_plain_session_query_below_exactly_once_is_refused_before_its_first_batch(
    session: Any, tmp_path: Path, map_path: str
) -> None:
    snapshots = str(tmp_path / "snapshots")
    job = {
        "epochal.job": "session-job",
        "epochal.snapshotDir": snapshots,
        "epochal.guarantee": "exactly-once",
    }
    checkpoint = tmp_path / "checkpoint"
    query = (
        _session_events(session, map_path, **job)
        .writeStream.format("console")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as failed:
        query.awaitTermination()
    message = str(failed.value)
    assert "GuaranteeError" in message
    assert "sink 'console' (Spark's console sink) can give at most none" in message
    assert ".option('epochal.guarantee', 'none')" in message
    assert ".option('epochal.allowDowngrade', 'true')" in message
    assert query.recentProgress == []
    commits = checkpoint / "commits"
    assert not commits.exists() or not any(commits.iterdir())
    verdict = Path(
        session_verdict_path(JobLayout(snapshots, "session-job").path, session_driver(session))
    )
    assert verdict.exists()

    # The same driver, the same job, a query that keeps exactly-once: the check writes its
    # verdict again when it starts, so the earlier refusal is never read for it.
    done = (
        _session_events(session, map_path, **job)
        .writeStream.format("epochal.map")
        .option("path", map_path)
        .option("map", "output")
        .option("mode", "transactional")
        .options(**job)
        .option("checkpointLocation", str(tmp_path / "checkpoint-2"))
        .trigger(availableNow=True)
        .start()
    )
    done.awaitTermination()
    assert len(_output(map_path)) == 200
    assert '"refused": null' in verdict.read_text()


def test_a_plain_session_query_below_its_guarantee_runs_with_a_warning(
    session: Any, tmp_path: Path, map_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="epochal.parts.spark_plan")
    query = (
        _session_events(session, map_path, **{"epochal.guarantee": "at-least-once"})
        .writeStream.format("memory")
        .queryName("session_rows")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert session.table("session_rows").count() == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "sink 'memory' (Spark's memory sink) can give at most none" in w
        and "below the job's guarantee at-least-once" in w
        and "refused" not in w
        for w in warnings
    ), warnings


# --- plain sessions: a query started again in its driver -----------------------------------


def _counts(map_path: str, expected: int) -> tuple[int, int, list[str]]:
    """Lost and duplicated records of the map sink's output journal, and what is in doubt."""
    committed = MapSinkUnderTest(map_path).committed("transactional")
    keys = [key for key, _ in committed]
    lost = expected - len(set(keys))
    return lost, len(keys) - len(set(keys)), MapSinkUnderTest(map_path).in_doubt()


def _session_copy(session: Any, map_path: str, checkpoint: Path, **job: str) -> Any:
    """The plain-session copy query (map journal → map 'output', exactly-once), started."""
    return (
        _session_events(session, map_path, **job)
        .writeStream.format("epochal.map")
        .option("path", map_path)
        .option("map", "output")
        .option("mode", "transactional")
        .options(**job)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_a_query_started_again_in_its_driver_takes_a_new_run_and_settles_its_strays(
    session: Any, tmp_path: Path, map_path: str
) -> None:
    snapshots, checkpoint = str(tmp_path / "snapshots"), tmp_path / "checkpoint"
    job = {"epochal.job": "again", "epochal.snapshotDir": snapshots}
    # The second batch's first task dies after it prepared (its Python worker killed): the
    # query fails, the JVM lives on; the batch's other tasks are aborted, the dead task's
    # transaction is left prepared (a stray of run 1).
    failed = _session_copy(
        session, map_path, checkpoint, **job, **{"epochal.faults": "sink.after_prepare@1:worker"}
    )
    with pytest.raises(Exception, match="Python worker"):
        failed.awaitTermination()
    strays = MapSinkUnderTest(map_path).in_doubt()
    assert strays and all(TransactionId.of(s).run == 1 for s in strays), strays
    jobdir = JobDirectory(snapshots, "again")
    assert jobdir.load().run == 1

    # Started again in the same driver JVM (a Connect client's retry, a loop in the app): a
    # new run, whose start-of-run recovery rolls the stray back before the batch is replayed.
    # This run notes its batch's timeline: each task's steps, then the driver's, in order.
    timed = {**job, timeline.OPTION: "true"}
    _session_copy(session, map_path, checkpoint, **timed).awaitTermination()
    (kept,) = timeline.read(jobdir.path)
    assert kept["batch"] == 1 and kept["tasks"], kept
    driver = [kept["driver"][m] for m in ("entered", "decided", "completed", "reported")]
    for task in kept["tasks"]:
        steps = [task[m] for m in timeline.TASK_MARKS]
        assert steps == sorted(steps) and steps[-1] <= driver[0], (steps, driver)
    assert driver == sorted(driver), driver
    record = jobdir.load()
    assert record.run == 2 and jobdir.lease.epoch() == 1, record.runs
    assert record.runs[0]["outcome"] == "its query stopped and was started again in the same driver"
    with MapStore(map_path) as store:
        assert {store.transaction_state(s) for s in strays} == {"rolled_back"}
    lost, duplicated, in_doubt = _counts(map_path, 200)
    assert (lost, duplicated, in_doubt) == (0, 0, []), (lost, duplicated, in_doubt)
    # The query wrote its own job: progress, manifests, where its checkpoint is, metrics,
    # and COMPLETED once its available-now run finished the data.
    # (Spark's listener hears of the query's end after awaitTermination returned.)
    _until(lambda: job_status(jobdir)["status"] == "COMPLETED", "the job COMPLETED", 30)
    shown = job_status(jobdir)
    assert shown["progress"]["batch"] == 1 and shown["progress"]["at"] > 0, shown["progress"]
    assert shown["driver"]["checkpoint"] == str(checkpoint)
    assert verify_job(jobdir) == []
    assert jobdir.store.list(MANIFESTS), "no checkpoint manifest recorded"
    metrics = render_prometheus(jobdir)
    assert 'epochal_job_last_batch{job="again"} 1' in metrics, metrics
    assert "epochal_batch_duration_seconds" in metrics, metrics
    listed = subprocess.run(
        [sys.executable, "-m", "epochal", "jobs", "list", "--snapshot-dir", snapshots],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert re.search(r"again\s+COMPLETED .* batch 1 at \d{4}-", listed.stdout), listed.stdout
    (Path(checkpoint) / "commits" / "1").write_text("torn")
    assert any("commits log entry for batch 1 is corrupt" in p for p in verify_job(jobdir))
    protocol = (Path(jobdir.path) / "logs" / "protocol.log").read_text()
    assert (
        "recovery at the start of run 2: finished 0 decided batch(es) [], "
        f"rolled back {len(strays)}" in protocol
    ), protocol


# --- plain sessions: a graceful stop in the middle of a batch ------------------------------

#: A task of batch 1 is slowed after it wrote, before it prepares: the stop finds it there,
#: and it prepares after the driver heard of the stop (before Spark kills its worker).
SLOWED_BEFORE_PREPARE = "sink.after_write@1:slow"


def _graceful_stop_query(session: Any, tmp_path: Path, map_path: str, sink: str, **job: str) -> Any:
    """200 records in two batches of 100 into the map 'output' (exactly-once), started: an
    epochal source and data source sink (the session check settles the stopped query), or
    Spark's text file source into the map sink's ``foreachBatch`` writer (the session check
    knows nothing of that query: the writer settles its batch itself)."""
    checkpoint = str(tmp_path / f"checkpoint-{sink}")
    if sink == "data source":
        return _session_copy(session, map_path, Path(checkpoint), **job)
    import epochal

    lines = tmp_path / "lines"
    if not lines.exists():
        lines.mkdir()
        for first in (0, 100):  # a file a batch
            text = "".join(f"{i}\n" for i in range(first, first + 100))
            (lines / f"part-{first:03d}.txt").write_text(text)
    writer = epochal.foreach_batch(
        "map", path=map_path, map="output", mode="transactional", options=job
    )
    return (
        session.readStream.option("maxFilesPerTrigger", "1")
        .text(str(lines))
        .selectExpr("value AS key", "concat('v', value) AS value")
        .repartition(2)
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def _tasks_ended(session: Any, run_id: str) -> bool:
    """Whether every task of the query run ``run_id`` has ended, as Spark's status store (the
    record its UI shows, written from each task's end event) has them: a reader of its own,
    independent of what epochal waits on."""
    tracker = session.sparkContext.statusTracker()
    status = session.sparkContext._jsc.sc().statusStore()
    for job in tracker.getJobIdsForGroup(run_id):
        for stage in tracker.getJobInfo(job).stageIds:
            info = tracker.getStageInfo(stage)
            if info is None:
                continue
            tasks = status.taskList(stage, info.currentAttemptId, 10_000).iterator()
            while tasks.hasNext():
                if tasks.next().status() == "RUNNING":
                    return False
    return True


@pytest.mark.parametrize("sink", ["data source", "foreachBatch"])
def test_a_graceful_stop_leaves_nothing_in_doubt_even_a_task_that_prepares_after_it(
    session: Any, tmp_path: Path, map_path: str, sink: str
) -> None:
    """``query.stop()`` while a task of batch 1 is slowed before its prepare: Spark cancels
    the batch at once, but the task prepares a moment later. The stopped query's settling
    waits for the batch's tasks to end (:mod:`epochal.spark.task_ends`) before it rolls the
    batch back, so nothing is left in doubt; started again, the query writes every record
    once, by value. Without the wait the late prepare stays in doubt."""
    snapshots = str(tmp_path / "snapshots")
    job = {"epochal.job": "graceful", "epochal.snapshotDir": snapshots}
    faults = FaultPlan.parse(
        SLOWED_BEFORE_PREPARE, f"{JobLayout(snapshots, 'graceful').path}/{FAULTS}"
    )
    query = _graceful_stop_query(
        session, tmp_path, map_path, sink, **job, **{"epochal.faults": SLOWED_BEFORE_PREPARE}
    )
    _until(lambda: bool(faults.fired()) or not query.isActive, "batch 1's task to be slowed")
    assert faults.fired(), f"the query ended before batch 1's task was slowed: {query.exception()}"
    query.stop()
    check = session._epochal_session_check  # register()'s listener: wait for its settling
    assert check.drain(60), "the session check did not settle the stopped query in 60 s"
    _until(lambda: _tasks_ended(session, str(query.runId)), "the stopped batch's tasks to end")
    _, duplicated, in_doubt = _counts(map_path, 200)
    assert in_doubt == [], f"the graceful stop left batch 1 in doubt: {in_doubt}"
    assert duplicated == 0

    _graceful_stop_query(session, tmp_path, map_path, sink, **job).awaitTermination()
    assert _output(map_path) == {str(i): f"v{i}" for i in range(200)}
    assert _counts(map_path, 200) == (0, 0, [])


# --- plain sessions: the fence that stops one query, the keeper watched ----------------------


def _running_copy(session: Any, path: str, checkpoint: Path, **job: str) -> Any:
    """A plain-session copy query of the map at ``path`` that keeps running (10 a batch)."""
    return (
        session.readStream.format("epochal.map")
        .option("path", path)
        .option("map", "input")
        .option("maxRecordsPerBatch", "10")
        .options(**job)
        .load()
        .selectExpr("key", "value")
        .writeStream.format("epochal.map")
        .option("path", path)
        .option("map", "output")
        .option("mode", "transactional")
        .options(**job)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def _input(path: Path, first: int, count: int) -> str:
    with MapStore(str(path)) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(first, first + count)])
    return str(path)


def _until(condition: Any, what: str, seconds: float = 60.0) -> float:
    """Wait for ``condition``; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def _committed(path: str) -> int:
    return len(MapSinkUnderTest(path).committed("transactional"))


def _session_record(session: Any, snapshots: str, job: str) -> dict[str, Any]:
    path = record_path(JobLayout(snapshots, job), session_driver(session))
    found = read_record(path)
    assert found is not None, path
    return found


def test_a_lost_lease_stops_its_jobs_query_and_the_drivers_other_query_goes_on(
    session: Any, tmp_path: Path
) -> None:
    """One driver runs two exactly-once jobs; another driver takes the first job's lease
    over. The first job's query is stopped by the driver's query fence (not the JVM: the
    second job's query goes on and loses nothing), and decides nothing after the take-over.
    With the JVM killed instead, this test's own driver would die and the test fail."""
    snapshots = str(tmp_path / "snapshots")
    ttl = 8.0  # the query must stop within a quarter of it: 2 s
    first = {"epochal.job": "first", "epochal.snapshotDir": snapshots, "epochal.leaseTtl": "8s"}
    second = {**first, "epochal.job": "second"}
    a_map, b_map = _input(tmp_path / "a.sqlite", 0, 50), _input(tmp_path / "b.sqlite", 0, 50)
    a = _running_copy(session, a_map, tmp_path / "a-checkpoint", **first)
    b = _running_copy(session, b_map, tmp_path / "b-checkpoint", **second)
    _until(lambda: _committed(a_map) == 50 and _committed(b_map) == 50, "both jobs' first rows")

    # The first job's keeper is paused (a partition of it), another driver takes the job over
    # once the lease expired, the keeper wakes and finds the lease taken.
    keeper = int(_session_record(session, snapshots, "first")["keeper"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(keeper, signal.SIGSTOP)
        _until(lambda: processes.start_ticks(other.pid), "the other driver to start")
        other_jvm = DriverJvm(other.pid, processes.start_ticks(other.pid) or 0)
        taken = hold(JobLayout(snapshots, "first"), Guarantee.EXACTLY_ONCE, ttl, other_jvm)
        assert taken.epoch == 2
        os.kill(keeper, signal.SIGCONT)
        stopped_in = _until(lambda: not a.isActive, "the first job's query to stop", 30)
        assert a.exception() is not None, "ended as failed: its application sees the loss"
        assert b.isActive and session.range(3).count() == 3  # the driver and its other query
        keeper_log = (Path(snapshots) / "first" / "logs").glob("session-*.log")
        said = "".join(p.read_text() for p in keeper_log)
        assert "the job's query stopped in" in said and "killing" not in said, said
        decided_by_first = _committed(a_map)

        # New data for both: the second job's query takes it; the first job's stopped query
        # decides nothing (its output stays as it was at the take-over).
        _input(Path(a_map), 50, 30)
        _input(Path(b_map), 50, 30)
        _until(lambda: _committed(b_map) == 80, "the second job's query to go on")
        assert _committed(a_map) == decided_by_first
        assert MapSinkUnderTest(b_map).in_doubt() == []
    finally:
        other.kill()
        other.wait()
    # The other driver is gone (its keeper releases the lease): the first job's query, started
    # again in this driver, takes the lease back at a new epoch and finishes the data.
    a = _running_copy(session, a_map, tmp_path / "a-checkpoint", **first)
    _until(lambda: _committed(a_map) == 80, "the first job's query, started again")
    a.stop()
    b.stop()
    assert JobDirectory(snapshots, "first").lease.epoch() == 3
    counts = {"first": _counts(a_map, 80), "second": _counts(b_map, 80)}
    print(f"query fence: stopped in {stopped_in:.2f}s; lost, duplicated, in doubt: {counts}")
    assert counts == {"first": (0, 0, []), "second": (0, 0, [])}, counts


def test_a_killed_keeper_is_started_again_before_the_lease_can_lapse(
    session: Any, tmp_path: Path
) -> None:
    snapshots = str(tmp_path / "snapshots")
    ttl = 6.0
    job = {"epochal.job": "kept", "epochal.snapshotDir": snapshots, "epochal.leaseTtl": f"{ttl}s"}
    path = _input(tmp_path / "k.sqlite", 0, 30)
    query = _running_copy(session, path, tmp_path / "checkpoint", **job)
    _until(lambda: _committed(path) == 30, "the first rows")
    keeper = int(_session_record(session, snapshots, "kept")["keeper"])
    jobdir = JobDirectory(snapshots, "kept")
    last = jobdir.lease.read()
    assert last is not None
    os.kill(keeper, signal.SIGKILL)  # the keeper alone
    killed = time.time()

    def renewed_by_another_keeper() -> bool:
        found = _session_record(session, snapshots, "kept")
        lease = jobdir.lease.read()
        return (
            int(found["keeper"]) != keeper
            and processes.alive(int(found["keeper"]))
            and lease is not None
            and lease.renewed > killed
        )

    restarted_in = _until(renewed_by_another_keeper, "a new keeper to renew the lease")
    lease = jobdir.lease.read()
    assert lease is not None and lease.epoch == 1 and query.isActive
    # polled every 50 ms, renewals a quarter of the TTL apart: the new keeper's first renewal
    gap = lease.renewed - last.renewed
    assert gap < ttl, f"the lease went {gap:.1f}s unrenewed (ttl {ttl}s): it could lapse"
    _input(Path(path), 30, 20)
    _until(lambda: _committed(path) == 50, "the query to go on")
    query.stop()
    counts = _counts(path, 50)
    print(f"killed keeper: renewed again {restarted_in:.2f}s after; lost, dup, in doubt: {counts}")
    assert counts == (0, 0, []) and jobdir.lease.epoch() == 1 and jobdir.load().run == 1
