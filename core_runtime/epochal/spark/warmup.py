"""A warm-up query: the code paths a job's first batch needs, run on data that touches
nothing outside the process, so a standby driver (or a driver that was just started) pays
the JVM's and PySpark's first-use costs before it is needed.

It runs a Python streaming source and a Python streaming sink (planner workers, the source
runner, the PySpark daemon and task workers, the commit worker, whole-stage codegen), with a
keyed stateful operator in between (the state store provider and its native library, pandas
in the workers), through two micro-batches of an available-now query with its own throw-away
checkpoint.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

FORMAT = "epochal-warmup"
BATCHES = 2
ROWS = 64


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def prepareForTriggerAvailableNow(self) -> None:
        """Read both batches, then stop."""

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"batch": min(int(start["batch"]) + 1, BATCHES)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(b) for b in range(int(start["batch"]), int(end["batch"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        base = int(partition.value) * ROWS  # type: ignore[attr-defined]
        yield pa.RecordBatch.from_pydict(
            {"id": list(range(base, base + ROWS)), "value": [str(i) for i in range(ROWS)]}
        )

    def commit(self, end: dict) -> None:
        """Nothing to settle."""


class _Writer(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to commit."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to abort."""


class WarmupDataSource(DataSource):
    """Two small batches in, nothing out."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return "id long, value string"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _Reader()

    def streamWriter(self, schema: StructType, overwrite: bool) -> _Writer:
        return _Writer()


def warm_up(spark: Any, stop_if: Callable[[], bool] = lambda: False) -> float:
    """Run the warm-up query on ``spark``; returns how long it took (seconds). It is stopped
    early when ``stop_if()`` turns true (a job is waiting for this driver)."""
    started = time.monotonic()
    spark.dataSource.register(WarmupDataSource)
    checkpoint = tempfile.mkdtemp(prefix="epochal-warmup-")
    try:
        from epochal.testing.pipelines import running_totals

        frame = spark.readStream.format(FORMAT).load()
        grouped = running_totals(frame, "id % 4")
        query = (
            grouped.writeStream.format(FORMAT)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        while not query.awaitTermination(0.2):
            if stop_if():
                query.stop()
                break
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return time.monotonic() - started
