"""Pipelines that mix Spark's own sources and sinks with epochal's, for
``test_spark_parts_in_jobs.py``; parameters come from the environment (the map file of the
``map_path`` fixture, ``EPOCHAL_TEST_IDEMPOTENT``)."""

from __future__ import annotations

import os
from typing import Any

from pipelines import events

from epochal.parts.spark_plan import IDEMPOTENT_FOREACH_BATCH
from epochal_map import MapStore


def socket_to_map(spark: Any) -> Any:
    """Spark's socket source → the map 'output' (2PC). Nothing listens on the port: the
    query is refused before it starts, or its source fails."""
    lines = spark.readStream.format("socket").option("host", "localhost").option("port", 9).load()
    return (
        lines.selectExpr("value AS key", "value")
        .writeStream.format("epochal.map")
        .option("path", os.environ["EPOCHAL_TEST_MAP"])
        .option("map", "output")
        .option("mode", "transactional")
    )


def map_to_console(spark: Any) -> Any:
    """The map journal → Spark's console sink."""
    return events(spark).writeStream.format("console")


def map_to_foreach_batch(spark: Any) -> Any:
    """The map journal → a ``foreachBatch`` function that upserts each batch's rows into the
    map 'output' by key (idempotent: a batch written again writes the same entries); declared
    idempotent when ``EPOCHAL_TEST_IDEMPOTENT`` is ``1``."""
    path = os.environ["EPOCHAL_TEST_MAP"]

    def upsert(batch: Any, batch_id: int) -> None:
        rows = [(str(row.key), str(row.value)) for row in batch.collect()]
        with MapStore(path) as store:
            store.put_all("output", rows)

    writer = events(spark).writeStream.foreachBatch(upsert)
    if os.environ.get("EPOCHAL_TEST_IDEMPOTENT") == "1":
        writer = writer.option(IDEMPOTENT_FOREACH_BATCH, "true")
    return writer
