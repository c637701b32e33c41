"""Job life cycle on real Spark: refusals at submit, restarts, suspend/resume/cancel,
snapshot verification before a restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal import Job, JobConfig, JobStatus
from epochal.base import processes
from epochal.base.fault_plan import FaultPlan
from epochal.driver.guards import BATCH_IN_FLIGHT_NOTE, SOURCE_RUNNER_MODULE
from epochal.parts import registry
from epochal.startup.session import SessionProfile
from epochal.startup.warmup import PYSPARK_IDLE_CHECK_SECONDS, PYSPARK_IDLE_WORKER_SECONDS
from epochal.state import retention
from epochal.state.layout import FAULTS
from epochal.state.manifests import MANIFESTS, manifest_key
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_map import MapStore
from epochal_sdk import TransactionId

pytestmark = pytest.mark.spark

#: How long a waiting standby is idle in the test: past PySpark's reaping of idle workers.
PYSPARK_REAPS_IDLE_WORKERS_WITHIN = PYSPARK_IDLE_WORKER_SECONDS + PYSPARK_IDLE_CHECK_SECONDS + 5
#: The modules of a task worker, and of the planner that plans a query's read at its start.
TASK_WORKER, PLANNER = b"pyspark.worker", b"pyspark.sql.worker.plan_data_source_read"


def _config(tmp_path: Path, **changes: object) -> JobConfig:
    settings = {
        "snapshot_dir": str(tmp_path / "snapshots"),
        "available_now": True,
        "restart_backoff": 0.2,
        "master": LOCAL,
        "spark_conf": dict(TEST_SPARK_CONF),
    }
    settings.update(changes)
    return JobConfig(**settings)  # type: ignore[arg-type]


def _output(path: str) -> dict[str, str]:
    with MapStore(path) as store:
        return store.entries("output")


def test_exactly_once_with_an_incapable_sink_is_refused_at_submit(
    tmp_path: Path, map_path: str, weak_plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPOCHAL_TEST_SINK", "weakmap")
    record = Job.submit("refused", "pipelines:copy", _config(tmp_path)).join(300)
    assert record.status == JobStatus.FAILED
    assert record.restarts == 0
    assert "GuaranteeError" in record.failure
    assert "connector 'weakmap'" in record.failure
    assert "at-least-once" in record.failure and "allow the downgrade" in record.failure
    assert _output(map_path) == {}


def test_a_downgrade_runs_when_allowed_or_lowered_explicitly(
    tmp_path: Path, map_path: str, weak_plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPOCHAL_TEST_SINK", "weakmap")
    allowed = Job.submit("allowed", "pipelines:copy", _config(tmp_path, allow_downgrade=True))
    assert allowed.join(300).status == JobStatus.COMPLETED
    assert len(_output(map_path)) == 200
    part = allowed.jobdir.store.list("parts")
    assert any("sink-" in key for key in part)
    sink_record = allowed.jobdir.store.read_json(next(k for k in part if "sink-" in k))
    assert sink_record["guarantee"] == "at-least-once"

    monkeypatch.setenv("EPOCHAL_TEST_SINK_GUARANTEE", "at-least-once")
    lowered = Job.submit("lowered", "pipelines:copy", _config(tmp_path))
    assert lowered.join(300).status == JobStatus.COMPLETED


def test_user_code_errors_fail_the_job_without_restarts(tmp_path: Path, map_path: str) -> None:
    record = Job.submit("broken", "pipelines:broken", _config(tmp_path)).join(300)
    assert record.status == JobStatus.FAILED
    assert record.restarts == 0
    assert "ZeroDivisionError: a bug in the pipeline" in record.failure


def test_a_corrupt_snapshot_is_refused_on_restart(tmp_path: Path, map_path: str) -> None:
    job = Job.submit("corrupt", "pipelines:copy", _config(tmp_path))
    assert job.join(300).status == JobStatus.COMPLETED
    assert job.verify() == []
    entries = [key for key in _all_entries(job.jobdir.store.base) if "/decisions/" in key]
    assert entries, "the transactional sink recorded no decisions"
    victim = Path(job.jobdir.store.base) / entries[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert any("corrupt" in p for p in job.verify())

    resumed = Job("corrupt", job.jobdir.snapshot_dir).resume(report=lambda line: None)
    record = resumed.join(120)
    assert record.status == JobStatus.FAILED
    assert "refusing to restart" in record.failure and "corrupt" in record.failure


def test_a_lost_checkpoint_is_refused_on_restart(tmp_path: Path, map_path: str) -> None:
    job = Job.submit("lost", "pipelines:copy", _config(tmp_path))
    assert job.join(300).status == JobStatus.COMPLETED
    commits = Path(job.jobdir.checkpoint) / "commits"
    for entry in commits.iterdir():
        entry.unlink()
    record = Job("lost", job.jobdir.snapshot_dir).resume(report=lambda line: None).join(120)
    assert record.status == JobStatus.FAILED
    assert "checkpoint" in record.failure


#: A task of batch 4 (the first after the 200 records) stalls after it prepared: the suspend
#: finds it there.
STALLED_AFTER_PREPARE = "sink.after_prepare@4:stall"


def test_suspend_resume_and_cancel(tmp_path: Path, map_path: str) -> None:
    """A suspend that stops a batch whose task prepared (and stalled) leaves nothing in
    doubt; the resumed job writes that batch, and a job with 20 000 batches' manifests
    restarts and trims them; a cancel deletes the snapshots."""
    config = _config(
        tmp_path, available_now=False, snapshot_interval=0.5, faults=STALLED_AFTER_PREPARE
    )
    job = Job.submit("lifecycle", "pipelines:copy", config, report=lambda line: None)
    _wait(lambda: len(_output(map_path)) == 200, "the first 200 records")
    with MapStore(map_path) as store:  # batch 4: its task prepares, then stalls
        store.append_events("input", [(str(i), f"v{i}") for i in range(200, 300)])
    faults = FaultPlan.parse(STALLED_AFTER_PREPARE, f"{job.jobdir.path}/{FAULTS}")
    _wait(lambda: bool(faults.fired()), "batch 4's task to prepare and stall")
    assert _prepared(map_path), "the stalled task of batch 4 prepared nothing"
    job.suspend()
    assert job.join(120).status == JobStatus.SUSPENDED
    assert _prepared(map_path) == [], "the suspend left batch 4's transaction prepared"
    assert len(_output(map_path)) == 200  # batch 4 was never decided
    assert os.path.isdir(job.jobdir.checkpoint)
    batch = job.status().progress["batch"]
    # the manifests of a job 20 000 batches old, as an epochal before the retention left them
    manifests = Path(job.jobdir.store.base) / MANIFESTS
    newest = manifests / max(os.listdir(manifests))
    for old in range(batch - 20_000, batch - retention.MANIFEST_BATCHES):
        os.link(newest, manifests / manifest_key(old).rsplit("/", 1)[1])
    job.resume(report=lambda line: None)
    _wait(lambda: len(_output(map_path)) == 300, "the 100 records of batches 4 and 5")
    assert _output(map_path) == {str(i): f"v{i}" for i in range(300)}
    # the sink's output lands inside the batch; the job record's progress only after it (a
    # listener event), so wait for it rather than read it at once
    _wait(lambda: job.status().progress.get("batch", -1) > batch, "a batch after the resume")
    manifests = Path(job.jobdir.store.base) / MANIFESTS  # the resumed run's epoch
    # trimmed at the first batch (a manifest being written meanwhile is a temporary name)
    kept = sorted(int(name) for name in os.listdir(manifests) if name.isdigit())
    assert len(kept) <= retention.MANIFEST_BATCHES + retention.PRUNE_EVERY, len(kept)
    assert kept[-1] >= batch
    job.cancel()
    record = job.join(120)
    assert record.status == JobStatus.CANCELLED
    assert not os.path.exists(job.jobdir.checkpoint)
    assert not os.path.exists(job.jobdir.store.base)


# -- starting over: cancel, --replace, a changed sink (each after a kill that left batch 2's
# transactions prepared: the 2PC decision of batch 2 never made)
KILLED_BEFORE_DECISION = {"faults": "sink.before_decision@2", "max_restarts": 0}


def _killed_before_deciding_batch_2(tmp_path: Path, map_path: str, name: str) -> Job:
    job = Job.submit(name, "pipelines:copy", _config(tmp_path, **KILLED_BEFORE_DECISION))
    assert job.join(300).status == JobStatus.FAILED
    assert len(_output(map_path)) == 100  # batches 0 and 1
    assert _prepared(map_path), "the kill left no transaction of batch 2 prepared"
    return job


def _prepared(path: str) -> list[str]:
    with MapStore(path) as store:
        return store.in_doubt("ep.")


def _written(path: str, map: str) -> int:
    """Every record the map's journal holds (a duplicate is a second one of a key)."""
    with MapStore(path) as store:
        return sum(store.journal_end(map, p) for p in store.journal_partitions(map))


def test_cancel_settles_what_a_killed_job_left_prepared_and_the_name_runs_again(
    tmp_path: Path, map_path: str
) -> None:
    job = _killed_before_deciding_batch_2(tmp_path, map_path, "upg")
    assert job.cancel().status == JobStatus.CANCELLED
    assert _prepared(map_path) == []  # rolled back before the snapshots went
    old = job.status().incarnation  # the cancelled job's record stays

    again = Job.submit("upg", "pipelines:copy", _config(tmp_path))  # the name is not burnt
    record = again.join(300)
    assert record.status == JobStatus.COMPLETED, record.failure
    assert record.incarnation != old
    assert len(_output(map_path)) == 200 and _prepared(map_path) == []


def test_replace_settles_what_a_killed_job_left_prepared_and_starts_over(
    tmp_path: Path, map_path: str
) -> None:
    _killed_before_deciding_batch_2(tmp_path, map_path, "upg")
    job = Job.submit("upg", "pipelines:copy", _config(tmp_path), replace=True)
    assert job.join(300).status == JobStatus.COMPLETED
    assert _prepared(map_path) == []
    # started over: batches 0 and 1 again (their 100 records a second time, as a replace
    # means), batch 2's first attempt never shown
    assert len(_output(map_path)) == 200 and _written(map_path, "output") == 300
    # no task of the new job was refused as a zombie of the old one (same ids) and retried
    assert _committed_attempts(map_path) == {0}


def _committed_attempts(path: str) -> set[int]:
    """The task attempts of every transaction the map file committed."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT txn_id FROM txns WHERE state = 'committed'").fetchall()
    return {TransactionId.of(txn).attempt for (txn,) in rows}


def test_a_sink_the_changed_code_no_longer_writes_is_settled_at_the_next_run(
    tmp_path: Path, map_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _killed_before_deciding_batch_2(tmp_path, map_path, "upg")
    monkeypatch.setenv("EPOCHAL_TEST_OUTPUT", "output2")  # the code now writes another map
    record = job.resume(report=lambda line: None).join(300)
    assert record.status == JobStatus.COMPLETED, record.failure
    assert _prepared(map_path) == []  # the old sink's batch 2, rolled back
    with MapStore(map_path) as store:
        old, new = store.entries("output"), store.entries("output2")
    assert len(old) == 100 and len(new) == 100 and not set(old) & set(new)  # 0 lost, 0 dup
    assert _written(map_path, "output") == 100 and _written(map_path, "output2") == 100
    assert len([k for k in job.jobdir.store.list("parts") if "/sink-" in k]) == 1  # the new one


def test_a_continuous_query_that_stops_on_its_own_is_restarted(
    tmp_path: Path, map_path: str
) -> None:
    """A continuous job whose query ends without an error and without a request must go on
    (a new run from its snapshot), never be marked completed."""
    config = _config(tmp_path, available_now=False, snapshot_interval=0.5)
    job = Job.submit("stops", "pipelines:stops_itself_once", config, report=lambda line: None)
    _wait(lambda: os.path.exists(map_path + ".stopped"), "the pipeline to stop its query")
    ended = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
    _wait(
        lambda: job.status().status in ended or len(job.status().runs) >= 2,
        "a second run (or the job to end)",
    )
    record = job.status()
    assert record.status not in ended, f"{record.status}: {record.failure}"
    assert "QueryStoppedOnItsOwn" in str(record.runs[0].get("outcome")), record.runs
    with MapStore(map_path) as store:  # more data: the second run must take it
        store.append_events("input", [(str(i), f"v{i}") for i in range(200, 250)])
    _wait(lambda: len(_output(map_path)) == 250, "all 250 records after the restart")
    job.cancel()
    assert job.join(120).status == JobStatus.CANCELLED


def test_auto_restart_off_holds_for_a_failure_the_driver_would_restart_in_place(
    tmp_path: Path, map_path: str
) -> None:
    """``auto_restart=False``: a failure that leaves the driver healthy (here a query that
    stops on its own, which is restarted in place when restarts are on) ends the job as
    FAILED after its one run; nothing restarts it, neither the driver nor the supervisor."""
    config = _config(tmp_path, available_now=False, snapshot_interval=0.5, auto_restart=False)
    job = Job.submit("no-restart", "pipelines:stops_itself_once", config, report=lambda _: None)
    record = job.join(300)
    assert record.status == JobStatus.FAILED, record
    assert "automatic restart is off" in str(record.failure), record.failure
    assert "QueryStoppedOnItsOwn" in str(record.failure), record.failure
    assert record.restarts == 0 and len(record.runs) == 1, record.runs


CONF_SECRET = "conf-5ecret-f0ur"
"""What the secret-scan job gives Spark in a setting (``spark.hadoop.fs.s3a.secret.key``)."""


@pytest.fixture
def secretmap_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test connector ``secretmap`` (tests/unit/plugins/secretmap.py: the map sink with
    a ``password``, a ``token`` and an ``endpoint`` option), here and in the drivers, as the
    sink of ``pipelines``' jobs."""
    plugins = str(Path(__file__).resolve().parents[1] / "unit" / "plugins")
    monkeypatch.syspath_prepend(plugins)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([plugins, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "secretmap")
    monkeypatch.setenv("EPOCHAL_TEST_SINK", "secretmap")
    registry.plugin_manager.cache_clear()
    yield
    registry.plugin_manager.cache_clear()


def test_no_secret_reaches_a_file_a_log_an_id_or_a_command_line(
    tmp_path: Path, map_path: str, secretmap_plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose sink is given secrets (an option named like one, a ``${file:...}``
    reference, a password in a URL) and whose Spark settings hold one
    (``spark.hadoop.fs.s3a.secret.key`` as a ``${env:...}`` reference, which the driver
    resolves and hands to its JVM after it started): no file under the snapshot directory
    (records, store, metrics, logs) and no command line of the run's processes (the
    supervisor's Python driver, its JVM, PySpark's daemon and workers) holds one, and every
    file the job wrote is its owner's only."""
    from pipelines import SECRETS

    token_file = tmp_path / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(SECRETS[1])
    monkeypatch.setenv("EPOCHAL_TEST_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("EPOCHAL_TEST_CONF_SECRET", CONF_SECRET)
    secrets = (*SECRETS, CONF_SECRET)
    spark_conf = {
        **TEST_SPARK_CONF,
        "spark.hadoop.fs.s3a.secret.key": "${env:EPOCHAL_TEST_CONF_SECRET}",
    }
    config = _config(tmp_path, available_now=False, snapshot_interval=0.5, spark_conf=spark_conf)
    job = Job.submit("secrets", "pipelines:copy_with_secrets", config, report=lambda _: None)
    _wait(
        lambda: len(_output(map_path)) == 200 or job.status().status.finished,
        "the 200 records",
    )
    assert not job.status().status.finished, job.status().failure
    token = str(job.status().driver.get("token"))
    command_lines = [processes.command_line(pid) for pid in processes.processes_of(token)]
    assert any(b"java" in line for line in command_lines), "the driver's JVM was not found"
    job.suspend()  # keeps the snapshots (a cancel deletes them)
    assert job.join(120).status == JobStatus.SUSPENDED
    assert list((tmp_path / "snapshots" / "secrets").rglob("parts/sink-*")), "no part record"
    for line in command_lines:
        assert not any(s.encode() in line for s in secrets), line[:300]
    written = [p for p in (tmp_path / "snapshots").rglob("*") if p.is_file()]
    assert written, "the job wrote nothing"
    for path in written:
        data = path.read_bytes()
        assert not any(s.encode() in data for s in secrets), path
    record = (tmp_path / "snapshots" / "secrets" / "job.json").read_text()
    assert "${env:EPOCHAL_TEST_CONF_SECRET}" in record, "job.json lost the reference"
    for path in (tmp_path / "snapshots" / "secrets").rglob("*"):
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"


SESSION_CHECK = """
import json, os, sys
from epochal.startup.session import SessionProfile, spark_session
profile = SessionProfile.from_json(sys.stdin.readline())
spark = spark_session(profile)
context = spark.sparkContext
jvm = context._jvm.ProcessHandle.current().pid()
print(json.dumps({
    "jvm": jvm,
    "setting": context.getConf().get("spark.hadoop.fs.s3a.secret.key"),
    "hadoop": context._jsc.hadoopConfiguration().get("fs.s3a.secret.key"),
    "public": context.getConf().get("spark.sql.shuffle.partitions"),
}), flush=True)
sys.stdin.readline()  # the test reads the JVM's command line meanwhile
spark.stop()
"""


def test_a_secret_spark_setting_reaches_the_session_but_no_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's session: a setting given as a ``${env:...}`` reference is resolved and
    reaches Spark's configuration and Hadoop's (what the S3A connector reads), and neither
    the value nor the reference is on the JVM's command line; a plain setting still is."""
    monkeypatch.setenv("EPOCHAL_TEST_CONF_SECRET", CONF_SECRET)
    profile = SessionProfile(
        LOCAL,
        (
            ("spark.hadoop.fs.s3a.secret.key", "${env:EPOCHAL_TEST_CONF_SECRET}"),
            ("spark.sql.shuffle.partitions", "3"),
        ),
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", SESSION_CHECK],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert driver.stdin is not None and driver.stdout is not None
        driver.stdin.write(profile.to_json() + "\n")
        driver.stdin.flush()
        seen = json.loads(driver.stdout.readline())
        command_line = processes.command_line(int(seen["jvm"]))
        driver.stdin.write("\n")
        driver.stdin.close()
        assert driver.wait(120) == 0
    finally:
        driver.kill()
    assert seen["setting"] == CONF_SECRET and seen["hadoop"] == CONF_SECRET, seen
    assert seen["public"] == "3"
    assert b"spark.sql.shuffle.partitions=3" in command_line
    assert CONF_SECRET.encode() not in command_line, command_line[:300]
    assert b"EPOCHAL_TEST_CONF_SECRET" not in command_line


def test_a_killed_source_runner_is_seen_at_once_and_the_query_restarted_in_place(
    tmp_path: Path, map_path: str
) -> None:
    """Spark notices a dead streaming source runner only at its next call into it; the
    driver's watch stops the query and restarts it in place at once, with its own account of
    the failure (without the watch the run ends with Spark's error, ``SQLSTATE: XXKST (no
    cause message)``, which the test refuses). The kill waits for batch 0's progress event;
    a call of Spark's into the runner just after it can still meet the dead runner before
    the watch does (once in a CI run: ``Connection reset``), and is accepted."""
    config = _config(tmp_path, available_now=False, snapshot_interval=600.0)
    job = Job.submit("runner", "pipelines:copy", config, report=lambda line: None)
    _wait(lambda: len(_output(map_path)) >= 50, "the first batch")
    _wait(lambda: job.status().progress.get("batch", -1) >= 0, "batch 0's progress event")
    runners = _source_runners(job)
    assert len(runners) == 1, runners
    os.kill(runners[0], signal.SIGKILL)
    _wait(lambda: len(job.status().runs) >= 2, "a second run")
    record = job.status()
    assert record.runs[-1]["kind"] == "in-place", record.runs
    outcome = str(record.runs[-2].get("outcome"))
    seen_by_the_watch = f"source runner (pid {runners[0]}) died" in outcome
    assert seen_by_the_watch or "Connection reset" in outcome, outcome
    _wait(lambda: len(_output(map_path)) >= 100, "the new run's first batch")
    job.cancel()
    assert job.join(120).status == JobStatus.CANCELLED


def test_a_batch_in_flight_when_the_source_runner_dies_finishes_and_keeps_its_workers(
    tmp_path: Path, map_path: str
) -> None:
    """The source runner is killed while batch 0's tasks run (held by the pipeline): the
    driver lets the batch finish before it restarts the query in place, so the Python
    workers of those tasks go back to PySpark's pool and serve the new query (stopping the
    query under them would destroy them, and the new query would fork and import anew),
    and the batch commits: the new run's sink recovery finds none of its transactions
    undecided (stopped after its tasks but before its commit on the driver, it was aborted
    and read again), and the new run's first batch is batch 1, which brings the output to
    100 records at once (50 a batch; a replayed batch 0 brought 50, and the next batch came
    at the next minute, the trigger's interval)."""
    config = _config(tmp_path, available_now=False, snapshot_interval=60.0)
    job = Job.submit("held", "pipelines:held_once", config, report=lambda line: None)
    pids_file, release = Path(map_path + ".pids"), Path(map_path + ".release")
    _wait(lambda: pids_file.exists() and pids_file.read_text().strip(), "batch 0 to be held")
    held = [int(pid) for pid in pids_file.read_text().split()]
    runners = _source_runners(job)
    assert len(runners) == 1, runners
    os.kill(runners[0], signal.SIGKILL)
    _wait(lambda: BATCH_IN_FLIGHT_NOTE in _driver_logs(job), "the driver to wait for the batch")
    assert len(job.status().runs) == 1, "the query was stopped under its batch"
    release.touch()
    _wait(lambda: len(job.status().runs) >= 2, "a second run")
    assert job.status().runs[-1]["kind"] == "in-place", job.status().runs
    _wait(lambda: len(_output(map_path)) >= 100, "the new run's first batch")
    assert all(processes.alive(pid) for pid in held), (held, "a held worker was destroyed")
    protocol = (Path(job.jobdir.logs) / "protocol.log").read_text()
    recovery = [line for line in protocol.splitlines() if "recovery at the start of run 2" in line]
    assert recovery and all("rolled back 0 undecided" in line for line in recovery), recovery
    job.cancel()
    assert job.join(120).status == JobStatus.CANCELLED
    assert len(_output(map_path)) >= 100


def test_a_killed_driver_is_replaced_by_its_warm_standby_and_a_new_standby_warms(
    tmp_path: Path, map_path: str
) -> None:
    """``standby=True``: the standby keeps its Python task workers while it waits longer
    than PySpark lets idle workers live (it keeps warm); the whole driver run is killed
    (SIGKILL); the warm standby takes the job at the next epoch (its run is of kind
    ``standby``), the record stops naming it as the standby, a new standby is launched once
    the promoted driver has made progress, and every record arrives. What the killed run's
    JVM kept in its temporary directory (its run's scratch directory) is removed."""
    config = _config(tmp_path, available_now=False, snapshot_interval=1.0, standby=True)
    job = Job.submit("standby", "pipelines:copy", config, report=lambda line: None)
    _wait(lambda: len(_output(map_path)) == 200, "the first run's output")
    _wait(lambda: job.status().supervisor.get("standby_ready"), "a warm standby, ready")
    record = job.status()
    standby, active = int(record.supervisor["standby_pid"]), int(record.driver["pid"])
    assert standby != active and processes.alive(standby)
    workers = _forked_workers(standby, TASK_WORKER)
    assert workers, "the standby's warm-up left no Python task workers"
    planners = _forked_workers(active, PLANNER)
    assert planners, "the active driver's query start left no planner worker"
    time.sleep(PYSPARK_REAPS_IDLE_WORKERS_WITHIN)  # the idleness is what is tested
    gone = sorted(pid for pid in workers if not processes.alive(pid))
    assert not gone, (gone, "the waiting standby's Python task workers were reaped")
    gone = sorted(pid for pid in planners if not processes.alive(pid))
    assert not gone, (gone, "the running driver's planner workers were reaped")
    scratch = Path(processes.scratch_dir(str(record.driver["token"])))
    assert list(scratch.glob("blockmgr-*")), "the driver's JVM keeps its files elsewhere"
    processes.kill_run(str(record.driver["token"]))
    _wait(lambda: len(job.status().runs) >= 2, "the promoted run")
    record = job.status()
    promoted = record.runs[-1]
    assert promoted["kind"] == "standby" and promoted["driver_pid"] == standby, record.runs
    assert promoted["epoch"] > record.runs[0]["epoch"], record.runs
    assert record.supervisor.get("standby_pid") != standby, "the promoted driver is no standby"
    with MapStore(map_path) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(200, 250)])
    _wait(lambda: len(_output(map_path)) == 250, "the promoted run's output")
    _wait(lambda: not scratch.exists(), "the killed driver's scratch directory to go")
    _wait(
        lambda: job.status().supervisor.get("standby_pid") not in (None, standby),
        "a new standby",
    )  # launched; its warm-up is the first standby's, checked above
    assert processes.alive(int(job.status().supervisor["standby_pid"]))
    job.cancel()
    assert job.join(120).status == JobStatus.CANCELLED
    assert _output(map_path) == {str(i): f"v{i}" for i in range(250)}


def _source_runners(job: Job) -> list[int]:
    """The pids of the streaming source runners of the job's current driver run."""
    token = str(job.status().driver.get("token"))
    return [
        pid
        for pid in processes.processes_of(token)
        if SOURCE_RUNNER_MODULE in processes.command_line(pid)
    ]


def _forked_workers(driver_pid: int, module: bytes) -> set[int]:
    """The Python workers of ``module`` that a PySpark daemon of a driver forked (and keeps
    for reuse): below the driver in the process tree, with a parent that runs it too."""
    below = processes.descendants(driver_pid)

    def runs_module(pid: int) -> bool:
        return processes.command_line(pid).rstrip(b"\0").endswith(module)

    return {pid for pid, parent in below.items() if runs_module(pid) and runs_module(parent)}


def _driver_logs(job: Job) -> str:
    logs = Path(job.jobdir.logs)
    return "".join(p.read_text(errors="replace") for p in sorted(logs.glob("driver-*.log")))


def _wait(condition, what: str, seconds: float = 240.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _all_entries(base: str) -> list[str]:
    out = []
    for root, _, files in os.walk(base):
        for name in files:
            if ".tmp-" not in name:
                out.append(os.path.relpath(os.path.join(root, name), base))
    return sorted(out)


# Split-brain protection is proven with real workers: integration/cluster/test_cluster_jobs.py
# (a restart on half of a standalone cluster is refused with QuorumNotMet, commits nothing,
# and the job completes once the worker is back).
