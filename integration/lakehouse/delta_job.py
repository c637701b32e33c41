"""Delta Lake as an epochal job's sink and source, run by the interpreter of an environment
whose pyspark is one Delta publishes for (``tests/releases/test_delta.py`` makes it):

1. **map journal → Delta table**, exactly-once under ``epochal run`` (the supervisor), the
   driver SIGKILLed twice: while a task of batch 1 writes its rows into the table, and once
   batch 3 is complete (in Spark's commit log) by the next run;
2. **the same into a second table from a plain session** (Spark finds ``epochal.map`` by
   itself), then the state a driver killed between Delta's commit of the last batch and
   Spark's commit log leaves (the batch's offsets logged, its commit-log entry absent), and
   the query started again on it: Delta must skip the batch it already holds;
3. **Delta table → map sink** (two-phase commit), exactly-once under ``epochal run``, the
   driver SIGKILLed after batch 1's decision was recorded.

Each table is read back by Delta's own reader (``spark.read.format("delta")``), the map's
output by its store; every record is checked by key and by value (a string, a decimal and
a timestamp derived from its key). Prints one JSON object of what was found.

    python -m integration.lakehouse.delta_job <workdir> <comma-separated Delta jars>
"""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

CASE_ENV = "EPOCHAL_DELTA_CASE"
RECORDS = 3000
PER_BATCH = 500
MODULE = "integration.lakehouse.delta_job"


def case_spec() -> dict[str, Any]:
    """The case's paths and jars, as the job's submitter set them (:data:`CASE_ENV`)."""
    return dict(json.loads(os.environ[CASE_ENV]))


def typed(rows: Any) -> Any:
    """The map journal's ``key``/``value`` rows with typed columns derived from the key."""
    return rows.selectExpr(
        "CAST(key AS BIGINT) AS id",
        "value",
        "CAST(CAST(key AS DECIMAL(20, 4)) / 8 AS DECIMAL(20, 4)) AS amount",
        "TIMESTAMP_SECONDS(CAST(key AS BIGINT) * 3600) AS at",
    )


def map_rows(spark: Any, case: dict[str, Any], **fence: str) -> Any:
    """The map journal as a stream; ``fence``: a plain session's ``epochal.*`` options."""
    options = {"path": case["journal"], "map": "input", "maxRecordsPerBatch": str(PER_BATCH)}
    return spark.readStream.format("epochal.map").options(**options, **fence).load()


def to_delta(spark: Any) -> Any:
    """Pipeline 1: the map journal into Delta table ``case["table"]``."""
    case = case_spec()
    rows = typed(map_rows(spark, case))
    return rows.writeStream.format("delta").option("path", case["table"]).outputMode("append")


def from_delta(spark: Any) -> Any:
    """Pipeline 3: Delta table ``case["table"]`` into the map sink, two-phase commit."""
    case = case_spec()
    rows = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", "3")
        .load(case["table"])
        .selectExpr("CAST(id AS STRING) AS key", "value")
    )
    sink = {"path": case["output"], "map": "output", "mode": "transactional"}
    return rows.writeStream.format("epochal.map").options(**sink).outputMode("append")


def delta_conf(jars: str) -> dict[str, str]:
    """The session settings of Delta's jars, its SQL extension and its catalog."""
    return {
        "spark.jars": jars,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
    }


def wrong_records(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Lost, duplicated and wrong records among ``(id, value, amount, at)`` rows (or
    ``(id, value)``) of ids ``0 .. RECORDS-1``."""
    import datetime as dt

    ids = [int(r[0]) for r in rows]
    seen = set(ids)
    wrong = []
    for row in rows:
        i = int(row[0])
        expected: tuple[Any, ...] = (f"v{i}",)
        if len(row) > 2:
            at = dt.datetime(1970, 1, 1) + dt.timedelta(hours=i)
            expected += (Decimal(i) / 8, at)
        got = tuple(row[1:])
        if len(row) > 2:
            got = (row[1], Decimal(row[2]), row[3].replace(tzinfo=None))
        if got != expected:
            wrong.append([i, repr(got), repr(expected)])
    return {
        "records": len(rows),
        "lost": RECORDS - len(seen & set(range(RECORDS))),
        "duplicated": len(ids) - len(seen),
        "wrong": wrong[:5],
        "wrong_count": len(wrong),
    }


def _run_job(name: str, target: str, case: dict[str, Any], faults: str, root: Path) -> dict:
    from epochal import Job, JobConfig, JobStatus

    os.environ[CASE_ENV] = json.dumps(case)
    config = JobConfig(
        snapshot_dir=str(root / "snapshots"),
        available_now=True,
        master="local[2]",
        spark_conf=delta_conf(case["jars"]),
        faults=faults,
    )
    job = Job.submit(name, target, config, report=lambda line: None)
    record = job.join(900)
    fired = sorted(p.name for p in (root / "snapshots" / name / "faults").glob("*"))
    return {
        "status": str(record.status),
        "completed": record.status == JobStatus.COMPLETED,
        "failure": str(record.failure or ""),
        "faults_fired": fired,
    }


def _plain_session_window(spark: Any, case: dict[str, Any], root: Path) -> dict[str, Any]:
    """Case 2: a plain session's query into a second table, then the state of a driver
    killed between Delta's commit of the last batch and Spark's commit log."""
    table, checkpoint = str(root / "table-2"), root / "checkpoint-2"
    fence = {"epochal.snapshotDir": str(root / "session-snapshots"), "epochal.job": "window"}

    def run_query() -> None:
        query = (
            typed(map_rows(spark, case, **fence))
            .writeStream.format("delta")
            .option("path", table)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(600)

    run_query()
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]
    versions_before = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").count()
    # Delta holds batch `last`; Spark's commit log does not (nor the entry's checksum file)
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run_query()
    replayed = (checkpoint / "commits" / str(last)).exists()
    versions_after = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").count()
    rows = [tuple(r) for r in spark.read.format("delta").load(table).collect()]
    return {
        **wrong_records(rows),
        "batches": len(commits),
        "replayed_batch": last,
        "replay_committed": replayed,
        "versions_before": versions_before,
        "versions_after": versions_after,
    }


def main() -> None:
    """Run the three cases in ``sys.argv[1]`` and print what was found."""
    from pyspark.sql import SparkSession

    from epochal_map.store import MapStore

    root, jars = Path(sys.argv[1]), sys.argv[2]
    journal = root / "journal.sqlite"
    with MapStore(str(journal)) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(RECORDS)])
    case = {"journal": str(journal), "table": str(root / "table-1"), "jars": jars}
    case["output"] = str(root / "output.sqlite")
    import epochal

    found: dict[str, Any] = {"epochal_from": epochal.__file__}
    faults = "source.after_read@1:driver > job.after_batch@3"
    found["to_delta_job"] = _run_job("to-delta", f"{MODULE}:to_delta", case, faults, root)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this environment's
    builder = SparkSession.builder.master("local[2]").appName("delta-reader")
    for key, value in delta_conf(jars).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    rows = [tuple(r) for r in spark.read.format("delta").load(case["table"]).collect()]
    found["to_delta"] = wrong_records(rows)
    found["window"] = _plain_session_window(spark, case, root)
    spark.stop()
    found["from_delta_job"] = _run_job(
        "from-delta", f"{MODULE}:from_delta", case, "sink.after_decision@1", root
    )
    with MapStore(case["output"]) as store:
        out = []
        for partition in store.journal_partitions("output"):
            end = store.journal_end("output", partition)
            out += [(k, v) for _, k, v, _ in store.journal_read("output", partition, 0, end)]
        found["from_delta_in_doubt"] = store.in_doubt("ep.")
    found["from_delta"] = wrong_records(out)
    print("FOUND " + json.dumps(found, default=str))


if __name__ == "__main__":
    main()
