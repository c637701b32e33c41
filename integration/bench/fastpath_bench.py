"""The fast path beside what PySpark users write today, in one run: Spark's own JVM Kafka
source (records never pass through a Python worker on the way in) into epochal's exactly-once
sinks, against Spark's Kafka source into the at-least-once writes people use now.

    python -m integration.bench.fastpath_bench [--rounds 8] [--batches 8] [--batch 100000]
        [--plot fastpath-bench.png] [--json fastpath.json] [--smoke]

``--smoke`` runs it at its smallest size (one round of three 2 000-record batches per way, no
warm-up round): a check that the command works, not a measurement.

One input topic (2 partitions, ``batches`` times ``batch`` records of 100 B, key = the record
number), read by Spark's Kafka source (``format("kafka")``, ``read_committed``,
``maxOffsetsPerTrigger`` = ``batch``), and seven ways to write it:

* Kafka → Kafka
    * ``fast path, keyed → epochal Kafka (EO)``: epochal's Kafka sink, ``mode=transactional``,
      in an exactly-once job, after ``repartition("key")``: the form that stays exactly-once
      across a driver crash in the middle of a batch (docs/explanation/guarantees.md: Spark's
      Kafka source does not give a replayed batch's records to the same Spark partitions);
    * ``fast path, in order → epochal Kafka (EO)``: the same sink and job without the
      routing, the topic read with ``format("kafka-ordered")`` (:mod:`epochal.spark.ordered_kafka`:
      Spark's Kafka source with every batch's partitions planned in one order, which keeps
      this form exactly-once; ``format("kafka")`` unrouted is refused at the job's start):
      beside the keyed form, what the shuffle costs;
    * ``fast path, in order → foreachBatch epochal Kafka (EO)``: the same sink as a
      ``foreachBatch`` writer (:func:`epochal.foreach_batch`): its tasks write and prepare in
      a ``mapInArrow`` over the batch, the driver's Python decides and commits, with no
      Python data source planning or commit worker per batch;
    * ``Spark Kafka → Spark Kafka (ALO)``: Spark's own Kafka sink (at-least-once);
* Kafka → PostgreSQL (columns ``id``, ``value``)
    * ``fast path → epochal JDBC 2PC (EO)``: epochal's JDBC sink, ``mode=transactional``, in an
      exactly-once job;
    * ``fast path → foreachBatch epochal JDBC 2PC (EO)``: the same sink as a ``foreachBatch``
      writer;
    * ``foreachBatch psycopg COPY (ALO)``: a ``foreachBatch`` function that collects the batch
      to the driver as Arrow (``toArrow()``), writes it as CSV with one psycopg ``COPY`` and
      commits (one connection per query): at-least-once, and the fastest plain form we know
      (``toPandas()`` + ``executemany`` and row-by-row ``foreachPartition`` are slower).
* the floor: ``Python data source sink, writes nothing``: a PySpark Python data source whose
  Arrow writer drops the batches (no epochal, no I/O): what PySpark's Python sink path itself
  costs a batch (the records sent to a Python worker, the write planned again, the commit
  run in a new Python worker on the driver), under any sink written in Python.

Each round runs every way once, in an order rotated from round to round, after a warm-up
round over the same input that is not measured (Spark's own sink speeds up over its first
queries: the JIT); each is a fresh query (new checkpoint, new epochal job, new output topic or
table) with ``Trigger.AvailableNow``. A way's figure in a round is its throughput over the
measured batches (the first, which pays the query's start, and the last are left out):
records per batch / the median of Spark's ``triggerExecution`` per batch. Ratios are taken
within each round; the table prints each figure's min, median and max over the rounds (and
the ratios' interquartile range and a bootstrap 95% interval of the median). Where the time
goes: Spark's ``durationMs`` per phase (mean per measured batch) and, for epochal's sinks, the
split of ``addBatch`` that the runtime's metrics record (the write tasks, the decision, phase
2), for ``foreachBatch`` its collect and its ``COPY``. Every output is read back (a
``read_committed`` consumer, a ``count(*)``/``count(DISTINCT id)``) and must hold every
record once. Kafka and PostgreSQL come from the harness (or ``EPOCHAL_KAFKA_BOOTSTRAP`` /
``EPOCHAL_POSTGRES_DSN``); Spark's Kafka connector from the harness cache
(:func:`integration.bench.kafka_bench.spark_kafka_jars`). The plot needs matplotlib.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from epochal.spark import ordered_kafka
from integration.bench.common import (
    SMOKE_HELP,
    MeasuredBatches,
    bench_session,
    epochal_options,
    machine,
    mean_phases,
    quantile,
    rotated,
    smoke_run,
    spread,
    write_plot,
    write_runs,
)
from integration.bench.kafka_bench import (
    PARTITIONS,
    VALUE_BYTES,
    Bench,
    bench_place,
    count_output,
    produce_input,
    spark_kafka_jars,
)

ORDERED_KAFKA = "fast path, in order → epochal Kafka (EO)"
EO_KAFKA_KEYED = "fast path, keyed → epochal Kafka (EO)"
FB_KAFKA = "fast path, in order → foreachBatch epochal Kafka (EO)"
SPARK_KAFKA = "Spark Kafka → Spark Kafka (ALO)"
EO_JDBC = "fast path → epochal JDBC 2PC (EO)"
FB_JDBC = "fast path → foreachBatch epochal JDBC 2PC (EO)"
FOREACH_JDBC = "foreachBatch psycopg COPY (ALO)"
FLOOR = "Python data source sink, writes nothing"
WAYS = (
    ORDERED_KAFKA,
    EO_KAFKA_KEYED,
    FB_KAFKA,
    SPARK_KAFKA,
    EO_JDBC,
    FB_JDBC,
    FOREACH_JDBC,
    FLOOR,
)
WIDTH = max(len(way) for way in WAYS)
"""The width of the column of ways."""
RATIOS = {
    f"{ORDERED_KAFKA} / {SPARK_KAFKA}": (ORDERED_KAFKA, SPARK_KAFKA),
    f"{EO_JDBC} / {FOREACH_JDBC}": (EO_JDBC, FOREACH_JDBC),
    f"{FB_KAFKA} / {SPARK_KAFKA}": (FB_KAFKA, SPARK_KAFKA),
    f"{FB_JDBC} / {FOREACH_JDBC}": (FB_JDBC, FOREACH_JDBC),
    f"{EO_KAFKA_KEYED} / {SPARK_KAFKA}": (EO_KAFKA_KEYED, SPARK_KAFKA),
    f"{FLOOR} / {SPARK_KAFKA}": (FLOOR, SPARK_KAFKA),
    f"{FLOOR} / {FOREACH_JDBC}": (FLOOR, FOREACH_JDBC),
}
TARGETS = {
    f"{ORDERED_KAFKA} / {SPARK_KAFKA}": 0.95,
    f"{EO_JDBC} / {FOREACH_JDBC}": 1.05,
    f"{FB_KAFKA} / {SPARK_KAFKA}": 0.95,
    f"{FB_JDBC} / {FOREACH_JDBC}": 1.05,
}
"""The targets: exactly-once through the fast path (epochal's data source sinks, or the same
sinks as ``foreachBatch`` writers) >= 0.95x Spark's own at-least-once pair for Kafka → Kafka,
>= 1.05x the ``foreachBatch`` write for Kafka → PostgreSQL."""


@dataclass
class Run(MeasuredBatches):
    """One way in one round: per batch its latency, rows and Spark's phases."""

    way: str
    round: int
    batch_ms: list[float]
    batch_rows: list[int]
    phases: dict[str, float] = field(default_factory=dict)
    """Mean ms per measured batch of Spark's ``durationMs`` phases."""
    split: dict[str, float] = field(default_factory=dict)
    """Mean ms per measured batch inside ``addBatch`` (epochal's metrics, or foreachBatch's
    own timers)."""
    complete: bool = False
    """The output held every record exactly once."""


class FastPath:
    """The ways on one broker, one PostgreSQL server and one SparkSession (``local[2]``, with
    Spark's Kafka connector and epochal's ``kafka`` and ``jdbc`` connectors)."""

    def __init__(self, kafka: Bench, dsn: str, jars: list[str]) -> None:
        self.kafka, self.dsn = kafka, dsn
        self.workdir = kafka.workdir
        self.spark = bench_session(
            "epochal-fastpath-bench",
            ["kafka", "jdbc"],
            **{
                "spark.jars": ",".join([*jars, ordered_kafka.jar()]),
                "spark.sql.streaming.metricsEnabled": "false",
            },
        )
        self.spark.dataSource.register(Discard)

    def reader(self, source: str, limit: int, fmt: str = "kafka") -> Any:
        """Spark's Kafka source over ``source``, at most ``limit`` records a batch (read in
        order when ``fmt`` is ``kafka-ordered``)."""
        return (
            self.spark.readStream.format(fmt)
            .option("kafka.bootstrap.servers", self.kafka.bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(limit))
            .option("kafka.isolation.level", "read_committed")
            .load()
        )

    def run(self, way: str, turn: str, source: str, records: int, limit: int) -> Run:
        """One query of ``way`` over ``source``; its output is counted, then dropped."""
        job = f"fastpath-{WAYS.index(way)}-{turn}"
        checkpoint = f"{self.workdir}/cp-{job}"
        if way == FLOOR:  # nothing to read back: complete when it read every record
            rows = self.reader(source, limit).select("key", "value")
            run = self._measure(way, rows.writeStream.format(DISCARD), checkpoint)
            run.complete = sum(run.batch_rows) == records
            return run
        if way in (EO_KAFKA_KEYED, ORDERED_KAFKA, FB_KAFKA, SPARK_KAFKA):
            out = self.kafka.new_topic()
            try:
                run = self._to_kafka(way, job, source, out, limit, checkpoint)
                run.complete = count_output(self.kafka.bootstrap, out) == records
            finally:
                self.kafka.drop_topic(out)
        else:
            table = f"fastpath_{uuid.uuid4().hex[:10]}"
            try:
                run = self._to_postgres(way, job, source, table, limit, checkpoint)
                run.complete = self._holds_each_once(table, records)
            finally:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f'DROP TABLE IF EXISTS "{table}"')
                    conn.execute(f'DROP TABLE IF EXISTS "{table}_commits"')
        return run

    def _to_kafka(
        self, way: str, job: str, source: str, out: str, limit: int, checkpoint: str
    ) -> Run:
        fmt = ordered_kafka.FORMAT if way in (ORDERED_KAFKA, FB_KAFKA) else "kafka"
        rows = self.reader(source, limit, fmt).select("key", "value")
        if way == EO_KAFKA_KEYED:
            rows = rows.repartition("key")
        if way == FB_KAFKA:
            options = {"kafka.bootstrap.servers": self.kafka.bootstrap, "topic": out}
            return self._foreach_batch(way, job, rows, "kafka", options, checkpoint)
        writer = rows.writeStream.option("kafka.bootstrap.servers", self.kafka.bootstrap)
        writer = writer.option("topic", out)
        if way == SPARK_KAFKA:
            return self._measure(way, writer.format("kafka"), checkpoint)
        common = epochal_options(f"{self.workdir}/snap", "exactly-once", job)
        writer = writer.format("epochal.kafka").option("mode", "transactional").options(**common)
        run = self._measure(way, writer, checkpoint)
        run.split = self._epochal_split(job, run)
        return run

    def _to_postgres(
        self, way: str, job: str, source: str, table: str, limit: int, checkpoint: str
    ) -> Run:
        rows = self.reader(source, limit).selectExpr(
            "CAST(key AS STRING) AS id", "CAST(value AS STRING) AS value"
        )
        if way == EO_JDBC:
            common = epochal_options(f"{self.workdir}/snap", "exactly-once", job)
            writer = (
                rows.writeStream.format("epochal.jdbc")
                .option("url", self.dsn)
                .option("table", table)
                .option("mode", "transactional")
                .option("createTable", "true")
                .options(**common)
            )
            run = self._measure(way, writer, checkpoint)
            run.split = self._epochal_split(job, run)
            return run
        if way == FB_JDBC:
            options = {"url": self.dsn, "table": table, "createTable": "true"}
            return self._foreach_batch(way, job, rows, "jdbc", options, checkpoint)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE TABLE "{table}" (id text, value text)')
        writer, timings, close = foreach_batch_copy(rows, self.dsn, table)
        try:
            run = self._measure(way, writer, checkpoint)
        finally:
            close()
        measured = timings[1:-1] if len(timings) >= 3 else timings
        run.split = {
            name: statistics.mean(t[name] for t in measured) for name in ("collect", "copy")
        }
        run.split["rest"] = run.phases.get("addBatch", 0.0) - sum(run.split.values())
        return run

    def _foreach_batch(
        self, way: str, job: str, rows: Any, connector: str, options: dict[str, str], cp: str
    ) -> Run:
        """``rows`` into epochal's ``connector`` sink as a ``foreachBatch`` writer
        (:func:`epochal.foreach_batch`), two-phase, in an exactly-once job of its own."""
        import epochal

        common = epochal_options(f"{self.workdir}/snap", "exactly-once", job)
        write = epochal.foreach_batch(
            connector, options={**common, **options, "mode": "transactional"}
        )
        run = self._measure(way, rows.writeStream.foreachBatch(write), cp)
        run.split = self._epochal_split(job, run)
        return run

    def _measure(self, way: str, writer: Any, checkpoint: str) -> Run:
        """Run the query to its end; its batches' latencies and Spark's phases."""
        query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"{way}: {query.exception()}")
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        run = Run(
            way,
            -1,
            [float(p["durationMs"]["triggerExecution"]) for p in progress],
            [int(p["numInputRows"]) for p in progress],
        )
        run.phases = mean_phases(progress[run._measured()])
        return run

    def _epochal_split(self, job: str, run: Run) -> dict[str, float]:
        """Mean ms per measured batch of the epochal sink's phases, from the runtime's metrics:
        ``write`` (a write task, mean over the tasks of the batch, which run side by side),
        ``prepare`` (inside it), ``decide`` and ``commit`` (the driver's phase 2), and the
        ``rest`` of ``addBatch`` (scheduling the tasks, PySpark's per-batch Python workers on
        the driver: the write's planning and the commit's worker)."""
        from epochal.metrics.recording import current_state
        from epochal.state.layout import JobLayout

        state = current_state(JobLayout(f"{self.workdir}/snap", job).path)
        sinks = [p for p in state.get("parts", {}).values() if p.get("kind") == "sink"]
        if not sinks:
            return {}
        batches = [b for b in sinks[0]["batches"] if b["batch"] is not None]
        batches = batches[1:-1] if len(batches) >= 3 else batches
        out: dict[str, float] = {}
        for phase in ("write", "prepare", "decide", "commit"):
            values = [
                b["values"][f"{phase}_seconds"] / b["values"][f"{phase}_seconds_count"]
                for b in batches
                if b["values"].get(f"{phase}_seconds_count")
            ]
            if values:
                out[phase] = 1000 * statistics.mean(values)
        inside = sum(out.get(phase, 0.0) for phase in ("write", "decide", "commit"))
        out["rest"] = run.phases.get("addBatch", 0.0) - inside
        return out

    def _holds_each_once(self, table: str, records: int) -> bool:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows, distinct = conn.execute(
                f'SELECT count(*), count(DISTINCT id) FROM "{table}"'
            ).fetchone()
        return rows == distinct == records

    def rounds(
        self, count: int, source: str, records: int, limit: int, log: Callable[[str], None]
    ) -> list[Run]:
        """``count`` interleaved rounds of every way."""
        runs = []
        for number in range(count):
            for way in rotated(list(WAYS), number):
                run = self.run(way, f"r{number}", source, records, limit)
                run.round = number
                runs.append(run)
                check = "" if run.complete else "  OUTPUT DOES NOT HOLD EVERY RECORD ONCE"
                log(
                    f"round {number + 1:>2}/{count} {way:{WIDTH}} {run.steady:>9.0f} rec/s, batch "
                    f"p50 {statistics.median(run.measured_ms or [0]):>5.0f} ms{check}"
                )
        return runs


DISCARD = "bench-discard"


class DiscardWriter(DataSourceStreamArrowWriter):
    """Takes each task's Arrow batches and drops them; commits nothing."""

    def write(self, iterator: Any) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: Any, batchId: int) -> None:
        pass

    def abort(self, messages: Any, batchId: int) -> None:
        pass


class Discard(DataSource):
    """A Python data source sink that writes nothing (the floor way)."""

    @classmethod
    def name(cls) -> str:
        return DISCARD

    def streamWriter(self, schema: Any, overwrite: bool) -> DiscardWriter:
        return DiscardWriter()


def foreach_batch_copy(
    rows: Any, dsn: str, table: str
) -> tuple[Any, list[dict[str, float]], Callable[[], None]]:
    """A ``foreachBatch`` writer of ``rows`` into ``table`` as a PySpark user writes it: the
    batch collected to the driver as Arrow, written as CSV with one ``COPY``, committed (one
    connection for the query). Returns the writer, the per-batch timings it fills (ms:
    ``collect``, ``copy``) and what closes its connection."""
    import pyarrow.csv as pacsv

    conn = psycopg.connect(dsn)
    timings: list[dict[str, float]] = []
    statement = f'COPY "{table}" (id, value) FROM STDIN WITH (FORMAT csv)'

    def write(batch: Any, batch_id: int) -> None:
        started = time.perf_counter()
        arrow = batch.toArrow()
        collected = time.perf_counter()
        buffer = io.BytesIO()
        pacsv.write_csv(arrow, buffer, pacsv.WriteOptions(include_header=False))
        with conn.cursor() as cursor, cursor.copy(statement) as copy:
            copy.write(buffer.getvalue())
        conn.commit()
        done = time.perf_counter()
        timings.append({"collect": 1000 * (collected - started), "copy": 1000 * (done - collected)})

    return rows.writeStream.foreachBatch(write), timings, conn.close


def report(runs: list[Run]) -> tuple[str, dict[str, list[float]], dict[str, list[float]]]:
    """The table, and per way its throughput per round and its measured batch latencies."""
    ways = [w for w in WAYS if any(r.way == w for r in runs)]
    rates = {w: [r.steady for r in runs if r.way == w] for w in ways}
    latencies = {w: [ms for r in runs if r.way == w for ms in r.measured_ms] for w in ways}
    width = WIDTH
    lines = [
        f"{'way':{width}} {'rec/s min':>10} {'median':>9} {'max':>9} {'batch p50 ms':>13} "
        f"{'p90':>6}  complete"
    ]
    for way in ways:
        values, ms = rates[way], latencies[way]
        complete = sum(r.complete for r in runs if r.way == way)
        lines.append(
            f"{way:{width}} {min(values):>10.0f} {statistics.median(values):>9.0f} "
            f"{max(values):>9.0f} {quantile(ms, 0.5):>13.0f} {quantile(ms, 0.9):>6.0f}  "
            f"{complete}/{len(values)}"
        )
    lines.append("ratios of throughput within each round: min, median, max (IQR, 95% CI):")
    for label, values in ratio_values(runs).items():
        goal = f" (target >= {TARGETS[label]})" if label in TARGETS else ""
        met = ""
        if label in TARGETS:
            met = "  met" if statistics.median(values) >= TARGETS[label] else "  MISSED"
        lines.append(
            f"  {label + goal}\n      {min(values):.3f}  {statistics.median(values):.3f}  "
            f"{max(values):.3f}   {spread(values)}{met}"
        )
    lines.append("where the time goes, mean ms per measured batch (Spark's durationMs):")
    for way in ways:
        mine = [r.phases for r in runs if r.way == way and r.phases]
        names = sorted({k for p in mine for k in p})
        means = {k: statistics.mean(p.get(k, 0.0) for p in mine) for k in names}
        shown = ", ".join(f"{k} {v:.0f}" for k, v in means.items() if v >= 1)
        lines.append(f"  {way:{width}} {shown}")
    lines.append("inside addBatch, mean ms per measured batch:")
    for way in ways:
        mine = [r.split for r in runs if r.way == way and r.split]
        if mine:
            names = sorted({k for s in mine for k in s}, key=_split_order)
            shown = ", ".join(
                f"{k} {statistics.mean(s.get(k, 0.0) for s in mine):.0f}" for k in names
            )
            lines.append(f"  {way:{width}} {shown}")
    return "\n".join(lines), rates, latencies


def _split_order(name: str) -> int:
    order = ("collect", "copy", "write", "prepare", "decide", "commit", "rest")
    return order.index(name) if name in order else len(order)


def ratio_values(runs: list[Run]) -> dict[str, list[float]]:
    """Per ratio, its value in each round (``top``'s throughput over ``bottom``'s)."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run.round, {})[run.way] = run.steady
    out = {}
    for label, (top, bottom) in RATIOS.items():
        values = [r[top] / r[bottom] for r in by_round.values() if r.get(bottom) and top in r]
        if values:
            out[label] = values
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the plot (and the raw figures)."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.fastpath_bench")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--batches", type=int, default=8, help="batches per query and round")
    parser.add_argument("--batch", type=int, default=100_000, help="records per batch")
    parser.add_argument("--plot", default="fastpath-bench.png", help="PNG to write")
    parser.add_argument("--json", default="", help="write every run's figures here")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.batches, args.batch = 1, 3, 2_000
        smoke_run()
    if args.batches < 3:
        parser.error("--batches must be at least 3 (a query's first and last are not measured)")
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch must be at least 1")

    jars = spark_kafka_jars()
    records = args.batches * args.batch
    with bench_place("fastpath", postgres=True) as place:
        kafka_server, dsn = place.kafka, str(place.dsn)
        kafka = Bench(kafka_server, "", records, args.batch, place.workdir, jars)
        place.stack.callback(kafka.close)
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            fsync = conn.execute("SHOW fsync").fetchone()[0]
        print(f"machine: {machine()}")
        print(f"Kafka {kafka_server.version}; PostgreSQL {version} (fsync={fsync})")
        source = kafka.new_topic()
        started = time.perf_counter()
        produce_input(kafka.bootstrap, source, records)
        print(
            f"input: {records} records of {VALUE_BYTES} B in {PARTITIONS} partitions "
            f"({time.perf_counter() - started:.1f}s to produce); {args.batch} per batch, "
            f"{args.batches} batches per query (first and last not measured), {args.rounds} rounds"
        )
        bench = FastPath(kafka, dsn, jars)
        place.stack.callback(bench.spark.stop)
        for way in () if args.smoke else WAYS:  # a warm-up round, not measured (the JIT)
            bench.run(way, "warm", source, records, args.batch)
        runs = bench.rounds(
            args.rounds, source, records, args.batch, lambda line: print(line, flush=True)
        )
        print(f"load at the end: {machine()}")
        text, rates, latencies = report(runs)
        print(text)
        problem = write_plot(
            args.plot,
            f"Spark's Kafka source → epochal's exactly-once sinks and the at-least-once peers, "
            f"{args.batch} records/batch, {args.rounds} rounds; {machine()}",
            rates,
            latencies,
            ratios={k: v for k, v in ratio_values(runs).items() if k in TARGETS},
            targets=TARGETS,
        )
        print(problem or f"plot: {args.plot}")
        if args.json:
            write_runs(args.json, args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
