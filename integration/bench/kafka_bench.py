"""Kafka throughput benchmark: one topic, one copy pipeline (Kafka → Kafka), four ways,
measured in interleaved rounds.

    python -m integration.bench.kafka_bench [--rounds 16] [--batches 10] [--batch 100000]
        [--plot kafka-bench.png] [--json results.json] [--no-builtin] [--smoke]

``--smoke``: one round of three 2 000-record batches per variant, no warm-up (a check that the
command works, not a measurement).

* ``epochal exactly-once``: ``epochal.kafka`` source + sink, ``mode=transactional``;
* ``epochal at-least-once``: the same with ``mode=idempotent`` and an at-least-once job;
* ``spark built-in``: Spark's JVM Kafka connector (``spark-sql-kafka-0-10_2.13``, fetched with
  Maven from Maven Central into the harness cache and passed with ``spark.jars``);
* ``confluent-kafka loop``: a plain consume → produce loop in one Python process.

Each round runs every variant once, in a rotated order, over the same input topic
(``batches`` times ``batch`` records): a fresh query (new checkpoint, new epochal job, new
output topic) with ``Trigger.AvailableNow`` and the read limit ``batch``. Per-batch latency is
the ``triggerExecution`` time Spark reports (for the loop: ``batch`` records consumed,
produced and flushed). The first batch of a query (it pays the query's start) and the last
(an ``AvailableNow`` query's last batch takes ~0.4 s longer in every variant) are not
measured. A variant's figure in a round is its *throughput* = records per measured batch /
the median latency of its measured batches; the median makes one batch slowed by something
else on the machine (a GC, another process) count for one batch, not for the round. The
mean-based figure (records / summed latencies) is printed too.

Ratios (exactly-once / at-least-once, at-least-once / built-in, ...) are taken within each
round, so a slow moment of the machine hits both sides, and are reported as the median over
the rounds with the interquartile range and a bootstrap 95% interval of that median. Every
output topic is read back by an independent ``read_committed`` reader and must hold every
record exactly once (counted; a mismatch is printed). For exactly-once, the table also says
how many tasks found a producer their Python worker had kept (the others made a new one).

The Spark variants share one SparkSession (``local[2]``); a warm-up round (not measured)
runs first. The broker comes from the harness (or ``EPOCHAL_KAFKA_BOOTSTRAP``). The plot
(throughput per round, per-batch latency, the ratios per round) needs matplotlib:
``pip install matplotlib`` (not a dependency of the test suite: the benchmark is not run by
CI); without it the table is still printed. The defaults take about 15 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from epochal_kafka.source import FETCH_QUEUE_BACKOFF_MS

from integration.bench.common import (
    SMOKE_HELP,
    MeasuredBatches,
    Result,
    bench_session,
    epochal_options,
    mean_phases,
    quantile,
    rotated,
    run_available_now,
    smoke_run,
    spread,
    write_plot,
    write_runs,
)

EXACTLY_ONCE = "epochal exactly-once"
AT_LEAST_ONCE = "epochal at-least-once"
BUILTIN = "spark built-in"
LOOP = "confluent-kafka loop"
VARIANTS = (EXACTLY_ONCE, AT_LEAST_ONCE, BUILTIN, LOOP)
RATIOS = (
    (EXACTLY_ONCE, AT_LEAST_ONCE),
    (AT_LEAST_ONCE, BUILTIN),
    (EXACTLY_ONCE, BUILTIN),
    (AT_LEAST_ONCE, LOOP),
)
"""(numerator, denominator) of the ratios printed; the first three have targets."""
TARGETS = {
    f"{EXACTLY_ONCE} / {AT_LEAST_ONCE}": 0.95,
    f"{AT_LEAST_ONCE} / {BUILTIN}": 1.0,
    f"{EXACTLY_ONCE} / {BUILTIN}": 0.95,
}
"""The targets, drawn in the plot: exactly-once costs at most 5 % over at-least-once, and
epochal's Kafka source path keeps up with Spark's JVM connector (at-least-once at 1.0, the
exactly-once copy at 0.95)."""

SPARK_KAFKA_VERSION = "4.2.0"
"""spark-sql-kafka-0-10_2.13 4.3.0 (matching pyspark 4.3.0) is not on Maven Central; 4.2.0 is
the newest published one. Its ``spark-token-provider-kafka`` dependency is only on Central
up to 4.0.0 here, so that one is pinned to 4.0.0 (only used for delegation tokens)."""
TOKEN_PROVIDER_VERSION = "4.0.0"
SPARK_3_KAFKA = ("3.5.7", "2.12")
"""The connector for pyspark 3.5 (Scala 2.12): Spark 3.5's Kafka connector and token provider
of one release, compatible within 3.5.x."""
CENTRAL = "https://repo.maven.apache.org/maven2"
PARTITIONS = 2
VALUE_BYTES = 100

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>epochal.bench</groupId><artifactId>spark-kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_{scala}</artifactId><version>{spark}</version>
      <exclusions><exclusion><groupId>org.apache.spark</groupId>
        <artifactId>spark-token-provider-kafka-0-10_{scala}</artifactId></exclusion></exclusions>
    </dependency>
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>spark-token-provider-kafka-0-10_{scala}</artifactId><version>{token}</version>
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
    """The jars of Spark's Kafka connector and its runtime dependencies (cached), for the
    installed pyspark: 4.x's (:data:`SPARK_KAFKA_VERSION`), or 3.5's
    (:data:`SPARK_3_KAFKA`)."""
    import pyspark

    from integration.harness.cache import cache_dir

    version, token, scala = SPARK_KAFKA_VERSION, TOKEN_PROVIDER_VERSION, "2.13"
    if pyspark.__version__.startswith("3."):
        version, scala = SPARK_3_KAFKA
        token = version
    entry = cache_dir() / f"spark-sql-kafka-{version}"
    libs = entry / "libs"
    if not (entry / ".complete").exists():
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        (entry / "pom.xml").write_text(_POM.format(spark=version, token=token, scala=scala))
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
        (entry / ".complete").write_text(version + "\n")
    return sorted(str(p) for p in libs.glob("*.jar") if not p.name.startswith(_PROVIDED))


def produce_input(bootstrap: str, topic: str, records: int, partitions: int = PARTITIONS) -> None:
    """``records`` records (key = id, value = id padded to VALUE_BYTES) round-robin over
    ``partitions`` partitions."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "acks": "all"}
    )
    pad = b"x" * (VALUE_BYTES - 10)
    for i in range(records):
        while True:
            try:
                producer.produce(
                    topic, b"%010d" % i + pad, str(i).encode(), partition=i % partitions
                )
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def count_output(bootstrap: str, topic: str) -> int:
    """How many records a read_committed reader sees in ``topic``."""
    from epochal_kafka.testing import read_to_end

    return len(read_to_end(bootstrap, topic, timeout=120))


@dataclass
class Run(MeasuredBatches):
    """One variant in one round."""

    variant: str
    round: int
    batch_ms: list[float]
    batch_rows: list[int]
    phases: dict[str, float] = field(default_factory=dict)
    output: int = -1
    """Records a read_committed reader found in the output topic (-1: not counted)."""
    kept: tuple[int, int] = (0, 0)
    """Exactly-once: (tasks that used their worker's kept producer, tasks that wrote), from
    the prepared transactions in the runtime's commit decisions (all batches but the first)."""

    @property
    def mean_rate(self) -> float:
        """Records of the measured batches / their summed latencies (records/s)."""
        rows, ms = self.batch_rows[self._measured()], self.measured_ms
        return sum(rows) / (sum(ms) / 1000) if sum(ms) else 0.0


def plain_loop(
    bootstrap: str, source: str, sink: str, records: int, batch: int, partitions: int = PARTITIONS
) -> Result:
    """confluent-kafka consume → produce in one Python process; a "batch" is ``batch``
    records followed by a flush."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            # as the epochal source's readers: no 1 s fetch pause per 100 000 queued records
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    consumer.assign([TopicPartition(source, p, 0) for p in range(partitions)])
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            # room for a whole batch: a full local queue would make the loop sleep in poll()
            "queue.buffering.max.messages": 2 * batch + 10_000,
        }
    )
    done, latencies, rows = 0, [], []
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
            rows.append(in_batch)
            batch_start, in_batch = now, 0
    elapsed = time.perf_counter() - started
    consumer.close()
    return Result(LOOP, done, elapsed, latencies, batch_rows=rows)


def run_query(
    spark: Any, name: str, reader: Any, writer_format: str, writer_options: dict, checkpoint: str
) -> Result:
    """Run one availableNow query; figures from its progress reports."""
    progress = run_available_now(reader, writer_format, writer_options, checkpoint)
    rows = [int(p["numInputRows"]) for p in progress]
    batch_ms = [float(p["durationMs"]["triggerExecution"]) for p in progress]
    measured = progress[1:-1] if len(progress) >= 3 else progress  # as Run.measured_ms
    phases = mean_phases(measured)
    return Result(name, sum(rows), sum(batch_ms) / 1000, batch_ms, batch_rows=rows, phases=phases)


def epochal_kafka_reader(
    spark: Any, bootstrap: str, topic: str, limit: int, options: dict[str, str]
) -> Any:
    """A streaming DataFrame of ``epochal.kafka`` over ``topic``, at most ``limit`` records
    per batch, with the query's ``epochal.*`` ``options``."""
    return (
        spark.readStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("maxRecordsPerBatch", str(limit))
        .options(**options)
        .load()
    )


class Bench:
    """The variants on one broker and one SparkSession."""

    def __init__(
        self,
        server: Any,
        source: str,
        records: int,
        batch: int,
        workdir: str,
        jars: list[str],
        partitions: int = PARTITIONS,
    ) -> None:
        self.server, self.source, self.records, self.batch = server, source, records, batch
        self.partitions = partitions
        self.bootstrap = server.bootstrap_servers
        self.workdir = workdir
        self.jars = jars
        self.spark: Any = None
        self.topics: list[str] = []
        # The bench's own quiet client for its topics (librdkafka logs a notice for every
        # deleted topic a client had seen).
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def new_topic(self) -> str:
        """A fresh topic of the bench's partitions (deleted at the end)."""
        name = f"bench-{uuid.uuid4().hex[:10]}"
        self.admin.create_topics([NewTopic(name, self.partitions, 1)])[name].result(60)
        deadline = time.monotonic() + 60
        while True:
            topic = self.admin.list_topics(name, timeout=10).topics.get(name)
            partitions = topic.partitions if topic is not None and topic.error is None else {}
            if len(partitions) == self.partitions and all(
                p.leader >= 0 for p in partitions.values()
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name} has no partition leaders after 60s")
            time.sleep(0.05)
        self.topics.append(name)
        return name

    def drop_topic(self, name: str) -> None:
        """Delete a topic now (keeps the broker's disk and caches small between rounds)."""
        self.admin.delete_topics([name])[name].result(60)
        if name in self.topics:
            self.topics.remove(name)

    def close(self) -> None:
        """Stop the session and delete the topics left."""
        if self.spark is not None:
            self.spark.stop()
        for name in list(self.topics):
            self.drop_topic(name)

    def start_spark(self) -> None:
        """One SparkSession for every Spark variant."""
        conf = {"spark.sql.streaming.metricsEnabled": "false"}
        if self.jars:
            conf["spark.jars"] = ",".join(self.jars)
        self.spark = bench_session("epochal-kafka-bench", ["kafka"], **conf)

    def variants(self) -> list[str]:
        """The variants this run measures."""
        return [v for v in VARIANTS if v != BUILTIN or self.jars]

    def run(
        self, variant: str, turn: str, source: str = "", records: int = 0, limit: int = 0
    ) -> Run:
        """One query (or loop) of ``variant`` over ``source`` (``records`` records, ``limit``
        per batch; by default the input topic); ``turn`` names the round."""
        source, records = source or self.source, records or self.records
        limit = limit or self.batch
        out = self.new_topic()
        if variant == LOOP:
            result = plain_loop(self.bootstrap, source, out, records, limit, self.partitions)
        else:
            result = self.query(variant, source, out, limit, turn)
        run = Run(variant, -1, result.batch_ms, result.batch_rows or [], result.phases or {})
        run.output = count_output(self.bootstrap, out)
        if variant == EXACTLY_ONCE:
            run.kept = kept_producers(f"{self.workdir}/snap/bench-transactional-{turn}")
        self.drop_topic(out)
        return run

    def query(self, variant: str, source: str, out: str, limit: int, turn: str) -> Result:
        """One available-now query of a Spark ``variant`` (epochal's or Spark's connector)
        from topic ``source`` into topic ``out``, ``limit`` records per batch."""
        reader, fmt, options, checkpoint = self._plan(variant, source, out, limit, turn)
        return run_query(self.spark, variant, reader, fmt, options, checkpoint)

    def start_query(self, variant: str, source: str, out: str, limit: int, turn: str) -> Any:
        """The same query, started (its ``StreamingQuery``), not waited for."""
        reader, fmt, options, checkpoint = self._plan(variant, source, out, limit, turn)
        return (
            reader.writeStream.format(fmt)
            .options(**options)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    def _plan(
        self, variant: str, source: str, out: str, limit: int, turn: str
    ) -> tuple[Any, str, dict[str, str], str]:
        """The reader, the sink's format and options and the checkpoint of a query."""
        if variant == BUILTIN:
            reader = (
                self.spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", source)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(limit))
                .option("kafka.isolation.level", "read_committed")
                .load()
                .select("key", "value")
            )
            options = {"kafka.bootstrap.servers": self.bootstrap, "topic": out}
            return reader, "kafka", options, f"{self.workdir}/cp-builtin-{turn}"
        mode, guarantee = (
            ("transactional", "exactly-once")
            if variant == EXACTLY_ONCE
            else ("idempotent", "at-least-once")
        )
        common = epochal_options(f"{self.workdir}/snap", guarantee, f"bench-{mode}-{turn}")
        reader = epochal_kafka_reader(self.spark, self.bootstrap, source, limit, common).select(
            "key", "value"
        )
        options = {"kafka.bootstrap.servers": self.bootstrap, "topic": out, "mode": mode, **common}
        return reader, "epochal.kafka", options, f"{self.workdir}/cp-{mode}-{turn}"

    def warm_up(self) -> None:
        """Every variant once on a small topic (not measured): Python workers, imports, Arrow,
        the Kafka classes and the first connections are then warm for all alike."""
        small = self.new_topic()
        produce_input(self.bootstrap, small, 6_000, self.partitions)
        for variant in self.variants():
            self.run(variant, "warm", source=small, records=6_000, limit=2_000)
        self.drop_topic(small)

    def rounds(self, count: int, log: Callable[[str], None]) -> list[Run]:
        """``count`` interleaved rounds."""
        runs = []
        for number in range(count):
            for variant in rotated(self.variants(), number):
                run = self.run(variant, f"r{number}")
                run.round = number
                runs.append(run)
                check = "" if run.output == self.records else f"  OUTPUT {run.output} != input"
                if variant == EXACTLY_ONCE:
                    check += f"  (kept producer in {run.kept[0]} of {run.kept[1]} tasks)"
                log(
                    f"round {number + 1:>2}/{count} {variant:22} {run.steady:>9.0f} rec/s, "
                    f"batch p50 {statistics.median(run.measured_ms or [0]):>5.0f} ms{check}"
                )
        return runs


def kept_producers(job_dir: str) -> tuple[int, int]:
    """How many tasks of an exactly-once query (after its first batch) used a producer their
    Python worker kept from an earlier task, out of how many wrote: the sink reports it in
    each prepared transaction, which the runtime records in its commit decisions."""
    from epochal.state.jobs import JobDirectory

    snapshot_dir, _, name = job_dir.rpartition("/")
    store = JobDirectory(snapshot_dir, name).store  # the live epoch's
    reused = wrote = 0
    try:
        sinks = store.list_dirs("sinks")
    except OSError:
        return (0, 0)
    for sink in sinks:
        for key in store.list(f"sinks/{sink}/decisions")[1:]:
            for txn in store.read_json(key).get("transactions", []):
                data = txn.get("data") or {}
                if not data.get("skipped"):
                    wrote += 1
                    reused += bool(data.get("reused"))
    return (reused, wrote)


@dataclass
class Summary:
    """What a run of rounds found."""

    rates: dict[str, list[float]]
    """Per variant, its throughput in each round (in round order)."""
    mean_rates: dict[str, list[float]]
    """Per variant, its mean-based records/s in each round."""
    latencies: dict[str, list[float]]
    """Per variant, every measured batch's latency."""
    phases: dict[str, dict[str, float]]
    ratios: dict[str, Any]
    """Per ratio label, the :class:`Spread` of its per-round values (throughput)."""
    round_ratios: dict[str, list[float]]
    """Per ratio label, its value in each round (throughput)."""
    mean_ratios: dict[str, Any]
    """Per ratio label, the :class:`Spread` of the mean-based per-round ratios."""
    complete: dict[str, bool]
    """Per variant, whether every output topic held exactly the input's record count."""
    kept: tuple[int, int] = (0, 0)
    """Exactly-once tasks that used a kept producer, of those that wrote (measured batches)."""


def summarize(runs: list[Run], records: int) -> Summary:
    """Per-variant rates and latencies, per-round ratios with their spread."""
    variants = [v for v in VARIANTS if any(r.variant == v for r in runs)]
    by_round: dict[int, dict[str, Run]] = {}
    for run in runs:
        by_round.setdefault(run.round, {})[run.variant] = run

    def per_round(figure: Callable[[Run], float], variant: str) -> list[float]:
        return [figure(by_round[n][variant]) for n in sorted(by_round) if variant in by_round[n]]

    rates = {v: per_round(lambda r: r.steady, v) for v in variants}
    mean_rates = {v: per_round(lambda r: r.mean_rate, v) for v in variants}
    latencies = {v: [ms for r in runs if r.variant == v for ms in r.measured_ms] for v in variants}
    phases = {}
    for v in variants:
        mine = [r.phases for r in runs if r.variant == v and r.phases]
        names = sorted({k for p in mine for k in p})
        phases[v] = {k: statistics.mean(p.get(k, 0.0) for p in mine) for k in names}
    ratios, round_ratios, mean_ratios = {}, {}, {}
    for top, bottom in RATIOS:
        pairs = [
            (rounds[top], rounds[bottom])
            for rounds in by_round.values()
            if top in rounds and bottom in rounds and rounds[bottom].steady
        ]
        if pairs:
            label = f"{top} / {bottom}"
            round_ratios[label] = [a.steady / b.steady for a, b in pairs]
            ratios[label] = spread(round_ratios[label])
            mean_ratios[label] = spread([a.mean_rate / b.mean_rate for a, b in pairs])
    complete = {v: all(r.output == records for r in runs if r.variant == v) for v in variants}
    kept = (sum(r.kept[0] for r in runs), sum(r.kept[1] for r in runs))
    return Summary(
        rates, mean_rates, latencies, phases, ratios, round_ratios, mean_ratios, complete, kept
    )


def table(summary: Summary) -> str:
    """The figures per variant, then the ratios with their spread."""
    lines = [
        f"{'variant':24} {'rec/s median':>12} {'IQR':>17} {'mean-based':>10} {'batch p50':>9} "
        f"{'p90':>6} {'max':>6}  output",
    ]
    for name, rates in summary.rates.items():
        ms = summary.latencies[name]
        lines.append(
            f"{name:24} {statistics.median(rates):>12.0f} "
            f"{quantile(rates, 0.25):>8.0f}-{quantile(rates, 0.75):<8.0f} "
            f"{statistics.median(summary.mean_rates[name]):>10.0f} "
            f"{quantile(ms, 0.5):>9.0f} {quantile(ms, 0.9):>6.0f} {max(ms):>6.0f}  "
            f"{'every record once' if summary.complete[name] else 'MISMATCH'}"
        )
    lines.append("ratios of throughput per round (median, IQR, bootstrap 95% CI of the median):")
    for label, value in summary.ratios.items():
        lines.append(f"  {label:48} {value}")
    lines.append("the same with mean-based records/s:")
    for label, value in summary.mean_ratios.items():
        lines.append(f"  {label:48} {value}")
    if summary.kept[1]:
        lines.append(
            f"exactly-once tasks that used their worker's kept producer: {summary.kept[0]} of "
            f"{summary.kept[1]} (the others made a new one: init_transactions)"
        )
    lines.append("mean ms per measured batch by Spark phase:")
    for name, phases in summary.phases.items():
        if phases:
            shown = ", ".join(f"{k} {v:.0f}" for k, v in phases.items() if v >= 1)
            lines.append(f"  {name:22} {shown}")
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


@dataclass
class BenchPlace:
    """What a benchmark command runs on (:func:`bench_place`): the Kafka broker, PostgreSQL's
    DSN (None unless asked for), a temporary work directory, and the stack on which the command
    registers what it opens there (closed first, newest first)."""

    kafka: Any
    dsn: str | None
    workdir: str
    stack: contextlib.ExitStack


@contextlib.contextmanager
def bench_place(name: str, postgres: bool = False) -> Iterator[BenchPlace]:
    """The servers and work directory of one benchmark command: a Kafka broker from the
    harness, PostgreSQL when ``postgres`` (the harness's, or the server at
    ``EPOCHAL_POSTGRES_DSN``) and a temporary directory. On the way out, whatever the command
    registered on ``stack`` (a session to stop, topics to delete) closes first, then the
    servers stop and the directory goes, whether the command ended or failed."""
    from integration.harness.kafka import start_kafka

    with contextlib.ExitStack() as stack:
        kafka = start_kafka()
        stack.callback(kafka.backend.close)
        dsn = os.environ.get("EPOCHAL_POSTGRES_DSN") if postgres else None
        if postgres and not dsn:
            from integration.harness.postgres import start_postgres

            server = start_postgres()
            stack.callback(server.backend.close)
            dsn = server.dsn
        workdir = tempfile.mkdtemp(prefix=f"epochal-{name}-bench-")
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        yield BenchPlace(kafka, dsn, workdir, stack)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the plot (and the raw figures)."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.kafka_bench")
    parser.add_argument("--rounds", type=int, default=16, help="interleaved rounds")
    parser.add_argument("--batches", type=int, default=10, help="batches per query and round")
    parser.add_argument("--batch", type=int, default=100_000, help="records per batch")
    parser.add_argument("--partitions", type=int, default=PARTITIONS, help="of every topic")
    parser.add_argument("--no-builtin", action="store_true", help="skip Spark's connector")
    parser.add_argument("--plot", default="kafka-bench.png", help="PNG to write")
    parser.add_argument("--json", default="", help="write every run's figures here")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.batches, args.batch = 1, 3, 2_000
        smoke_run()
    if args.batches < 3:
        parser.error("--batches must be at least 3 (a query's first and last are not measured)")

    jars: list[str] = []
    if not args.no_builtin:
        try:
            jars = spark_kafka_jars()
        except Exception as exc:  # report, run the rest
            print(f"spark built-in skipped: jars not fetched: {exc}")
    records = args.batches * args.batch
    with bench_place("kafka") as place:
        server = place.kafka
        print(f"machine: {machine()}")
        print(f"broker: Kafka {server.version} at {server.bootstrap_servers}")
        bench = Bench(server, "", records, args.batch, place.workdir, jars, args.partitions)
        place.stack.callback(bench.close)
        bench.source = bench.new_topic()
        started = time.perf_counter()
        produce_input(server.bootstrap_servers, bench.source, records, args.partitions)
        print(
            f"input: {records} records of {VALUE_BYTES} B in {args.partitions} partitions "
            f"({time.perf_counter() - started:.1f}s to produce); {args.batch} per batch, "
            f"{args.batches} batches per query (first and last not measured), {args.rounds} rounds"
        )
        bench.start_spark()
        if not args.smoke:
            bench.warm_up()
        runs = bench.rounds(args.rounds, lambda line: print(line, flush=True))
        summary = summarize(runs, records)
        print(f"load at the end: {machine()}")
        print(table(summary))
        title = f"Kafka → Kafka copy, {args.batch} records/batch, {args.rounds} rounds; {machine()}"
        problem = write_plot(
            args.plot,
            title,
            summary.rates,
            summary.latencies,
            ratios={k: v for k, v in summary.round_ratios.items() if k in TARGETS},
            targets=TARGETS,
        )
        print(problem or f"plot: {args.plot}")
        if args.json:
            write_runs(
                args.json, args, runs, ratios={k: asdict(v) for k, v in summary.ratios.items()}
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
