"""Pipelines for the Spark job tests; parameters come from the environment."""

from __future__ import annotations

import os
from typing import Any


def copy(spark: Any) -> Any:
    """map journal 'input' → map 'output' (the sink connector from EPOCHAL_TEST_SINK)."""
    path = os.environ["EPOCHAL_TEST_MAP"]
    sink = os.environ.get("EPOCHAL_TEST_SINK", "map")
    events = (
        spark.readStream.format("epochal.map")
        .option("path", path)
        .option("map", "input")
        .option("maxRecordsPerBatch", "50")
        .load()
    )
    writer = (
        events.selectExpr("key", "value")
        .writeStream.format(f"epochal.{sink}")
        .option("path", path)
        .option("map", "output")
        .option("mode", "transactional")
    )
    lowered = os.environ.get("EPOCHAL_TEST_SINK_GUARANTEE")
    return writer.option("guarantee", lowered) if lowered else writer


def broken(spark: Any) -> Any:
    """User code with a bug: it fails the same way on every run."""
    raise ZeroDivisionError("a bug in the pipeline")
