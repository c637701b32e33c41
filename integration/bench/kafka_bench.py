"""Kafka throughput benchmark: one topic, one copy pipeline (Kafka → Kafka), four ways.

    python -m integration.bench.kafka_bench [--records 500000] [--batch 100000]

* ``epochal exactly-once``: ``epochal.kafka`` source + sink, ``mode=transactional``;
* ``epochal at-least-once``: the same with ``mode=idempotent`` and an at-least-once job;
* ``spark built-in``: Spark's JVM Kafka connector (``spark-sql-kafka-0-10_2.13``, fetched with
  Maven from Maven Central into the harness cache and passed with ``spark.jars``);
* ``confluent-kafka loop``: a plain consume → produce loop in one Python process (the
  client's ceiling).

Every Spark variant runs in the same SparkSession (``local[2]``), ``Trigger.AvailableNow``
with the same per-batch read limit; records/s counts the records of the batches over their
summed durations (query start-up excluded), and per-batch latency is the trigger execution
time Spark reports. Prints a table with the ratios. The broker comes from the harness (or
``EPOCHAL_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from integration.bench.common import Result, run_available_now

SPARK_KAFKA_VERSION = "4.2.0"
"""spark-sql-kafka-0-10_2.13 4.3.0 (matching pyspark 4.3.0) is not on Maven Central; 4.2.0 is
the newest published one. Its ``spark-token-provider-kafka`` dependency is only on Central
up to 4.0.0 here, so that one is pinned to 4.0.0 (only used for delegation tokens)."""
TOKEN_PROVIDER_VERSION = "4.0.0"
CENTRAL = "https://repo.maven.apache.org/maven2"
PARTITIONS = 2
VALUE_BYTES = 100

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>epochal.bench</groupId><artifactId>spark-kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_2.13</artifactId><version>{spark}</version>
      <exclusions><exclusion><groupId>org.apache.spark</groupId>
        <artifactId>spark-token-provider-kafka-0-10_2.13</artifactId></exclusion></exclusions>
    </dependency>
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>spark-token-provider-kafka-0-10_2.13</artifactId><version>{token}</version>
    </dependency>
  </dependencies>
</project>
"""
_SETTINGS = f"""<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>
<url>{CENTRAL}</url></mirror></mirrors></settings>
"""
_PROVIDED = ("scala-library", "spark-tags", "slf4j-api", "hadoop-client", "jsr305")
"""Jars pyspark already ships (a second copy on the class path would clash)."""


def spark_kafka_jars() -> list[str]:
    """The jars of Spark's Kafka connector and its runtime dependencies (cached)."""
    from integration.harness.cache import cache_dir

    entry = cache_dir() / f"spark-sql-kafka-{SPARK_KAFKA_VERSION}"
    libs = entry / "libs"
    if not (entry / ".complete").exists():
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        (entry / "pom.xml").write_text(
            _POM.format(spark=SPARK_KAFKA_VERSION, token=TOKEN_PROVIDER_VERSION)
        )
        (entry / "settings.xml").write_text(_SETTINGS)
        subprocess.run(
            [
                "mvn",
                "-B",
                "-q",
                "-s",
                "settings.xml",
                f"-Dmaven.repo.local={cache_dir() / 'm2'}",
                "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
                f"-DoutputDirectory={libs}",
                "-DincludeScope=runtime",
            ],
            cwd=entry,
            check=True,
            timeout=900,
        )
        (entry / ".complete").write_text(SPARK_KAFKA_VERSION + "\n")
    return sorted(str(p) for p in libs.glob("*.jar") if not p.name.startswith(_PROVIDED))


def produce_input(bootstrap: str, topic: str, records: int) -> None:
    """``records`` records (key = id, value = id padded to VALUE_BYTES) round-robin."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "acks": "all"}
    )
    pad = b"x" * (VALUE_BYTES - 10)
    for i in range(records):
        while True:
            try:
                producer.produce(
                    topic, b"%010d" % i + pad, str(i).encode(), partition=i % PARTITIONS
                )
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def count_output(bootstrap: str, topic: str) -> int:
    """How many records a read_committed reader sees in ``topic``."""
    from epochal_kafka.testing import read_to_end

    return len(read_to_end(bootstrap, topic, timeout=120))


def plain_loop(bootstrap: str, source: str, sink: str, records: int, batch: int) -> Result:
    """confluent-kafka consume → produce in one Python process; a "batch" is ``batch``
    records followed by a flush."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(source, p, 0) for p in range(PARTITIONS)])
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    done, latencies = 0, []
    started = time.perf_counter()
    batch_start = started
    in_batch = 0
    while done < records:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(message.error())
            while True:
                try:
                    producer.produce(sink, message.value(), message.key())
                    break
                except BufferError:
                    producer.poll(0.05)
            done += 1
            in_batch += 1
        producer.poll(0)
        if in_batch >= batch or done >= records:
            producer.flush(120)
            now = time.perf_counter()
            latencies.append((now - batch_start) * 1000)
            batch_start, in_batch = now, 0
    elapsed = time.perf_counter() - started
    consumer.close()
    return Result("confluent-kafka loop", done, elapsed, latencies)


def run_query(
    spark: Any, name: str, reader: Any, writer_format: str, writer_options: dict, checkpoint: str
) -> Result:
    """Run one availableNow query; figures from its progress reports."""
    progress = run_available_now(reader, writer_format, writer_options, checkpoint)
    rows = sum(p["numInputRows"] for p in progress)
    batch_ms = [float(p["durationMs"]["triggerExecution"]) for p in progress]
    names = sorted({k for p in progress for k in p["durationMs"]} - {"triggerExecution"})
    phases = {k: statistics.mean(float(p["durationMs"].get(k, 0)) for p in progress) for k in names}
    return Result(name, rows, sum(batch_ms) / 1000, batch_ms, phases=phases)


def warm_up(spark: Any, bootstrap: str, new_topic: Any, workdir: str, builtin: bool) -> None:
    """A small query per format first (not measured): Python workers, Arrow, the Kafka
    classes and the first connections are then ready for every measured variant alike."""
    small = new_topic()
    produce_input(bootstrap, small, 2_000)
    formats = [
        (
            "epochal.kafka",
            {
                "mode": "idempotent",
                "epochal.guarantee": "at-least-once",
                "epochal.snapshotDir": f"{workdir}/snap",
            },
        )
    ]
    if builtin:
        formats.append(("kafka", {"startingOffsets": "earliest"}))
    for index, (fmt, extra) in enumerate(formats):
        reader_options = {k: v for k, v in extra.items() if k != "mode"}
        reader = (
            spark.readStream.format(fmt)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", small)
            .options(**reader_options)
            .load()
            .select("key", "value")
        )
        writer_options = {k: v for k, v in extra.items() if k != "startingOffsets"}
        run_query(
            spark,
            "warm-up",
            reader,
            fmt,
            {"kafka.bootstrap.servers": bootstrap, "topic": new_topic(), **writer_options},
            f"{workdir}/cp-warm-{index}",
        )


def spark_variants(
    bootstrap: str,
    source: str,
    records: int,
    batch: int,
    workdir: str,
    new_topic: Any,
    use_builtin: bool,
) -> list[Result]:
    """The three Spark variants in one session."""
    from pyspark.sql import SparkSession

    from epochal.spark.datasource import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jars: list[str] = []
    note = ""
    if use_builtin:
        try:
            jars = spark_kafka_jars()
        except Exception as exc:  # report, run the rest
            note = f"jars not fetched: {exc}"
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("epochal-kafka-bench")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.metricsEnabled", "false")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark, ["kafka"])
    warm_up(spark, bootstrap, new_topic, workdir, bool(jars))
    results = []
    for mode, guarantee, label in (
        ("transactional", "exactly-once", "epochal exactly-once"),
        ("idempotent", "at-least-once", "epochal at-least-once"),
    ):
        out = new_topic()
        common = {
            "epochal.snapshotDir": f"{workdir}/snap",
            "epochal.guarantee": guarantee,
            "epochal.job": f"bench-{mode}",
        }
        reader = (
            spark.readStream.format("epochal.kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("maxRecordsPerBatch", str(batch))
            .options(**common)
            .load()
            .select("key", "value")
        )
        result = run_query(
            spark,
            label,
            reader,
            "epochal.kafka",
            {"kafka.bootstrap.servers": bootstrap, "topic": out, "mode": mode, **common},
            f"{workdir}/cp-{mode}",
        )
        result.note = f"{count_output(bootstrap, out)} records in the output topic"
        results.append(result)
    if jars:
        out = new_topic()
        try:
            reader = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", source)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(batch))
                .option("kafka.isolation.level", "read_committed")
                .load()
                .select("key", "value")
            )
            result = run_query(
                spark,
                "spark built-in",
                reader,
                "kafka",
                {"kafka.bootstrap.servers": bootstrap, "topic": out},
                f"{workdir}/cp-builtin",
            )
            result.note = (
                f"{count_output(bootstrap, out)} records in the output topic; "
                f"spark-sql-kafka {SPARK_KAFKA_VERSION}"
            )
        except Exception as exc:
            result = Result("spark built-in", 0, 0.0, [], f"failed: {str(exc)[:200]}")
        results.append(result)
    else:
        results.append(Result("spark built-in", 0, 0.0, [], note or "skipped"))
    spark.stop()
    return results


def table(results: list[Result]) -> str:
    """The figures with ratios to Spark's built-in connector and to the plain loop."""
    by_name = {r.name: r for r in results}
    builtin = by_name.get("spark built-in")
    loop = by_name.get("confluent-kafka loop")
    lines = [
        f"{'variant':24} {'records':>9} {'rec/s':>10} {'batch p50 ms':>13} {'batch max ms':>13} "
        f"{'vs built-in':>12} {'vs loop':>8}  note",
    ]
    for r in results:
        p50 = statistics.median(r.batch_ms) if r.batch_ms else 0.0
        worst = max(r.batch_ms) if r.batch_ms else 0.0
        vs_builtin = f"{r.rate / builtin.rate:.2f}x" if builtin and builtin.rate else "-"
        vs_loop = f"{r.rate / loop.rate:.2f}x" if loop and loop.rate else "-"
        lines.append(
            f"{r.name:24} {r.records:>9} {r.rate:>10.0f} {p50:>13.0f} {worst:>13.0f} "
            f"{vs_builtin:>12} {vs_loop:>8}  {r.note}"
        )
    lines.append("mean ms per batch by Spark phase:")
    for r in results:
        if r.phases:
            shown = ", ".join(f"{k} {v:.0f}" for k, v in r.phases.items() if v >= 1)
            lines.append(f"  {r.name:22} {shown}")
    eo, alo = by_name.get("epochal exactly-once"), by_name.get("epochal at-least-once")
    if eo and alo and alo.rate:
        lines.append(f"exactly-once / at-least-once = {eo.rate / alo.rate:.2f}")
    return "\n".join(lines)


def machine() -> str:
    """A one-line description of this machine."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return (
        f"{platform.platform()}, {os.cpu_count()} CPU(s) {cpu}, Python "
        f"{platform.python_version()}, load {load:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.kafka_bench")
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=100_000, help="records per batch")
    parser.add_argument("--no-builtin", action="store_true", help="skip Spark's connector")
    args = parser.parse_args(argv)

    from integration.harness.kafka import start_kafka

    server = start_kafka()
    workdir = tempfile.mkdtemp(prefix="epochal-kafka-bench-")
    topics: list[str] = []

    def new_topic() -> str:
        name = f"bench-{uuid.uuid4().hex[:10]}"
        server.create_topic(name, partitions=PARTITIONS)
        topics.append(name)
        return name

    try:
        print(f"machine: {machine()}")
        print(f"broker: Kafka {server.version} at {server.bootstrap_servers}")
        source = new_topic()
        started = time.perf_counter()
        produce_input(server.bootstrap_servers, source, args.records)
        print(
            f"input: {args.records} records of {VALUE_BYTES} B in {PARTITIONS} partitions "
            f"({time.perf_counter() - started:.1f}s to produce); {args.batch} per batch"
        )
        results = [
            plain_loop(server.bootstrap_servers, source, new_topic(), args.records, args.batch)
        ]
        results += spark_variants(
            server.bootstrap_servers,
            source,
            args.records,
            args.batch,
            workdir,
            new_topic,
            not args.no_builtin,
        )
        print(table(results))
    finally:
        for name in topics:
            server.delete_topic(name)
        server.backend.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
