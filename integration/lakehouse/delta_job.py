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
import time
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


def map_rows(spark: Any, case: dict[str, Any], journal_map: str = "input", **fence: str) -> Any:
    """The journal of map ``journal_map`` as a stream; ``fence``: a plain session's
    ``epochal.*`` options."""
    options = {"path": case["journal"], "map": journal_map, "maxRecordsPerBatch": str(PER_BATCH)}
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


def table_rows(spark: Any, table_format: str, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` (Iceberg's by its name, Delta's by its directory), read by the
    format's own reader."""
    if table_format == "iceberg":
        spark.sql(f"REFRESH TABLE {table}")
        return [tuple(r) for r in spark.table(table).collect()]
    if not (Path(table) / "_delta_log").is_dir():  # before the first commit
        return []
    return [tuple(r) for r in spark.read.format("delta").load(table).collect()]


def batch_versions(spark: Any, table_format: str, table: str, batch: int) -> int:
    """How many versions of ``table`` a streaming query's batch ``batch`` wrote: Delta's
    history entries, Iceberg's snapshots, that name it as their epoch."""
    if table_format == "iceberg":
        spark.sql(f"REFRESH TABLE {table}")
        query = f"SELECT * FROM {table}.snapshots WHERE summary['spark.sql.streaming.epochId']"
        return int(spark.sql(f"{query} = '{batch}'").count())
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`")
    return int(history.where(f"operationParameters['epochId'] = '{batch}'").count())


def _logged_batches(checkpoint: Path, log: str) -> list[int]:
    """The batch ids in the query's ``offsets`` or ``commits`` log."""
    if not (checkpoint / log).is_dir():
        return []
    return sorted(int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit())


def plain_session_window(
    spark: Any,
    case: dict[str, Any],
    root: Path,
    table: str,
    trigger: dict[str, Any],
    chunks: int = 1,
) -> dict[str, Any]:
    """A plain session's query (Spark finds ``epochal.map`` by itself) of the journal's map
    ``window`` into ``table`` of the format ``case["format"]`` (Delta unless said) at
    ``trigger``, its records appended in ``chunks`` parts, each once the batch of the one
    before is committed (a processing-time trigger before Spark 4.2 puts all a source has in
    one batch), stopped once every record is committed; then the state a driver killed
    between the format's commit of the last batch and Spark's commit log leaves (the batch's
    offsets logged, its commit-log entry and checksum removed), and the query started again
    on it: Spark runs that batch again and the format must skip it, writing no second
    version."""
    table_format = case.get("format", "delta")
    checkpoint = root / "checkpoint-window"
    fence = {"epochal.snapshotDir": str(root / "session-snapshots"), "epochal.job": "window"}
    size = RECORDS // chunks

    def append(chunk: int) -> None:
        from epochal_map.store import MapStore

        with MapStore(case["journal"]) as store:
            ids = range(chunk * size, RECORDS if chunk == chunks - 1 else (chunk + 1) * size)
            store.append_events("window", [(str(i), f"v{i}") for i in ids])

    def run_query(done: Any) -> None:
        writer = (
            typed(map_rows(spark, case, "window", **fence))
            .writeStream.format(table_format)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
        )
        query = writer.toTable(table) if table_format == "iceberg" else writer.start(table)
        deadline = time.monotonic() + 600
        while query.isActive and not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"the plain session's query did not finish: {query.status}")
            query.awaitTermination(0.5)
        query.stop()
        if query.exception() is not None:
            raise AssertionError(f"the plain session's query failed: {query.exception()}")

    appended = 0

    def caught_up() -> bool:
        nonlocal appended
        commits = _logged_batches(checkpoint, "commits")
        if appended < chunks and len(commits) >= appended:  # the input keeps arriving
            append(appended)
            appended += 1
            return False
        offsets = _logged_batches(checkpoint, "offsets")
        return (
            bool(commits)
            and commits[-1] == offsets[-1]
            and (len(table_rows(spark, table_format, table)) >= RECORDS)
        )

    append(0)
    appended = 1
    run_query(caught_up)
    commits = _logged_batches(checkpoint, "commits")
    last = commits[-1]
    versions_before = batch_versions(spark, table_format, table, last)
    # the format holds batch `last`; Spark's commit log does not (nor the entry's checksum)
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run_query(lambda: (checkpoint / "commits" / str(last)).exists())
    return {
        **wrong_records(table_rows(spark, table_format, table)),
        "batches": len(commits),
        "replayed_batch": last,
        "replay_committed": (checkpoint / "commits" / str(last)).exists(),
        "versions_before": versions_before,
        "versions_after": batch_versions(spark, table_format, table, last),
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
    found["to_delta"] = wrong_records(table_rows(spark, "delta", case["table"]))
    window_table, available_now = str(root / "table-2"), {"availableNow": True}
    found["window"] = plain_session_window(spark, case, root, window_table, available_now)
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
