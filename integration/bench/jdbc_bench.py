"""PostgreSQL sink benchmark: the same batches written five ways, in interleaved rounds.

    python -m integration.bench.jdbc_bench [--rounds 5] [--rows 50000] [--batches 12]
        [--small-batches 200] [--plot jdbc-bench.png] [--smoke]

``--smoke``: one round of three 2 000-row big batches and five small batches per way, no
warm-up (a check that the command works, not a measurement).

* ``2PC (exactly-once)``: ``mode=transactional`` as the runtime drives it: the task opens a
  transaction, COPYs, writes its commit marker and ``PREPARE TRANSACTION``; the driver records
  the decision durably (``TwoPhaseCommit.commit_batch`` on a real snapshot store, with fsync)
  and ``COMMIT PREPARED`` through a fresh sink object (the runtime builds one per batch);
* ``plain (at-least-once)``: ``mode=plain``: the task COPYs and commits;
* ``upsert (idempotent)``: ``mode=idempotent``: COPY into a temporary table, then
  ``INSERT ... SELECT DISTINCT ON ... ON CONFLICT DO UPDATE``, commit;
* ``upsert replay``: the same batches upserted again (every key exists, nothing changes);
* ``bare COPY``: a psycopg loop, one connection, ``COPY`` + ``COMMIT`` per batch: the ceiling.

Rows are ``id bigint, key text, value text (100 B), ts timestamptz, amount double``, handed to
the sink as Arrow record batches (what Spark hands a Python sink). One task per batch, tasks
run one after another: this measures the connector and the server, not Spark. Two phases:
big batches (``--rows`` rows, the size of a 1-second batch here) for rows/s, and many small
batches (1000 rows) for the per-batch commit latency distribution. *Commit latency* runs
from the end of the task's writes to the batch being visible (for 2PC: until the runtime has
recorded the batch as done).

Each phase runs ``--rounds`` rounds; a round runs every way once, in an order rotated from
round to round (``upsert replay`` always right after the ``upsert`` whose batches it
replays), into fresh tables (and, for 2PC, a fresh marker table and snapshot store) that are
dropped at the end of the round. A warm-up round of three small batches (not measured) runs
first. Per way the table gives the median over the rounds of its rows/s (with the IQR), the
median per-round ratio to bare COPY and to plain, and the commit latency p50/p99/max over
every batch of every round. The figures with targets are taken within each round, so that a
slow moment of the machine hits both sides, and reported as the median over the rounds with
the interquartile range and a bootstrap 95% interval of that median: ``2PC / plain`` (rows/s,
target >= 0.95), ``plain / bare`` and ``2PC added commit latency p99 ms`` (the round's 2PC
commit p99 minus its plain commit p99, target <= 10 ms). The 2PC commit path is also broken
down step by step.

The plot (``--plot``; throughput per round of the big batches, per-batch commit latency of the
small batches, the ratios and the added p99 per round with their targets) needs matplotlib:
``pip install matplotlib`` (not a dependency of the test suite: the benchmark is not run by
CI); without it the tables are still printed. The server is the harness's PostgreSQL 15 (or
``EPOCHAL_POSTGRES_DSN``; the tables are named ``bench_<run>_...`` and dropped).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import psycopg
import pyarrow as pa
from epochal_jdbc import JdbcSink
from epochal_jdbc.copy import copy_batch

from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.state.store import SnapshotStore
from epochal_sdk import ConnectorContext, Options, Prepared
from epochal_sdk.schema import Field
from integration.bench.common import SMOKE_HELP, machine, quantile, rotated, spread, write_plot

SCHEMA = (
    Field("id", "bigint"),
    Field("key", "string"),
    Field("value", "string"),
    Field("ts", "timestamp"),
    Field("amount", "double"),
)
VALUE = "x" * 100
SMALL_ROWS = 1000

BARE = "bare psycopg COPY"
PLAIN = "plain (at-least-once)"
TPC = "2PC (exactly-once)"
UPSERT = "upsert (idempotent)"
REPLAY = "upsert replay"
WAYS = (BARE, PLAIN, TPC, UPSERT, REPLAY)
TURNS = ((BARE,), (PLAIN,), (TPC,), (UPSERT, REPLAY))
"""What a round runs, in an order rotated per round: the replay upserts again what its
round's upsert wrote, so it runs right after it."""

TPC_PLAIN = "2PC / plain"
PLAIN_BARE = "plain / bare"
ADDED = "2PC added commit latency p99 ms"
TARGETS = {TPC_PLAIN: 0.95, ADDED: 10.0}
"""2PC / plain rows/s at least 0.95; 2PC adds at most 10 ms to the commit latency p99."""


def make_batch(first: int, rows: int) -> pa.RecordBatch:
    """``rows`` rows with ids from ``first``."""
    ids = pa.array(range(first, first + rows), pa.int64())
    return pa.record_batch(
        {
            "id": ids,
            "key": pa.array([f"k{i}" for i in range(first, first + rows)]),
            "value": pa.array([VALUE] * rows),
            "ts": pa.array(
                [1_700_000_000_000_000 + i for i in range(rows)], pa.timestamp("us", "UTC")
            ),
            "amount": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        }
    )


@dataclass
class Result:
    """What one way of writing measured in one round."""

    name: str
    rows: int = 0
    seconds: float = 0.0
    commit_ms: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)

    def part(self, name: str, ms: float) -> None:
        """Add one measurement of a step of the commit path."""
        self.parts.setdefault(name, []).append(ms)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def _sink(dsn: str, table: str, mode: str) -> JdbcSink:
    options = {"url": dsn, "table": table, "mode": mode, "createTable": "true"}
    if mode == "idempotent":
        options["keyColumns"] = "id"
    if mode == "transactional":
        options["markerTable"] = f"{table}_commits"  # fresh per round, dropped with the table
    return JdbcSink(Options("jdbc", options))


def run_2pc(
    dsn: str, table: str, batches: list[pa.RecordBatch], store_dir: str, sink_id: str
) -> Result:
    """Tasks prepare, the driver decides (durably) and commits, as the runtime does; the
    steps of the commit path are timed separately."""
    sink = _sink(dsn, table, "transactional")
    sink.check(SCHEMA)
    sink.close()
    store = SnapshotStore(store_dir)
    result = Result(TPC)
    for number, batch in enumerate(batches):
        started = time.perf_counter()
        task = ConnectorContext("bench", sink_id, number, 0, 0, SCHEMA, run=1)
        writer = _sink(dsn, table, "transactional")
        txn = writer.begin(task)
        txn.write(batch)
        t0 = time.perf_counter()
        prepared = Prepared(str(task.txn), txn.prepare())
        txn.close()
        writer.close()
        t1 = time.perf_counter()
        driver = _sink(dsn, table, "transactional")
        protocol = TwoPhaseCommit(store, driver, sink_id, task.transaction_prefix)
        protocol.decide(number, [prepared])
        t2 = time.perf_counter()
        driver._execute("SELECT 1")  # the connection: reused from the previous sink object
        t3 = time.perf_counter()
        driver.commit(prepared)
        t4 = time.perf_counter()
        protocol.complete(number)  # commit again (a no-op), strays, the "done" record
        driver.close()
        done = time.perf_counter()
        for name, ms in (
            ("task: marker + PREPARE TRANSACTION", t1 - t0),
            ("driver: decision record (runtime)", t2 - t1),
            ("driver: connection (reused)", t3 - t2),
            ("driver: COMMIT PREPARED", t4 - t3),
            ("driver: strays + done record", done - t4),
        ):
            result.part(name, ms * 1000)
        result.commit_ms.append((done - t0) * 1000)
        result.seconds += done - started
        result.rows += batch.num_rows
    return result


def run_plain(dsn: str, table: str, batches: list[pa.RecordBatch]) -> Result:
    """Tasks write and commit (the at-least-once path of ``mode=plain``)."""
    sink = _sink(dsn, table, "plain")
    sink.check(SCHEMA)
    result = Result(PLAIN)
    for number, batch in enumerate(batches):
        started = time.perf_counter()
        task = ConnectorContext("bench", "jdbc-plain", number, 0, 0, SCHEMA, run=1)
        writer = _sink(dsn, table, "plain")
        txn = writer.begin(task)
        txn.write(batch)
        before_commit = time.perf_counter()
        writer.commit(Prepared(str(task.txn), txn.prepare()))
        txn.close()
        writer.close()
        done = time.perf_counter()
        result.commit_ms.append((done - before_commit) * 1000)
        result.seconds += done - started
        result.rows += batch.num_rows
    return result


def run_upsert(dsn: str, table: str, batches: list[pa.RecordBatch], name: str) -> Result:
    """Tasks upsert and commit."""
    sink = _sink(dsn, table, "idempotent")
    sink.check(SCHEMA)
    result = Result(name)
    for number, batch in enumerate(batches):
        started = time.perf_counter()
        task = ConnectorContext("bench", "jdbc-upsert", number, 0, 0, SCHEMA, run=1)
        upserts = _sink(dsn, table, "idempotent").open(task)
        upserts.write(batch)
        before_commit = time.perf_counter()
        upserts.flush()
        upserts.close()
        done = time.perf_counter()
        result.commit_ms.append((done - before_commit) * 1000)
        result.seconds += done - started
        result.rows += batch.num_rows
    return result


def run_bare(dsn: str, table: str, batches: list[pa.RecordBatch]) -> Result:
    """One connection, COPY + COMMIT per batch: the ceiling."""
    result = Result(BARE)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id bigint, key text, value text, ts timestamptz,"
            " amount double precision)"
        )
        conn.commit()
        for batch in batches:
            started = time.perf_counter()
            with conn.cursor() as cursor:
                copy_batch(cursor, psycopg.sql.Identifier(table), batch)
            before_commit = time.perf_counter()
            conn.commit()
            done = time.perf_counter()
            result.commit_ms.append((done - before_commit) * 1000)
            result.seconds += done - started
            result.rows += batch.num_rows
    return result


def run_round(
    dsn: str,
    workdir: str,
    prefix: str,
    batches: list[pa.RecordBatch],
    turn: int,
    log: Callable[[Result], None] = lambda result: None,
) -> dict[str, Result]:
    """Every way once over ``batches``, in the order of round ``turn``, into fresh tables
    named ``prefix_<way>`` (dropped at the end, with the 2PC snapshot store)."""
    tables = {BARE: "bare", PLAIN: "plain", TPC: "tpc", UPSERT: "upsert", REPLAY: "upsert"}
    tables = {way: f"{prefix}_{name}" for way, name in tables.items()}
    store_dir = f"{workdir}/{prefix}"
    results: dict[str, Result] = {}
    try:
        for ways in rotated(TURNS, turn):
            for way in ways:
                if way == BARE:
                    result = run_bare(dsn, tables[way], batches)
                elif way == PLAIN:
                    result = run_plain(dsn, tables[way], batches)
                elif way == TPC:
                    result = run_2pc(dsn, tables[way], batches, store_dir, prefix)
                else:
                    result = run_upsert(dsn, tables[way], batches, way)
                results[way] = result
                log(result)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in sorted({*tables.values(), f"{tables[TPC]}_commits"}):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        shutil.rmtree(store_dir, ignore_errors=True)
    return results


@dataclass
class Phase:
    """One phase's rounds and what they give."""

    key: str
    """``big`` or ``small``."""
    title: str
    rounds: list[dict[str, Result]] = field(default_factory=list)

    def rates(self, way: str) -> list[float]:
        """The way's rows/s in each round."""
        return [r[way].rows_per_s for r in self.rounds]

    def commits(self, way: str) -> list[float]:
        """The way's commit latency of every batch of every round (ms)."""
        return [ms for r in self.rounds for ms in r[way].commit_ms]

    def ratio(self, top: str, bottom: str) -> list[float]:
        """``top`` rows/s / ``bottom`` rows/s, per round."""
        return [r[top].rows_per_s / r[bottom].rows_per_s for r in self.rounds]

    def added_p99(self) -> list[float]:
        """2PC commit p99 minus plain commit p99, per round (ms)."""
        return [
            quantile(r[TPC].commit_ms, 0.99) - quantile(r[PLAIN].commit_ms, 0.99)
            for r in self.rounds
        ]

    def figures(self) -> dict[str, list[float]]:
        """The per-round figures whose spread is printed."""
        return {
            TPC_PLAIN: self.ratio(TPC, PLAIN),
            PLAIN_BARE: self.ratio(PLAIN, BARE),
            ADDED: self.added_p99(),
        }


def report(phase: Phase) -> str:
    """The phase's table, its figures with their spread and the 2PC steps."""
    lines = [
        f"\n{phase.title}",
        f"{'way':<24} {'rows/s median':>13} {'IQR':>17} {'vs bare':>8} {'vs plain':>8}"
        f"   {'commit p50':>10} {'p99':>8} {'max':>8}",
    ]
    for way in WAYS:
        rates, ms = phase.rates(way), phase.commits(way)
        lines.append(
            f"{way:<24} {statistics.median(rates):>13,.0f} "
            f"{quantile(rates, 0.25):>8,.0f}-{quantile(rates, 0.75):<8,.0f} "
            f"{statistics.median(phase.ratio(way, BARE)):>8.0%} "
            f"{statistics.median(phase.ratio(way, PLAIN)):>8.0%}   "
            f"{quantile(ms, 0.5):>10.2f} {quantile(ms, 0.99):>8.2f} {max(ms):>8.2f}"
        )
    lines.append(
        "(rows/s: median over the rounds; vs: median of the per-round ratios; commit latency in "
        "ms, from the end of the writes to the batch being visible, over every batch of every "
        "round)"
    )
    lines.append("per round (median, IQR, bootstrap 95% CI of the median):")
    for label, values in phase.figures().items():
        target = TARGETS.get(label)
        goal = "" if target is None else f" (target {'<=' if label == ADDED else '>='} {target:g})"
        lines.append(f"  {label + goal:<46} {spread(values)}")
    lines.append(f"{'2PC commit path, step by step (ms)':<40} {'p50':>8} {'p99':>8}")
    steps: dict[str, list[float]] = {}
    for r in phase.rounds:
        for name, values in r[TPC].parts.items():
            steps.setdefault(name, []).extend(values)
    for name, values in steps.items():
        lines.append(f"  {name:<38} {quantile(values, 0.5):>8.2f} {quantile(values, 0.99):>8.2f}")
    added = [
        t - p
        for r in phase.rounds
        for t, p in zip(r[TPC].commit_ms, r[PLAIN].commit_ms, strict=True)
    ]
    lines.append(
        f"added by 2PC over plain (same batch of the same round): p50 {quantile(added, 0.5):.2f} "
        f"ms, p99 {quantile(added, 0.99):.2f} ms per batch"
    )
    return "\n".join(lines)


def log_run(turn: str, r: Result) -> None:
    """One line per way and round, as they run."""
    print(
        f"{turn} {r.name:<24} {r.rows_per_s:>11,.0f} rows/s, "
        f"commit p50 {quantile(r.commit_ms, 0.5):>7.2f} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, write the plot."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.jdbc_bench")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per phase")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per big batch")
    parser.add_argument("--batches", type=int, default=12, help="big batches per way and round")
    parser.add_argument(
        "--small-batches", type=int, default=200, help="1000-row batches per way and round"
    )
    parser.add_argument("--plot", default="jdbc-bench.png", help="PNG to write")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.rows, args.batches, args.small_batches = 1, 2_000, 3, 5
    if args.rounds < 1 or args.rows < 1 or args.batches < 1 or args.small_batches < 1:
        parser.error("--rounds, --rows, --batches and --small-batches must be at least 1")

    external = os.environ.get("EPOCHAL_POSTGRES_DSN")
    server = None
    if external:
        dsn = external
    else:
        from integration.harness.postgres import start_postgres

        server = start_postgres()
        dsn = server.dsn
    workdir = tempfile.mkdtemp(prefix="epochal-jdbc-bench-")
    run = uuid.uuid4().hex[:6]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            fsync = conn.execute("SHOW fsync").fetchone()[0]
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        print(f"machine: {machine()}")
        print(f"server: PostgreSQL {version} (fsync={fsync}, synchronous_commit={sync})")
        if not args.smoke:
            warm = [make_batch(i * SMALL_ROWS, SMALL_ROWS) for i in range(3)]
            run_round(dsn, workdir, f"bench_{run}_warm", warm, 0)
        phases = []
        for key, rows, count in (
            ("big", args.rows, args.batches),
            ("small", SMALL_ROWS, args.small_batches),
        ):
            batches = [make_batch(i * rows, rows) for i in range(count)]
            phase = Phase(
                key,
                f"{key} batches: {count} batches of {rows} rows per way and round, "
                f"{args.rounds} rounds, one task per batch",
            )
            for number in range(args.rounds):
                log = partial(log_run, f"{key} round {number + 1}/{args.rounds}")
                prefix = f"bench_{run}_{key[0]}_r{number}"
                phase.rounds.append(run_round(dsn, workdir, prefix, batches, number, log))
            phases.append(phase)
        print(f"load at the end: {machine()}")
        for phase in phases:
            print(report(phase))
        big, small = phases
        title = (
            f"PostgreSQL sink, {args.rounds} rounds: throughput and ratios of {args.batches} x "
            f"{args.rows}-row batches, commit latency of {args.small_batches} x {SMALL_ROWS}-row "
            f"batches per way and round\n{machine()}"
        )
        added = {f"{ADDED}, {p.key} batches": p.added_p99() for p in phases}
        problem = write_plot(
            args.plot,
            title,
            {way: big.rates(way) for way in WAYS},
            {way: small.commits(way) for way in WAYS},
            ratios={TPC_PLAIN: big.ratio(TPC, PLAIN), PLAIN_BARE: big.ratio(PLAIN, BARE)},
            targets={TPC_PLAIN: TARGETS[TPC_PLAIN], **dict.fromkeys(added, TARGETS[ADDED])},
            rate_label="rows/s per round (big batches)",
            differences=added,
        )
        print(problem or f"plot: {args.plot}")
    finally:
        if server is not None:
            server.backend.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
