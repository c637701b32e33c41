"""How a Kafka source format plans a micro-batch, and how its query ends when stopped while it
asks the broker for offsets: ``python -m integration.kafka.partition_order <bootstrap> <topic>
<partitions> <format> [<format> ...]`` prints one JSON line per format::

    {"format": ..., "planned": {"sorted": [...], "reversed": [...]}, "stopped": {...}}

``planned`` gives, for the batch from offset 0 to ``END`` of each of the topic's partitions,
the Kafka partition each Spark partition reads (index = Spark partition), once with the
batch's end offsets listed by ascending partition (as Spark's offset log lists them, so a
replayed batch) and once by descending partition (as a broker's answer may list them, so a
batch planned live). The stream is the format's own, built as Spark builds it (provider →
table → scan → micro-batch stream) and planned without running a task, so the listing order
is the only thing that differs between the two plans.

``stopped`` starts a query of the format whose broker never answers (a bound port that does
not listen), waits until the query asks it for offsets, stops it and gives the query's
``exception`` (``null`` for a clean stop) and whether it is still active.

The caller puts the formats' jars in ``spark.jars`` (``EPOCHAL_PROBE_JARS``, comma-separated).
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

END = 10
"""The end offset of every partition in the planned batch."""

ASK_TIMEOUT_MS = 2000
"""How long the stopped query's broker calls wait for the silent broker before they retry
(without end): Spark's Kafka source does not let a stop interrupt a call, it interrupts the
query when the call gives up."""
ASKING_DEADLINE_S = 120
"""How long the stop check waits for the query to start asking the silent broker (seconds
here; the test's limit on the whole probe is longer, so this one names what hung)."""
STOP_TIMEOUT_MS = 60_000
"""How long ``query.stop()`` waits for the query's thread (``spark.sql.streaming.stopTimeout``;
Spark's default waits without end): a stop that hangs fails with the query's threads' stacks,
within the test's limit on the whole probe."""

STACKS_AFTER_S = 240
"""When the probe prints its Python threads' stacks to stderr if it is still running (the
test gives it 300 s): a probe that hangs elsewhere than in a stop says where."""

PROVIDERS = {
    "kafka": "org.apache.spark.sql.kafka010.KafkaSourceProvider",
    "kafka-ordered": "org.epochal.spark.OrderedKafkaProvider",
}


def _offsets(topic: str, partitions: list[int], offset: int) -> str:
    """A Kafka source offset as Spark's offset log writes it, partitions in the given order."""
    return json.dumps({topic: {str(p): offset for p in partitions}})


def _plan(spark: Any, fmt: str, bootstrap: str, topic: str, partitions: list[int]) -> dict:
    """The Kafka partition each Spark partition reads, for end offsets listed each way."""
    jvm = spark._jvm
    options = jvm.java.util.HashMap()
    for key, value in {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
    }.items():
        options.put(key, value)
    case_insensitive = jvm.org.apache.spark.sql.util.CaseInsensitiveStringMap(options)
    provider_class: Any = jvm
    for name in PROVIDERS[fmt].split("."):
        provider_class = getattr(provider_class, name)
    provider = provider_class()
    no_transforms = spark.sparkContext._gateway.new_array(
        jvm.org.apache.spark.sql.connector.expressions.Transform, 0
    )
    table = provider.getTable(provider.inferSchema(case_insensitive), no_transforms, options)
    scan = table.newScanBuilder(case_insensitive).build()
    with tempfile.TemporaryDirectory(prefix="epochal-order-") as checkpoint:
        stream = scan.toMicroBatchStream(f"{checkpoint}/sources/0")
        try:
            start = stream.deserializeOffset(_offsets(topic, partitions, 0))
            planned = {}
            for name, listing in (("sorted", partitions), ("reversed", partitions[::-1])):
                end = stream.deserializeOffset(_offsets(topic, listing, END))
                planned[name] = [
                    p.offsetRange().topicPartition().partition()
                    for p in stream.planInputPartitions(start, end)
                ]
        finally:
            stream.stop()
    return planned


def _stopped_while_asking(spark: Any, fmt: str, topic: str) -> dict:
    """Stop a query of ``fmt`` while it waits for a broker that never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    try:
        with tempfile.TemporaryDirectory(prefix="epochal-stop-") as checkpoint:
            query = (
                spark.readStream.format(fmt)
                .option("kafka.bootstrap.servers", f"127.0.0.1:{silent.getsockname()[1]}")
                .option("subscribe", topic)
                .option("kafka.request.timeout.ms", str(ASK_TIMEOUT_MS))
                .option("kafka.default.api.timeout.ms", str(ASK_TIMEOUT_MS))
                .option("fetchOffset.numRetries", "1000")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .start()
            )
            deadline = time.monotonic() + ASKING_DEADLINE_S
            while query.isActive and "Getting offsets" not in str(query.status["message"]):
                if time.monotonic() > deadline:
                    query.stop()
                    raise TimeoutError(
                        f"a {fmt} query against a silent broker did not start asking it for "
                        f"offsets within {ASKING_DEADLINE_S} s: {query.status}"
                    )
                time.sleep(0.05)
            was_asking = query.isActive
            try:
                query.stop()
            except Exception as exc:  # the stop timed out: say where the query's thread is
                raise RuntimeError(
                    f"stopping a {fmt} query that asked a silent broker did not end within "
                    f"{STOP_TIMEOUT_MS} ms: {exc}\n{_stream_threads(spark)}"
                ) from None
            error = query.exception()
            return {
                "was_asking": was_asking,
                "active": query.isActive,
                "exception": None if error is None else str(error)[:2000],
            }
    finally:
        silent.close()


def _stream_threads(spark: Any) -> str:
    """The stacks of the driver JVM's stream execution threads."""
    lines = []
    for thread, frames in spark._jvm.java.lang.Thread.getAllStackTraces().items():
        if "stream execution" in thread.getName():
            lines.append(f"thread {thread.getName()} ({thread.getState()}):")
            lines += [f"    at {frame}" for frame in list(frames)[:40]]
    return "\n".join(lines) or "(no stream execution thread)"


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=False)
    bootstrap, topic, count, *formats = argv
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", os.environ.get("EPOCHAL_PROBE_JARS", ""))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.stopTimeout", str(STOP_TIMEOUT_MS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    partitions = list(range(int(count)))
    for fmt in formats:
        line = {
            "format": fmt,
            "planned": _plan(spark, fmt, bootstrap, topic, partitions),
            "stopped": _stopped_while_asking(spark, fmt, topic),
        }
        print(json.dumps(line), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
