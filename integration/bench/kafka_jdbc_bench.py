"""Kafka → PostgreSQL through Spark, end to end: what exactly-once costs against at-least-once
on the whole path, measured in interleaved rounds.

    python -m integration.bench.kafka_jdbc_bench [--rounds 10] [--batches 8] [--batch 50000]
        [--plot kafka-jdbc-bench.png] [--smoke]

``--smoke``: one round of three 2 000-record batches per way, no warm-up (a check that the
command works, not a measurement).

One input topic (2 partitions, ``batches`` times ``batch`` records of 100 B, key = the record
number), one pipeline (``epochal.kafka`` → Spark → ``epochal.jdbc``, columns ``id``, ``value``)
and three ways to write, each a fresh query (new checkpoint, new epochal job, new table) per
round, in an order rotated from round to round, after an unmeasured warm-up round:

* ``2PC (exactly-once)``: ``mode=transactional`` in an exactly-once job (each task's rows in a
  prepared transaction, committed by the driver after the batch's decision is recorded);
* ``plain (at-least-once)``: ``mode=plain`` in an at-least-once job (each task commits);
* ``upsert (exactly-once, idempotent)``: ``mode=idempotent`` keyed on ``id`` in an
  exactly-once job.

A way's figure of a round is its throughput over the measured batches (a query's first, which
pays its start, and last are left out: records per batch / the median batch latency, Spark's
``triggerExecution``), as in the Kafka benchmark. Ratios are taken within each round and
printed as the median with their spread. Every table is read back after its query by an
independent psycopg connection and must hold every record exactly once (rows and distinct ids
counted; a mismatch is printed); then it is dropped. Kafka and PostgreSQL come from the
harness (or ``EPOCHAL_KAFKA_BOOTSTRAP`` / ``EPOCHAL_POSTGRES_DSN``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable

import psycopg

from integration.bench.common import (
    SMOKE_HELP,
    bench_session,
    epochal_options,
    machine,
    quantile,
    ratio_lines,
    rotated,
    smoke_run,
    write_plot,
)
from integration.bench.kafka_bench import (
    PARTITIONS,
    VALUE_BYTES,
    Bench,
    Run,
    bench_place,
    epochal_kafka_reader,
    produce_input,
    run_query,
)

TWO_PC = "2PC (exactly-once)"
PLAIN = "plain (at-least-once)"
UPSERT = "upsert (exactly-once, idempotent)"
WAYS = {
    TWO_PC: ("transactional", "exactly-once"),
    PLAIN: ("plain", "at-least-once"),
    UPSERT: ("idempotent", "exactly-once"),
}
"""Each way: the sink's ``mode`` and the job's guarantee."""
RATIOS = {f"{TWO_PC} / {PLAIN}": (TWO_PC, PLAIN), f"{UPSERT} / {PLAIN}": (UPSERT, PLAIN)}
TARGETS = {f"{TWO_PC} / {PLAIN}": 0.95}
"""Issue 12's target for Kafka → PostgreSQL (exactly-once >= 0.95x at-least-once)."""


class KafkaToPostgres:
    """The ways on one broker, one PostgreSQL server and one SparkSession."""

    def __init__(self, kafka: Bench, dsn: str) -> None:
        self.kafka, self.dsn = kafka, dsn
        self.spark = bench_session("epochal-kafka-jdbc-bench", ["kafka", "jdbc"])

    def run(self, way: str, turn: str, source: str, records: int, limit: int) -> Run:
        """One query of ``way`` over ``source``; its table is counted, then dropped."""
        mode, guarantee = WAYS[way]
        table = f"bench_{mode}_{turn}_{uuid.uuid4().hex[:6]}"
        workdir = self.kafka.workdir
        common = epochal_options(f"{workdir}/snap", guarantee, f"bench-{mode}-{turn}")
        reader = epochal_kafka_reader(
            self.spark, self.kafka.bootstrap, source, limit, common
        ).selectExpr("CAST(key AS STRING) AS id", "CAST(value AS STRING) AS value")
        sink = {"url": self.dsn, "table": table, "mode": mode, "createTable": "true", **common}
        if mode == "idempotent":
            sink["keyColumns"] = "id"
        result = run_query(
            self.spark, way, reader, "epochal.jdbc", sink, f"{workdir}/cp-{mode}-{turn}"
        )
        run = Run(way, -1, result.batch_ms, result.batch_rows or [], result.phases or {})
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows, distinct = conn.execute(
                f'SELECT count(*), count(DISTINCT id) FROM "{table}"'
            ).fetchone()
            conn.execute(f'DROP TABLE "{table}"')
            conn.execute(f'DROP TABLE IF EXISTS "{table}_commits"')
        run.output = rows if rows == distinct == records else -abs(rows - records) - 1
        return run

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
                check = "" if run.output == records else "  TABLE DOES NOT HOLD EVERY RECORD ONCE"
                log(
                    f"round {number + 1:>2}/{count} {way:34} {run.steady:>9.0f} rec/s, batch p50 "
                    f"{statistics.median(run.measured_ms or [0]):>5.0f} ms{check}"
                )
        return runs


def report(runs: list[Run]) -> tuple[str, dict[str, list[float]], dict[str, list[float]]]:
    """The table, and per way its throughput per round and its measured batch latencies."""
    rates = {w: [r.steady for r in runs if r.variant == w] for w in WAYS}
    latencies = {w: [ms for r in runs if r.variant == w for ms in r.measured_ms] for w in WAYS}
    lines = [
        f"{'way':34} {'rec/s (median of rounds)':>25} {'IQR':>16} {'batch p50 ms':>13} "
        f"{'p90':>6}  complete"
    ]
    for way in WAYS:
        ms, values = latencies[way], rates[way]
        complete = sum(r.output >= 0 for r in runs if r.variant == way)
        lines.append(
            f"{way:34} {statistics.median(values):>25.0f} "
            f"{quantile(values, 0.25):>7.0f}-{quantile(values, 0.75):<8.0f} "
            f"{quantile(ms, 0.5):>13.0f} {quantile(ms, 0.9):>6.0f}  {complete}/{len(values)}"
        )
    lines.append("ratios of throughput, within each round (median, spread):")
    lines += ratio_lines({k: ratios(runs, *pair) for k, pair in RATIOS.items()}, TARGETS, 62)
    lines.append("Spark's phases, mean ms per measured batch:")
    for way in WAYS:
        mine = [r.phases for r in runs if r.variant == way and r.phases]
        names = sorted({k for p in mine for k in p})
        shown = ", ".join(
            f"{k} {statistics.mean(p.get(k, 0.0) for p in mine):.0f}"
            for k in names
            if statistics.mean(p.get(k, 0.0) for p in mine) >= 1
        )
        lines.append(f"  {way:34} {shown}")
    return "\n".join(lines), rates, latencies


def ratios(runs: list[Run], top: str, bottom: str) -> list[float]:
    """``top``'s throughput over ``bottom``'s, within each round."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run.round, {})[run.variant] = run.steady
    return [r[top] / r[bottom] for r in by_round.values() if r.get(bottom) and top in r]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the plot."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.kafka_jdbc_bench")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--batches", type=int, default=8, help="batches per query and round")
    parser.add_argument("--batch", type=int, default=50_000, help="records per batch")
    parser.add_argument("--plot", default="kafka-jdbc-bench.png", help="PNG to write")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.batches, args.batch = 1, 3, 2_000
        smoke_run()
    if args.batches < 3:
        parser.error("--batches must be at least 3 (a query's first and last are not measured)")
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch must be at least 1")

    records = args.batches * args.batch
    with bench_place("kafka-jdbc", postgres=True) as place:
        kafka_server, dsn = place.kafka, str(place.dsn)
        kafka = Bench(kafka_server, "", records, args.batch, place.workdir, [])
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
        bench = KafkaToPostgres(kafka, dsn)
        place.stack.callback(bench.spark.stop)
        if not args.smoke:
            small = kafka.new_topic()
            produce_input(kafka.bootstrap, small, 6_000)
            for way in WAYS:  # warm-up, not measured
                bench.run(way, "warm", small, 6_000, 2_000)
        runs = bench.rounds(
            args.rounds, source, records, args.batch, lambda line: print(line, flush=True)
        )
        print(f"load at the end: {machine()}")
        text, rates, latencies = report(runs)
        print(text)
        problem = write_plot(
            args.plot,
            f"Kafka → PostgreSQL through Spark, {args.batch} records/batch, {args.rounds} "
            f"rounds; {machine()}",
            rates,
            latencies,
            ratios={label: ratios(runs, *pair) for label, pair in RATIOS.items()},
            targets=TARGETS,
        )
        print(problem or f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
