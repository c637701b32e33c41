"""A user's PySpark application, as it would run on YARN in cluster mode: Kafka → PostgreSQL
exactly-once with epochal's formats, the job in the options, no supervisor. YARN starts it
(and starts it again, as a new application attempt) in the ApplicationMaster's container.

``kafka_to_postgres_app.py SPEC``: ``SPEC`` is a JSON file (readable by its owner only: it
holds the database's connection string) with ``bootstrap``, ``topic``, ``dsn``, ``job``,
``snapshot_dir``, ``checkpoint``, ``per_batch``, ``lease_ttl`` and ``stop`` (a file whose
appearance ends the application). The query runs until then; a failed query fails the
attempt (exit 1), and YARN starts the next one.
"""

from __future__ import annotations

import json
import os
import sys


def main(spec_path: str) -> int:
    """Run the query until the stop file appears."""
    with open(spec_path) as fh:
        spec = json.load(fh)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("kafka-to-postgres").getOrCreate()
    job = {
        "epochal.job": spec["job"],
        "epochal.snapshotDir": spec["snapshot_dir"],
        "epochal.leaseTtl": str(spec["lease_ttl"]),
    }
    events = (
        spark.readStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", spec["bootstrap"])
        .option("subscribe", spec["topic"])
        .option("maxRecordsPerBatch", str(spec["per_batch"]))
        .options(**job)
        .load()
    )
    rows = events.selectExpr("CAST(key AS STRING) AS id", "CAST(value AS STRING) AS payload")
    query = (
        rows.writeStream.format("epochal.jdbc")
        .option("url", spec["dsn"])
        .option("table", "events")
        .option("createTable", "true")
        .option("mode", "transactional")
        .options(**job)
        .option("checkpointLocation", spec["checkpoint"])
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    while not os.path.exists(spec["stop"]):
        if query.awaitTermination(0.5):
            break  # it failed (or was stopped): its exception, if any, fails the attempt
    if query.exception() is not None:
        sys.stderr.write(f"kafka-to-postgres: the query failed: {query.exception()}\n")
        return 1
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
