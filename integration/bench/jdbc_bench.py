"""PostgreSQL sink benchmark: the same batches written five ways, in one run.

    python -m integration.bench.jdbc_bench [--rows 50000] [--batches 12] [--small-batches 200]

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
the sink as Arrow record batches (what Spark gives a Python sink). One task per batch, tasks
run one after another: this measures the connector and the server, not Spark. Two phases:
big batches (``--rows`` rows, the size of a 1-second batch here) for rows/s, and many small
batches (1000 rows) for the per-batch commit latency distribution (p50/p99). The server is
the harness's PostgreSQL 15 (or ``EPOCHAL_POSTGRES_DSN``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import psycopg
import pyarrow as pa
from epochal_jdbc import JdbcSink
from epochal_jdbc.copy import copy_batch

from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.store import SnapshotStore
from epochal_sdk import Field, Options, Prepared, TaskContext

SCHEMA = (
    Field("id", "bigint"),
    Field("key", "string"),
    Field("value", "string"),
    Field("ts", "timestamp"),
    Field("amount", "double"),
)
VALUE = "x" * 100


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
    """What one way of writing measured."""

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

    def pct(self, q: float) -> float:
        if not self.commit_ms:
            return float("nan")
        ordered = sorted(self.commit_ms)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _sink(dsn: str, table: str, mode: str) -> JdbcSink:
    options = {"url": dsn, "table": table, "mode": mode, "createTable": "true"}
    if mode == "idempotent":
        options["keyColumns"] = "id"
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
    result = Result("2PC (exactly-once)")
    for number, batch in enumerate(batches):
        started = time.perf_counter()
        task = TaskContext("bench", sink_id, number, 0, 0, SCHEMA, run=1)
        writer = _sink(dsn, table, "transactional")
        txn = writer.begin(task)
        txn.write(batch)
        t0 = time.perf_counter()
        prepared = Prepared(task.transaction_id, txn.prepare())
        txn.close()
        writer.close()
        t1 = time.perf_counter()
        driver = _sink(dsn, table, "transactional")
        protocol = TwoPhaseCommit(store, driver, sink_id, task.prefix)
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
    result = Result("plain (at-least-once)")
    for number, batch in enumerate(batches):
        started = time.perf_counter()
        task = TaskContext("bench", "jdbc-plain", number, 0, 0, SCHEMA, run=1)
        writer = _sink(dsn, table, "plain")
        txn = writer.begin(task)
        txn.write(batch)
        before_commit = time.perf_counter()
        writer.commit(Prepared(task.transaction_id, txn.prepare()))
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
        task = TaskContext("bench", "jdbc-upsert", number, 0, 0, SCHEMA, run=1)
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
    result = Result("bare psycopg COPY")
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


def machine() -> str:
    """CPU, cores, memory, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) // 1024
    except OSError:
        mem = 0
    load = os.getloadavg()[0]
    return f"{cpu}, {os.cpu_count()} cores, {mem} MiB, {platform.platform()}, load {load:.1f}"


def table_row(r: Result, ceiling: Result, reference: Result) -> str:
    return (
        f"{r.name:<24} {r.rows:>9} {r.rows_per_s:>11,.0f} {r.rows_per_s / ceiling.rows_per_s:>8.0%}"
        f" {r.rows_per_s / reference.rows_per_s:>8.0%}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the tables."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.jdbc_bench")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per big batch")
    parser.add_argument("--batches", type=int, default=12, help="big batches per way")
    parser.add_argument("--small-batches", type=int, default=200, help="1000-row batches")
    args = parser.parse_args(argv)

    external = os.environ.get("EPOCHAL_POSTGRES_DSN")
    server = None
    if external:
        dsn = external
    else:
        from integration.harness.postgres import start_postgres

        server = start_postgres()
        dsn = server.dsn
    workdir = tempfile.mkdtemp(prefix="epochal-jdbc-bench-")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            fsync = conn.execute("SHOW fsync").fetchone()[0]
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        print(f"machine: {machine()}")
        print(f"server: PostgreSQL {version} (fsync={fsync}, synchronous_commit={sync})")
        for phase, rows, count in (
            ("big batches", args.rows, args.batches),
            ("small batches", 1000, args.small_batches),
        ):
            batches = [make_batch(i * rows, rows) for i in range(count)]
            suffix = "b" if rows == args.rows else "s"
            ways: list[Callable[[], Result]] = [
                partial(run_bare, dsn, f"bare_{suffix}", batches),
                partial(run_plain, dsn, f"plain_{suffix}", batches),
                partial(run_2pc, dsn, f"tpc_{suffix}", batches, f"{workdir}/{suffix}", suffix),
                partial(run_upsert, dsn, f"upsert_{suffix}", batches, "upsert (idempotent)"),
                partial(run_upsert, dsn, f"upsert_{suffix}", batches, "upsert replay"),
            ]
            results = [way() for way in ways]
            bare, plain = results[0], results[1]
            print(f"\n{phase}: {count} batches of {rows} rows, one task per batch")
            print(f"{'way':<24} {'rows':>9} {'rows/s':>11} {'vs COPY':>8} {'vs plain':>8}")
            for r in results:
                print(table_row(r, bare, plain))
            print(
                f"\n{'commit latency (ms)':<24} {'p50':>8} {'p99':>8} {'max':>8}"
                "   (from the end of the writes to the batch being visible)"
            )
            for r in results:
                worst = max(r.commit_ms)
                print(f"{r.name:<24} {r.pct(0.5):>8.2f} {r.pct(0.99):>8.2f} {worst:>8.2f}")
            tpc = results[2]
            print("\n2PC commit path, step by step (ms)      p50      p99")
            for name, values in tpc.parts.items():
                ordered = sorted(values)
                p99 = ordered[round(0.99 * (len(ordered) - 1))]
                print(f"  {name:<36} {statistics.median(values):>8.2f} {p99:>8.2f}")
            added = [t - p for t, p in zip(tpc.commit_ms, plain.commit_ms, strict=True)]
            ordered = sorted(added)
            print(
                f"added by 2PC over plain (same batch): p50 {statistics.median(added):.2f} ms, "
                f"p99 {ordered[round(0.99 * (len(ordered) - 1))]:.2f} ms per batch"
            )
    finally:
        if server is not None:
            server.backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
