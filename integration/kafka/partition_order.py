"""Which Kafka partition each Spark partition of a batch reads, live and replayed: ``python -m
integration.kafka.partition_order <bootstrap> <topic> <format> [<format> ...]`` prints, for
each format, one JSON line ``{"format": ..., "live": [[spark partition, kafka partition],
...], "replay": [...]}``.

Each format reads the whole topic from a new checkpoint in two batches
(``maxOffsetsPerTrigger``), then reads again from the same checkpoint with the last batch's
commit removed, so Spark replays that batch from its offset log; ``live`` is the last batch
of the first run, ``replay`` the batch of the second. The caller puts the formats' jars in
``spark.jars`` (``EPOCHAL_PROBE_JARS``, comma-separated).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
from typing import Any


def _read(
    spark: Any, fmt: str, bootstrap: str, topic: str, checkpoint: str, per_batch: int
) -> list[list[list[int]]]:
    """Each batch's ``(spark partition, kafka partition)`` pairs, of one run to the end."""
    seen: list[list[list[int]]] = []

    def record(frame: Any, _batch: int) -> None:
        rows = frame.selectExpr("spark_partition_id() AS task", "partition").distinct().collect()
        seen.append(sorted([int(r.task), int(r.partition)] for r in rows))

    query = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_batch))
        .load()
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return seen


def _forget_last_commit(checkpoint: str) -> None:
    commits = glob.glob(f"{checkpoint}/commits/[0-9]*")
    last = max(commits, key=lambda path: int(os.path.basename(path)))
    os.remove(last)
    crc = os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")
    if os.path.exists(crc):
        os.remove(crc)


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    bootstrap, topic, *formats = argv
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", os.environ.get("EPOCHAL_PROBE_JARS", ""))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    for fmt in formats:
        with tempfile.TemporaryDirectory(prefix="epochal-order-") as checkpoint:
            total = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            records = total.option("subscribe", topic).load().count()
            per_batch = max(1, records // 2)
            live = _read(spark, fmt, bootstrap, topic, checkpoint, per_batch)[-1]
            _forget_last_commit(checkpoint)
            replay = _read(spark, fmt, bootstrap, topic, checkpoint, per_batch)[0]
        print(json.dumps({"format": fmt, "live": live, "replay": replay}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
