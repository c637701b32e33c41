"""The driver: one run of a job, as a child process of the supervisor.

``python -m epochal.driver <snapshot_dir> <job>`` builds the SparkSession, checks the quorum,
rebuilds the query from the user's function, points it at the job's checkpoint, runs it, and
reports progress into the job record. It exits with :data:`EXIT_DONE` (finished, or stopped
on request), :data:`EXIT_RESTARTABLE` or :data:`EXIT_FATAL`; a hard kill is seen by the
supervisor as a signal and treated as restartable.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import sys
import time
import traceback
from typing import Any

from epochal.context import (
    ENV_ALLOW_DOWNGRADE,
    ENV_FAULTS,
    ENV_GUARANTEE,
    ENV_JOB,
    ENV_JOB_DIR,
    ENV_LEASE_EPOCH,
    ENV_RUN,
)
from epochal.failures import EXIT_DONE, EXIT_FATAL, EXIT_RESTARTABLE, Failure, classify
from epochal.jobs import PROGRESS_PREFIX, JobDirectory, JobRecord
from epochal_sdk.errors import STARTING_ENV

log = logging.getLogger("epochal.driver")


QUORUM_WAIT_ENV = "EPOCHAL_QUORUM_WAIT_SECONDS"
"""How long a restart waits for the split-brain quorum of executors (default 30 s)."""


class QuorumNotMetError(Exception):
    """Fewer executors than the split-brain quorum; retry later."""


def load_target(target: str) -> Any:
    """Import ``module:function``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target {target!r} must look like module:function")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _environment(record: JobRecord, jobdir: JobDirectory, epoch: int) -> None:
    config = record.job_config
    os.environ.update(
        {
            ENV_JOB: record.name,
            ENV_JOB_DIR: jobdir.path,
            ENV_GUARANTEE: config.guarantee.label,
            ENV_ALLOW_DOWNGRADE: "1" if config.allow_downgrade else "0",
            ENV_RUN: str(record.run),
            ENV_LEASE_EPOCH: str(epoch),
            ENV_FAULTS: config.faults,
            STARTING_ENV: "0",  # the data source says when a check is the job's start
            "EPOCHAL_DRIVER_PGID": str(os.getpgid(0)),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
    )
    for entry in reversed(record.python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*record.python_path, *filter(None, [os.environ.get("PYTHONPATH")])]
    )


def _expected_executors(master: str) -> int:
    match = re.match(r"local-cluster\[(\d+)", master)
    return int(match.group(1)) if match else 1


def spark_session(record: JobRecord) -> Any:
    """A SparkSession for the job (the master, state store and settings of its config)."""
    from pyspark.sql import SparkSession

    config = record.job_config
    builder = (
        SparkSession.builder.master(config.master)
        .appName(f"epochal:{record.name}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    if config.master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "600m").config(
            "spark.task.maxFailures", "4"
        )
    for key, value in config.spark_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def executor_count(spark: Any) -> int:
    """Executors registered now (the driver alone counts as one in local mode)."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return max(1, status.size() - 1) if status.size() > 1 else 1


def wait_for_executors(spark: Any, wanted: int, seconds: float) -> int:
    """Wait (with a deadline) until ``wanted`` executors registered; the count reached."""
    deadline = time.monotonic() + seconds
    count = executor_count(spark)
    while count < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        count = executor_count(spark)
    return count


def checkpoint_manifest(jobdir: JobDirectory, batch: int) -> None:
    """Record the checksums of Spark's offset and commit log entries of ``batch``."""
    entry = {}
    for log_name in ("offsets", "commits"):
        path = f"{jobdir.checkpoint}/{log_name}/{batch}"
        try:
            with open(path, "rb") as fh:
                entry[log_name] = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            continue
    if entry:
        jobdir.store.write_json(f"checkpoint/{batch:012d}", entry, count=len(entry))


def make_listener(jobdir: JobDirectory, record: JobRecord) -> Any:
    """A listener that reports progress and records checkpoint manifests after each batch."""
    from pyspark.sql.streaming import StreamingQueryListener

    from epochal.context import JobContext

    context = JobContext.current()

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            batch = int(progress.batchId)
            rows = int(progress.numInputRows)
            if rows == 0 and batch == record.progress.get("batch"):
                return
            try:
                checkpoint_manifest(jobdir, batch)
                with jobdir.update() as current:
                    total = int(current.progress.get("rows", 0)) + rows
                    current.progress = {
                        "batch": batch,
                        "rows": total,
                        "last_rows": rows,
                        "duration_ms": int(progress.batchDuration),
                        "at": time.time(),
                    }
                    current.restarts_in_a_row = 0
                    record.progress = current.progress
                line = {"job": record.name, "run": record.run, "batch": batch, "rows": rows}
                print(PROGRESS_PREFIX + json.dumps(line), flush=True)
            except Exception:  # progress must never break the query
                log.exception("progress report failed")
            context.reach("job.after_batch", batch)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return ProgressListener()


def run(snapshot_dir: str, name: str) -> int:
    """One run of job ``name``; returns the exit code."""
    jobdir = JobDirectory(snapshot_dir, name)
    record = jobdir.load()
    config = record.job_config
    _environment(record, jobdir, jobdir.lease_epoch())
    spark = None
    try:
        from epochal.spark.datasource import register

        build = load_target(record.target)
        spark = spark_session(record)
        register(spark)
        wanted = _expected_executors(config.master)
        count = wait_for_executors(spark, wanted, 120)
        with jobdir.update() as current:
            if current.original_executors is None:
                current.original_executors = count
            original = current.original_executors
            current.status = current.status.__class__("RUNNING")
        if config.split_brain_protection:
            quorum = original // 2 + 1
            count = wait_for_executors(spark, quorum, float(os.environ.get(QUORUM_WAIT_ENV, "30")))
            if count < quorum:
                raise QuorumNotMetError(
                    f"QuorumNotMet: job {name!r} first ran with {original} executors; a restart "
                    f"needs {quorum} (split-brain protection) but only {count} are up"
                )
        spark.streams.addListener(make_listener(jobdir, record))
        writer = build(spark)
        if not hasattr(writer, "start"):
            raise TypeError(
                f"{record.target} returned {type(writer).__name__}; it must return "
                "df.writeStream... (a DataStreamWriter, not started)"
            )
        writer = writer.option("checkpointLocation", jobdir.checkpoint).queryName(name)
        if config.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(
                processingTime=f"{int(config.snapshot_interval * 1000)} milliseconds"
            )
        query = writer.start()
        while query.isActive:
            query.awaitTermination(0.5)
            requested = jobdir.load().requested
            if requested in ("cancel", "suspend"):
                query.stop()
                return EXIT_DONE
        error = query.exception()
        if error is not None:
            return _fail(jobdir, f"{error}")
        return EXIT_DONE
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        return _fail(jobdir, text)
    finally:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()


def _fail(jobdir: JobDirectory, text: str) -> int:
    kind = classify(text)
    summary = _summary(text)
    with jobdir.update() as current:
        current.failure = summary
    sys.stderr.write(f"epochal: run failed ({kind.value}): {text}\n")
    return EXIT_RESTARTABLE if kind == Failure.RESTARTABLE else EXIT_FATAL


def _summary(text: str) -> str:
    """The most telling line of a long Spark/Python error text: epochal's own error if there
    is one, else the first Python error, else the first Spark exception."""
    patterns = (
        r"(epochal\w*\.[\w.]*(?:Error|Exception): [^\n]+)",
        r"(\b\w+(?:Error|Exception): [^\n]+)",
        r"(SparkException: [^\n]+)",
    )
    step = re.search(r"epochal step: ([^\n]+)", text)
    where = f" [{step.group(1)}]" if step else ""
    for pattern in patterns:
        found = re.findall(pattern, text)
        if found:
            return found[0][:2000] + where
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:2000] if lines else "unknown failure"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    snapshot_dir, name = sys.argv[1], sys.argv[2]
    code = run(snapshot_dir, name)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
