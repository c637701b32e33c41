"""Apache Iceberg as an epochal job's sink and source, run by the interpreter of an
environment whose pyspark is one Iceberg publishes for (``tests/releases/test_iceberg.py``
makes it). Iceberg's newest runtime is for Spark 4.1, which has no available-now trigger for
Python sources, so the jobs run at a processing-time trigger (1 s) while the input keeps
arriving, and are stopped gracefully (``jobs suspend``) once the output holds every record:

1. **map journal → Iceberg table** (a Hadoop catalog in a local warehouse), exactly-once
   under ``epochal run``: 500 records at a time appended while it runs, the driver SIGKILLed
   while a task of batch 1 writes and once batch 3 is complete; suspended halfway, the rest
   appended while it is suspended, resumed;
2. **Iceberg table → map sink** (two-phase commit), exactly-once, the driver SIGKILLed after
   batch 1's decision was recorded.

The table is read back by Iceberg's own reader, the map's output by its store; every record
is checked by key and by value. Prints one JSON object of what was found.

    python -m integration.lakehouse.iceberg_job <workdir> <Iceberg runtime jar>
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
    map_rows,
    typed,
    wrong_records,
)

MODULE = "integration.lakehouse.iceberg_job"
TABLE = "local.db.events"
CHUNK = 500
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


def to_iceberg(spark: Any) -> Any:
    """Pipeline 1: the map journal into the Iceberg table."""
    rows = typed(map_rows(spark, case_spec()))
    return rows.writeStream.format("iceberg").option("path", TABLE).outputMode("append")


def from_iceberg(spark: Any) -> Any:
    """Pipeline 2: the Iceberg table into the map sink, two-phase commit."""
    case = case_spec()
    # a few of the table's files a batch, so that the job runs several batches
    files = {"streaming-max-files-per-micro-batch": "2"}
    rows = spark.readStream.format("iceberg").options(**files).load(TABLE)
    rows = rows.selectExpr("CAST(id AS STRING) AS key", "value")
    sink = {"path": case["output"], "map": "output", "mode": "transactional"}
    return rows.writeStream.format("epochal.map").options(**sink).outputMode("append")


def _wait(what: str, done: Any, job: Any) -> None:
    """Until ``done()``; the job's record in the error when the deadline passes first."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {job.status()}")
        time.sleep(0.5)


def _batch(job: Any) -> int:
    return int(job.status().progress.get("batch", -1))


def main() -> None:
    """Run both cases in ``sys.argv[1]`` and print what was found."""
    from pyspark.sql import SparkSession

    import epochal
    from epochal import Job, JobConfig, JobStatus
    from epochal_map.store import MapStore

    root, jars = Path(sys.argv[1]), sys.argv[2]
    journal = root / "journal.sqlite"
    case = {"journal": str(journal), "output": str(root / "output.sqlite")}
    os.environ[CASE_ENV] = json.dumps(case)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this environment's
    conf = iceberg_conf(jars, str(root / "warehouse"))
    builder = SparkSession.builder.master("local[1]").appName("iceberg-reader")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sql(
        f"CREATE TABLE {TABLE} (id BIGINT, value STRING, amount DECIMAL(20, 4), at TIMESTAMP) "
        "USING iceberg"
    )
    with MapStore(str(journal)) as store:
        store.append_events("input", [])

    def table_rows() -> list[tuple[Any, ...]]:
        spark.sql(f"REFRESH TABLE {TABLE}")
        return [tuple(r) for r in spark.table(TABLE).collect()]

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

    found: dict[str, Any] = {"epochal_from": epochal.__file__}
    faults = "source.after_read@1:driver > job.after_batch@3"
    job = Job.submit("to-iceberg", f"{MODULE}:to_iceberg", config(faults), report=print)
    chunks = RECORDS // CHUNK
    for chunk in range(chunks // 2):  # input that keeps arriving, through both kills
        before = _batch(job)
        append(chunk)
        _wait(f"a batch after chunk {chunk}", lambda b=before: _batch(job) > b, job)
    _wait("the first half in the table", lambda: len(table_rows()) >= RECORDS // 2, job)
    job.suspend()
    found["suspended"] = str(job.join(300).status)
    for chunk in range(chunks // 2, chunks):  # arriving while the job is suspended
        append(chunk)
    job = job.resume(report=print)
    _wait("every record in the table", lambda: len(table_rows()) >= RECORDS, job)
    job.suspend()
    found["to_iceberg_status"] = str(job.join(300).status)
    found["to_iceberg_faults"] = sorted(
        p.name for p in (root / "snapshots" / "to-iceberg" / "faults").glob("*")
    )
    found["to_iceberg"] = wrong_records(table_rows())

    job = Job.submit(
        "from-iceberg", f"{MODULE}:from_iceberg", config("sink.after_decision@1"), report=print
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
    found["from_iceberg_status"] = str(record.status)
    found["from_iceberg_faults"] = sorted(
        p.name for p in (root / "snapshots" / "from-iceberg" / "faults").glob("*")
    )
    with MapStore(case["output"]) as store:
        found["from_iceberg_in_doubt"] = store.in_doubt("ep.")
    found["from_iceberg"] = wrong_records(output())
    found["suspended_ok"] = record.status == JobStatus.SUSPENDED
    spark.stop()
    print("FOUND " + json.dumps(found, default=str))


if __name__ == "__main__":
    main()
