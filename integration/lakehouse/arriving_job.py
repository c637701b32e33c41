"""A table format (Iceberg or Delta Lake) as an epochal job's sink and source with input that
keeps arriving, run by the interpreter of an environment whose pyspark is one the format
publishes for (``tests/releases/test_iceberg.py`` and ``test_delta.py`` make it). Python
sources have no available-now trigger before Spark 4.2 (Iceberg's newest runtime is for 4.1;
Delta's older releases too), so the jobs run at a processing-time trigger (1 s) while the
input keeps arriving, and are stopped gracefully (``jobs suspend``) once the output holds
every record:

1. **map journal → table** (Iceberg: a Hadoop catalog in a local warehouse; Delta: a table
   directory), exactly-once under ``epochal run``: 500 records at a time appended while it
   runs, the driver SIGKILLed while a task of batch 1 writes and once batch 3 is complete;
   suspended halfway, the rest appended while it is suspended, resumed;
2. **the same into a second table from a plain session** (Spark finds ``epochal.map`` by
   itself, a 1 s trigger, the query stopped once every record is committed), then the state
   a driver killed between the format's commit of the last batch and Spark's commit log
   leaves, and the query started again on it: the format must skip the batch it holds
   (:func:`~integration.lakehouse.delta_job.plain_session_window`);
3. **table → map sink** (two-phase commit), exactly-once, the driver SIGKILLed after
   batch 1's decision was recorded.

The table is read back by the format's own reader, the map's output by its store; every
record is checked by key and by value. Prints one JSON object of what was found.

    python -m integration.lakehouse.arriving_job <workdir> <the format's jars> [iceberg|delta]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from integration.lakehouse.delta_job import (
    CASE_ENV,
    RECORDS,
    case_spec,
    delta_conf,
    map_rows,
    plain_session_window,
    table_rows,
    typed,
    wrong_records,
)

MODULE = "integration.lakehouse.arriving_job"
TABLE = "local.db.events"
"""The Iceberg table, in the catalog ``local``."""
WINDOW_TABLE = "local.db.window"
"""The Iceberg table of the plain session's case, in the catalog ``local``."""
ICEBERG_COLUMNS = "(id BIGINT, value STRING, amount DECIMAL(20, 4), at TIMESTAMP)"
FILES_PER_BATCH = "2"
"""A few of the table's files a batch when it is read, so that the job runs several batches."""
FILES_PER_BATCH_OPTION = {
    "iceberg": "streaming-max-files-per-micro-batch",
    "delta": "maxFilesPerTrigger",
}
"""Each format's stream read option for :data:`FILES_PER_BATCH`."""
CHUNK = 500
CHUNKS = RECORDS // CHUNK
DEADLINE = 600.0
"""Seconds a job may take to get every record into its output before the case fails."""


def iceberg_conf(jars: str, warehouse: str) -> dict[str, str]:
    """The session settings of Iceberg's runtime, its SQL extensions and a Hadoop catalog
    ``local`` in ``warehouse``."""
    return {
        "spark.jars": jars,
        "spark.sql.extensions": (
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
        ),
        "spark.sql.catalog.local": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.local.type": "hadoop",
        "spark.sql.catalog.local.warehouse": warehouse,
        "spark.sql.session.timeZone": "UTC",
    }


def _table(case: dict[str, Any]) -> str:
    """Where the case's table is: Iceberg's by its name, Delta's by its directory."""
    return TABLE if case["format"] == "iceberg" else str(case["table"])


def to_table(spark: Any) -> Any:
    """Pipeline 1: the map journal into the table."""
    case = case_spec()
    rows = typed(map_rows(spark, case))
    writer = rows.writeStream.format(case["format"]).option("path", _table(case))
    return writer.outputMode("append")


def from_table(spark: Any) -> Any:
    """Pipeline 2: the table into the map sink, two-phase commit."""
    case = case_spec()
    limit = FILES_PER_BATCH_OPTION[case["format"]]
    reader = spark.readStream.format(case["format"]).option(limit, FILES_PER_BATCH)
    rows = reader.load(_table(case)).selectExpr("CAST(id AS STRING) AS key", "value")
    sink = {"path": case["output"], "map": "output", "mode": "transactional"}
    return rows.writeStream.format("epochal.map").options(**sink).outputMode("append")


def _wait(what: str, done: Any, job: Any) -> None:
    """Until ``done()``; the job's record in the error when the deadline passes first."""
    from epochal import JobStatus

    deadline = time.monotonic() + DEADLINE
    while not done():
        record = job.status()
        if record.status == JobStatus.FAILED:  # it will not get there: say why at once
            raise AssertionError(f"the job failed before {what}: {record.failure}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {record}")
        time.sleep(0.5)


def _batch(job: Any) -> int:
    return int(job.status().progress.get("batch", -1))


def main() -> None:
    """Run both cases in ``sys.argv[1]`` on the format ``sys.argv[3]`` (Iceberg unless said)
    and print what was found, under the keys ``to_table*`` and ``from_table*``."""
    from pyspark.sql import SparkSession

    import epochal
    from epochal import Job, JobConfig, JobStatus
    from epochal_map.store import MapStore

    root, jars = Path(sys.argv[1]), sys.argv[2]
    table_format = sys.argv[3] if len(sys.argv) > 3 else "iceberg"
    journal = root / "journal.sqlite"
    case = {
        "journal": str(journal),
        "output": str(root / "output.sqlite"),
        "format": table_format,
        "table": str(root / "table"),
    }
    os.environ[CASE_ENV] = json.dumps(case)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this environment's
    if table_format == "iceberg":
        conf = iceberg_conf(jars, str(root / "warehouse"))
    else:
        conf = delta_conf(jars)
    builder = SparkSession.builder.master("local[1]").appName(f"{table_format}-reader")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if table_format == "iceberg":
        for name in (TABLE, WINDOW_TABLE):
            spark.sql(f"CREATE TABLE {name} {ICEBERG_COLUMNS} USING iceberg")
    with MapStore(str(journal)) as store:
        store.append_events("input", [])

    def output_rows() -> list[tuple[Any, ...]]:
        return table_rows(spark, table_format, _table(case))

    def append(chunk: int) -> None:
        with MapStore(str(journal)) as store:
            ids = range(chunk * CHUNK, (chunk + 1) * CHUNK)
            store.append_events("input", [(str(i), f"v{i}") for i in ids])

    def config(faults: str) -> Any:
        return JobConfig(
            snapshot_dir=str(root / "snapshots"),
            snapshot_interval=1.0,
            master="local[2]",
            spark_conf=conf,
            faults=faults,
        )

    def faults_fired(name: str) -> list[str]:
        return sorted(p.name for p in (root / "snapshots" / name / "faults").glob("*"))

    found: dict[str, Any] = {"epochal_from": epochal.__file__, "format": table_format}
    faults = "source.after_read@1:driver > job.after_batch@3"
    job = Job.submit("to-table", f"{MODULE}:to_table", config(faults), report=print)
    chunks = CHUNKS
    for chunk in range(chunks // 2):  # input that keeps arriving, through both kills
        before = _batch(job)
        append(chunk)
        _wait(f"a batch after chunk {chunk}", lambda b=before: _batch(job) > b, job)
    _wait("the first half in the table", lambda: len(output_rows()) >= RECORDS // 2, job)
    job.suspend()
    found["suspended"] = str(job.join(300).status)
    for chunk in range(chunks // 2, chunks):  # arriving while the job is suspended
        append(chunk)
    job = job.resume(report=print)
    _wait("every record in the table", lambda: len(output_rows()) >= RECORDS, job)
    job.suspend()
    found["to_table_status"] = str(job.join(300).status)
    found["to_table_faults"] = faults_fired("to-table")
    found["to_table"] = wrong_records(output_rows())
    window = WINDOW_TABLE if table_format == "iceberg" else str(root / "window-table")
    every_second = {"processingTime": "1 second"}
    found["window"] = plain_session_window(spark, case, root, window, every_second, CHUNKS)

    job = Job.submit(
        "from-table", f"{MODULE}:from_table", config("sink.after_decision@1"), report=print
    )

    def output() -> list[tuple[str, str]]:
        with MapStore(case["output"]) as store:
            out = []
            for partition in store.journal_partitions("output"):
                end = store.journal_end("output", partition)
                out += [(k, v) for _, k, v, _ in store.journal_read("output", partition, 0, end)]
            return out

    _wait("every record in the map", lambda: len(output()) >= RECORDS, job)
    job.suspend()
    record = job.join(300)
    found["from_table_status"] = str(record.status)
    found["from_table_faults"] = faults_fired("from-table")
    with MapStore(case["output"]) as store:
        found["from_table_in_doubt"] = store.in_doubt("ep.")
    found["from_table"] = wrong_records(output())
    found["suspended_ok"] = record.status == JobStatus.SUSPENDED
    spark.stop()
    print("FOUND " + json.dumps(found, default=str))


if __name__ == "__main__":
    main()
