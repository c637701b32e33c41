"""PySpark's own floor under a batch of epochal's Python ways: a Python streaming source and a
Python streaming sink that do nothing but hand the records over.

The source makes each batch's records in memory (the benchmark's record shape: the id as the
key, a value of :data:`~integration.bench.kafka_bench.VALUE_BYTES` bytes) in as many tasks as
epochal's Kafka source would read them in (its ``minRecordsPerTask``); the sink counts the
Arrow rows it is given and commits nothing. No broker, no transaction, no epochal code runs in
a task: what such a batch costs is what PySpark's Python data source path costs (the driver's
planning workers, a Python worker per task on each side, Arrow across the JVM).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

FORMAT = "bench-floor"


def register(spark: Any, value_bytes: int, per_task: int) -> None:
    """Register the floor's data source in ``spark`` (its classes travel to the workers by
    value: nothing of this package need be importable there)."""
    spark.dataSource.register(_data_source(value_bytes, per_task))


def _data_source(value_bytes: int, per_task: int) -> type:
    import pyarrow as pa
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    from epochal.spark import features

    class Reader(DataSourceStreamReader, features.trigger_available_now_base()):  # type: ignore[misc]
        """Offsets count records: ``records`` of them in all, ``per_batch`` a batch."""

        def __init__(self, records: int, per_batch: int) -> None:
            self.records, self.per_batch, self.until, self.last = records, per_batch, records, 0

        def prepareForTriggerAvailableNow(self) -> None:
            self.until = self.records

        def initialOffset(self) -> dict:
            return {"at": 0}

        def getDefaultReadLimit(self) -> Any:
            return features.read_limit(self.per_batch)

        def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
            begin = int(start["at"]) if start is not None else self.last
            end = min(self.until, begin + self.per_batch)
            self.last = end
            return {"at": end}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            begin, stop = int(start["at"]), int(end["at"])
            tasks = max(1, (stop - begin) // per_task) if per_task else 1
            bounds = [begin + (stop - begin) * i // tasks for i in range(tasks + 1)]
            return [InputPartition((a, b)) for a, b in itertools.pairwise(bounds)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            first, end = partition.value  # type: ignore[attr-defined]
            ids = range(first, end)
            yield pa.RecordBatch.from_pydict(
                {
                    "key": [str(i).encode() for i in ids],
                    "value": [str(i).encode().ljust(value_bytes, b"x") for i in ids],
                }
            )

        def commit(self, end: dict) -> None:
            pass

    class Counted(WriterCommitMessage):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Writer(features.stream_writer_base()):  # type: ignore[misc]
        def write(self, iterator: Iterator[Any]) -> Any:
            rows = 0
            for item in iterator:
                rows += getattr(item, "num_rows", 1)
            return Counted(rows)

        def commit(self, messages: list, batchId: int) -> None:
            pass

        def abort(self, messages: list, batchId: int) -> None:
            pass

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return "key binary, value binary"

        def streamReader(self, schema: Any) -> Reader:
            return Reader(int(self.options["records"]), int(self.options["perBatch"]))

        def streamWriter(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    return Floor
