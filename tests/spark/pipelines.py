"""Pipelines for the Spark job tests; parameters come from the environment."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from epochal.startup.warmup import WARMUP_QUERY_PREFIX


def copy(spark: Any) -> Any:
    """map journal 'input' → map 'output' (the sink connector from EPOCHAL_TEST_SINK, the
    map from EPOCHAL_TEST_OUTPUT when set: a change of the job's code to another sink).
    Changes of the job's code that keep its parts: EPOCHAL_TEST_VALUE_PREFIX puts a prefix
    before each value (a changed transformation), EPOCHAL_TEST_PARTITIONS repartitions the
    sink's input into that many Spark partitions (a changed parallelism),
    EPOCHAL_TEST_SHUFFLE_PARTITIONS sets ``spark.sql.shuffle.partitions`` and shuffles the
    sink's input by key (a changed number of shuffle partitions; adaptive execution's
    coalescing is off, or it would merge 50 records into one partition)."""
    frame = events(spark)
    shuffle = os.environ.get("EPOCHAL_TEST_SHUFFLE_PARTITIONS")
    if shuffle:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
        frame = frame.repartition("key")
    prefix = os.environ.get("EPOCHAL_TEST_VALUE_PREFIX")
    if prefix:
        frame = frame.selectExpr("key", f"concat('{prefix}', value) AS value")
    partitions = os.environ.get("EPOCHAL_TEST_PARTITIONS")
    if partitions:
        frame = frame.repartition(int(partitions))
    return _to_output(frame)


def events(spark: Any) -> Any:
    """The map journal 'input' (200 events), 50 a batch: ``key``, ``value``."""
    return (
        spark.readStream.format("epochal.map")
        .option("path", os.environ["EPOCHAL_TEST_MAP"])
        .option("map", "input")
        .option("maxRecordsPerBatch", "50")
        .load()
        .selectExpr("key", "value")
    )


def _to_output(frame: Any) -> Any:
    sink = os.environ.get("EPOCHAL_TEST_SINK", "map")
    writer = (
        frame.writeStream.format(f"epochal.{sink}")
        .option("path", os.environ["EPOCHAL_TEST_MAP"])
        .option("map", os.environ.get("EPOCHAL_TEST_OUTPUT", "output"))
        .option("mode", "transactional")
    )
    lowered = os.environ.get("EPOCHAL_TEST_SINK_GUARANTEE")
    return writer.option("guarantee", lowered) if lowered else writer


def broken(spark: Any) -> Any:
    """User code with a bug: it fails the same way on every run."""
    raise ZeroDivisionError("a bug in the pipeline")


def stops_itself_once(spark: Any) -> Any:
    """The copy pipeline, plus code in the driver that stops the job's query once, after its
    first batch, without an error (a library calling ``query.stop()``; Spark ending a query)."""
    marker = os.environ["EPOCHAL_TEST_MAP"] + ".stopped"
    if not os.path.exists(marker):

        def stop_after_first_batch() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                for query in spark.streams.active:
                    if (query.name or "").startswith(WARMUP_QUERY_PREFIX):
                        continue  # a warm driver's warm-up query, stopping in the background
                    if query.lastProgress is not None:
                        open(marker, "w").close()
                        query.stop()
                        return
                time.sleep(0.1)

        threading.Thread(target=stop_after_first_batch, daemon=True).start()
    return copy(spark)


def held_once(spark: Any) -> Any:
    """The copy pipeline with a step that holds the first batch it sees until the file
    ``<map>.release`` exists, after writing the pid of each Python worker it holds in to
    ``<map>.pids`` (the test kills the source runner while the batch is held)."""
    release = os.environ["EPOCHAL_TEST_MAP"] + ".release"
    pids = os.environ["EPOCHAL_TEST_MAP"] + ".pids"

    def hold(frames: Any) -> Any:
        import os
        import time

        for frame in frames:
            if not os.path.exists(release):
                with open(pids, "a") as fh:
                    fh.write(f"{os.getpid()}\n")
                deadline = time.monotonic() + 300
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)
            yield frame

    return _to_output(events(spark).mapInPandas(hold, "key string, value string"))


SECRETS = ("pw-5ecret-0ne", "tok-5ecret-tw0", "url-5ecret-thr3e")
"""What :func:`copy_with_secrets` gives its sink; the test looks for them everywhere."""


def copy_with_secrets(spark: Any) -> Any:
    """The copy pipeline whose sink options carry secrets three ways: an option named like
    a secret, a ``${file:...}`` reference (EPOCHAL_TEST_TOKEN_FILE names the file), a
    password inside a URL."""
    return (
        _to_output(events(spark))
        .option("password", SECRETS[0])
        .option("token", "${file:" + os.environ["EPOCHAL_TEST_TOKEN_FILE"] + "}")
        .option("endpoint", f"https://app:{SECRETS[2]}@vault.example:8200/v1")
    )
