"""The floor under any cold recovery: plain PySpark, no epochal, in a new process.

    python -m integration.bench.pyspark_floor [--rows 160] [--keys 20000] [--pad 50]

A new Python process starts a SparkSession (``local[2]``, RocksDB state store, two shuffle
partitions: the recovery benchmark's job's settings, with the same JVM start-up tuning that
epochal's drivers get: the fast ``SPARK_HOME`` and the class-data archive when one was
prepared) and runs the recovery benchmark's query shape to its first committed batch: a
Python streaming source (one batch of ``--rows`` keyed rows, made in memory) → the same
keyed ``applyInPandasWithState`` with padded state → a Python streaming sink that does
nothing. There is no state to load (a new checkpoint) and nothing to connect to, so a cold
recovery, which also loads the job's state and talks to real connectors, cannot be faster.

``--shape demo`` runs the job of ``python -m epochal demo`` instead (the same settings as
its driver: four shuffle partitions; one batch of 500 events, the demo's read limit → its
running totals per user, ``epochal.pipelines.running_totals``, plain PySpark code → a sink
that does nothing): the floor under the demo job's cold recovery.

It prints one JSON line: seconds from the process's launch (``--launched``, a Unix time; the
module's own start when not given) to each step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

FORMAT = "pyspark-floor"
SHAPES = ("counts", "demo")
"""The query shapes: the recovery benchmark's padded keyed count, or the demo's job."""
COUNTS_SHUFFLE_PARTITIONS = "2"
"""The recovery benchmark's counts job's shuffle partitions, here and in its epochal job (the
demo's: an epochal driver's default, ``epochal.startup.session.SHUFFLE_PARTITIONS``)."""
DEMO_ROWS = 500
"""The demo's read limit per batch (``epochal.ops.demo``)."""


def session(shape: str = "counts") -> Any:
    """A SparkSession as the benchmark's (or, ``shape`` demo, the demo's) job gets one,
    without epochal."""
    from pyspark.sql import SparkSession

    from epochal.startup.classdata import driver_java_options
    from epochal.startup.home import use_fast_spark_home
    from epochal.startup.session import SHUFFLE_PARTITIONS

    use_fast_spark_home("local[2]")
    return (
        SparkSession.builder.master("local[2]")
        .appName("pyspark-floor")
        .config("spark.ui.enabled", "false")
        .config(
            "spark.sql.shuffle.partitions",
            SHUFFLE_PARTITIONS if shape == "demo" else COUNTS_SHUFFLE_PARTITIONS,
        )
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.driver.extraJavaOptions", driver_java_options(""))
        .getOrCreate()
    )


def data_source(rows: int, keys: int) -> type:
    """A Python streaming source of one batch of ``rows`` rows (``key``: one of ``keys``
    keys, ``id``: counting up) and a sink that keeps nothing (no connector behind either)."""
    import pyarrow as pa
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"batch": 0}

        def latestOffset(self) -> dict:
            return {"batch": 1}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            yield pa.RecordBatch.from_pydict(
                {"key": [f"k{i % keys}" for i in range(rows)], "id": list(range(rows))}
            )

        def commit(self, end: dict) -> None:
            """Nothing to settle."""

    class Writer(DataSourceStreamArrowWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list, batchId: int) -> None:
            """Nothing to commit."""

        def abort(self, messages: list, batchId: int) -> None:
            """Nothing to abort."""

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return "key string, id long"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

        def streamWriter(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    return Floor


def counts(events: Any, pad: str) -> Any:
    """The recovery benchmark's stateful step (see ``integration.bench.recovery.pipeline``)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    def update(key: tuple[str], frames: Any, state: Any) -> Any:
        import pandas as pd

        count = state.get[0] if state.exists else 0
        for frame in frames:
            count += len(frame)
        state.update((count, pad))
        yield pd.DataFrame({"key": [key[0]], "value": [str(count)]})

    return events.groupBy("key").applyInPandasWithState(
        update,
        outputStructType="key string, value string",
        stateStructType="n long, pad string",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def query_of(frame: Any, shape: str, pad: int) -> Any:
    """The shape's stateful step over the source's rows."""
    if shape == "demo":
        from epochal.pipelines import running_totals  # plain PySpark: applyInPandasWithState

        return running_totals(frame.selectExpr("key AS user", "id"), "user")
    return counts(frame.select("key"), "x" * pad)


def measure(
    launched: float, rows: int, keys: int, pad: int, shape: str = "counts"
) -> dict[str, float]:
    """Seconds from ``launched`` to each step of the start, up to the first batch."""
    steps = {"python": time.time()}
    spark = session(shape)
    steps["session"] = time.time()
    spark.dataSource.register(data_source(rows, keys))
    steps["register"] = time.time()
    checkpoint = tempfile.mkdtemp(prefix="pyspark-floor-")
    try:
        frame = spark.readStream.format(FORMAT).load()
        query = (
            query_of(frame, shape, pad)
            .writeStream.format(FORMAT)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )
        steps["query start"] = time.time()
        while query.lastProgress is None:
            if query.awaitTermination(0.02):
                raise RuntimeError(f"the query ended before its first batch: {query.exception()}")
        steps["first batch"] = time.time()
        query.stop()
    finally:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    result, previous = {}, launched
    for name, moment in steps.items():
        result[name] = round(moment - previous, 3)
        previous = moment
    result["total"] = round(steps["first batch"] - launched, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.bench.pyspark_floor")
    parser.add_argument("--launched", type=float, help="Unix time the process was launched")
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="counts",
        help="the recovery benchmark's keyed count, or the demo's job (default: %(default)s)",
    )
    parser.add_argument("--rows", type=int, help="rows in the first batch (default: 160; demo 500)")
    parser.add_argument(
        "--keys", type=int, help="keys the rows cycle over (default: 20000; demo 25)"
    )
    parser.add_argument("--pad", type=int, default=50, help="characters of padding per key")
    args = parser.parse_args(argv)
    demo = args.shape == "demo"
    rows = args.rows or (DEMO_ROWS if demo else 160)
    if demo:
        from epochal.ops.demo import USERS
    keys = args.keys or (USERS if demo else 20_000)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    launched = args.launched or time.time()
    print(json.dumps(measure(launched, rows, keys, args.pad, args.shape)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
