"""A warm-up query: the code paths a job's first batch needs, run on data that touches
nothing outside the process, so a standby driver (or a driver that was just started) pays
the JVM's and PySpark's first-use costs before it is needed.

It runs a Python streaming source and a Python streaming sink (planner workers, the source
runner, the PySpark daemon and task workers, the commit worker, whole-stage codegen), with a
keyed stateful operator in between (the state store provider and its native library, pandas
in the workers), through two micro-batches of an available-now query with its own throw-away
checkpoint; then it starts the query again from that checkpoint for one more batch, which is
what a promoted standby does first: resume a query and load its state from the checkpoint
(the first load in a JVM costs about a second more than the next ones).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from epochal.spark import features

FORMAT = "epochal-warmup"
#: Batches of each start of the warm-up query: two on a new checkpoint, one after the restart.
BATCHES_PER_START = (2, 1)
#: PySpark kills the idle Python workers of a worker factory (one per worker module: task
#: workers, each planner, the commit runner) this long after the factory last got a worker
#: back (Spark's ``PythonWorkerFactory.IDLE_WORKER_TIMEOUT_NS``, which no setting changes)...
PYSPARK_IDLE_WORKER_SECONDS = 60
#: ...when its monitor looks, which it does this often.
PYSPARK_IDLE_CHECK_SECONDS = 10
#: The workers a standby forked would then be forked again, with their imports, by its
#: first batch: a warm driver that keeps warm reruns one batch of the warm-up query this
#: often, well inside :data:`PYSPARK_IDLE_WORKER_SECONDS`.
KEEP_WARM_SECONDS = 40.0
#: Batches of the warm-up query that keeps a waiting driver warm: one, on a new checkpoint.
KEEP_WARM_BATCHES = (1,)
ROWS = 64


class _Reader(DataSourceStreamReader, features.trigger_available_now_base()):  # type: ignore[misc]
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def prepareForTriggerAvailableNow(self) -> None:
        """Read up to ``batches`` (the option), then stop."""

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """One batch more; all of them at once without admission control (Spark then asks
        once, at the start of the available-now query)."""
        if start is None:
            return {"batch": self.batches}
        return {"batch": min(int(start["batch"]) + 1, self.batches)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(b) for b in range(int(start["batch"]), int(end["batch"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        prime_worker()
        base = int(partition.value) * ROWS
        yield pa.RecordBatch.from_pydict(
            {"id": list(range(base, base + ROWS)), "value": [str(i) for i in range(ROWS)]}
        )

    def commit(self, end: dict) -> None:
        """Nothing to settle."""


class _Writer(features.stream_writer_base()):  # type: ignore[misc]
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        prime_worker()
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to commit (in the sink's commit runner: prime it)."""
        prime_worker()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to abort."""


class _BatchReader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"id": [0], "value": ["0"]})


class _BatchWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to commit."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to abort."""


_primed = False
"""Whether :func:`prime_worker` ran in this process."""


def prime_worker() -> None:
    """In a Python process Spark started for a query (a task worker; the planner workers that
    create the data source and plan its reads and writes; the source runner; the sink's commit
    runner): import epochal's data source layer and every installed connector (and its client
    library) once, as the job's first use of that process would, so a promoted standby's first
    batch finds them loaded (a failing connector is left to the job's own discovery, which
    reports it). Pooled processes are reused by the job's query; imports are done once per
    process."""
    global _primed
    if _primed:
        return
    _primed = True
    with contextlib.suppress(Exception):
        import epochal.spark.datasource  # noqa: F401
        from epochal.parts import registry

        for name in registry.installed_names():
            with contextlib.suppress(Exception):
                registry.connector(name)


class WarmupDataSource(DataSource):
    """A few small batches in (the option ``batches``: how many in all), nothing out."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        prime_worker()
        return "id long, value string"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        prime_worker()
        return _Reader(int(self.options.get("batches", BATCHES_PER_START[0])))

    def streamWriter(self, schema: StructType, overwrite: bool) -> _Writer:
        prime_worker()
        return _Writer()

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader()

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        return _BatchWriter()


def warm_up(
    spark: Any,
    stop_if: Callable[[], bool] = lambda: False,
    batches_per_start: tuple[int, ...] = BATCHES_PER_START,
) -> float:
    """Run the warm-up query on ``spark`` (and once more from its checkpoint, by default:
    one start per entry of ``batches_per_start``); returns how long it took (seconds). It
    is stopped early when ``stop_if()`` turns true (a job is waiting for this driver)."""
    started = time.monotonic()
    register(spark)
    _run(spark, stop_if, batches_per_start)
    return time.monotonic() - started


WARMUP_QUERY_PREFIX = "epochal-warmup-"
"""The warm-up queries' names start so (each start has its own, since a promotion stops the
last one in the background while the job's query starts): a job's code that looks at
``spark.streams.active`` can tell them from its own."""


def register(spark: Any) -> None:
    """Register the warm-up source with the session (once: again, Spark logs a warning)."""
    spark.dataSource.register(WarmupDataSource)


def _run(spark: Any, stop_if: Callable[[], bool], batches_per_start: tuple[int, ...]) -> float:
    """The warm-up query's starts, on a session with the source registered (see
    :func:`register`); returns how long they took (seconds)."""
    from epochal.pipelines import running_totals

    started = time.monotonic()
    checkpoint = tempfile.mkdtemp(prefix="epochal-warmup-")
    upto = 0
    try:
        for batches in batches_per_start:
            upto += batches
            frame = spark.readStream.format(FORMAT).option("batches", str(upto)).load()
            query = (
                running_totals(frame, "id % 4")
                .writeStream.format(FORMAT)
                .option("checkpointLocation", checkpoint)
                .queryName(f"{WARMUP_QUERY_PREFIX}{uuid.uuid4().hex[:12]}")
                .trigger(availableNow=True)
                .start()
            )
            while not query.awaitTermination(0.2):
                if stop_if():  # a job waits: it starts now, the warm-up query stops meanwhile
                    threading.Thread(
                        target=_stop, args=(query, checkpoint), name="epochal-warmup-stop"
                    ).start()
                    return time.monotonic() - started
    except BaseException:
        shutil.rmtree(checkpoint, ignore_errors=True)
        raise
    shutil.rmtree(checkpoint, ignore_errors=True)
    return time.monotonic() - started


def _stop(query: Any, checkpoint: str) -> None:
    """Stop a warm-up query that a promotion cut short (stopping waits for its tasks to be
    cancelled, up to a second, which the job's start need not wait for), then remove its
    checkpoint."""
    with contextlib.suppress(Exception):
        query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)


def keep_warm(spark: Any, stop_if: Callable[[], bool]) -> float:
    """One round of keeping a waiting driver warm (after :func:`warm_up` on ``spark``): a
    batch of the warm-up query, so each of PySpark's worker factories is used again before
    it kills its idle workers (see :data:`KEEP_WARM_SECONDS`); returns how long it took
    (seconds)."""
    return _run(spark, stop_if, KEEP_WARM_BATCHES)


#: The Spark job group of :func:`touch_planners`' jobs (not the job's own, for the driver).
KEEP_WARM_JOB_GROUP = "epochal-keep-warm"


def touch_planners(spark: Any) -> None:
    """Use the driver's planner workers once, with one row read and written in a batch
    through the warm-up source (Spark job group :data:`KEEP_WARM_JOB_GROUP`): the workers a
    query's start takes (creating its data sources, planning its read, its writer) are used
    only then, so while a job runs PySpark reaps them after a minute (see
    :data:`KEEP_WARM_SECONDS`), and a restart in place would fork them again and import the
    connectors in them again. The source must be registered (:func:`register`)."""
    from pyspark.sql import SparkSession

    context = spark.sparkContext
    # the writer looks its data source up in the JVM thread's active session, which a thread
    # of the driver's own does not have (PySpark sets it the same way in createDataFrame)
    SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
    context.setJobGroup(KEEP_WARM_JOB_GROUP, "epochal: keep the planner workers warm")
    try:
        spark.read.format(FORMAT).load().write.format(FORMAT).mode("append").save()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
