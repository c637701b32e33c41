"""A neighbour for the recovery benchmark: a second, independent Spark streaming job on the
same machine, plain PySpark (no epochal), that keeps the cores busy while the benchmark's
job is killed and recovers (what a production machine shared by several jobs sees).

    python -m integration.bench.neighbour [--rows-per-second 4000] [--keys 500]

Its query: Spark's ``rate`` source → a running count and a sum of hashes per key in Spark
state (RocksDB, ``applyInPandasWithState``, as the benchmark's jobs do; the Python function
hashes every row's value: CPU work per row) → the ``noop`` sink, a micro-batch every 0.5 s,
on ``local[2]``.
It runs until it gets SIGTERM (or SIGINT), then stops its query and its session and prints
one JSON line: batches run, rows, the median and the 90th percentile of its batch time.

:class:`Neighbour` starts it from the benchmark in a process group of its own and stops it
afterwards; every process it started (the JVM, PySpark's daemons and workers) carries the
environment variable :data:`TOKEN_ENV`, so whatever outlives the stop is found and killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

TOKEN_ENV = "EPOCHAL_BENCH_NEIGHBOUR"
"""Marks every process of a neighbour run (its value: the run's token)."""
STOP_SECONDS = 30.0
"""How long a neighbour may take to stop its query and session before it is killed."""


def query(spark: Any, rows_per_second: int, keys: int, checkpoint: str) -> Any:
    """The neighbour's streaming query (started)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    def update(key: tuple[int], frames: Any, state: Any) -> Any:
        import hashlib

        import pandas as pd

        count, total = state.get if state.exists else (0, 0)
        for frame in frames:  # CPU work on every row: a hash of its value
            count += len(frame)
            for value in frame["value"]:
                total = (total + int(hashlib.sha256(str(value).encode()).hexdigest()[:8], 16)) % (
                    1_000_000_007
                )
        state.update((count, total))
        yield pd.DataFrame({"key": [key[0]], "n": [count]})

    rows = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", str(rows_per_second))
        .load()
        .selectExpr(f"value % {keys} AS key", "value")
    )
    counted = rows.groupBy("key").applyInPandasWithState(
        update,
        outputStructType="key long, n long",
        stateStructType="n long, total long",
        outputMode="update",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )
    return (
        counted.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def run(rows_per_second: int, keys: int) -> dict[str, Any]:
    """Run the neighbour until SIGTERM/SIGINT; what it did."""
    from pyspark.sql import SparkSession

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("recovery-bench-neighbour")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    checkpoint = tempfile.mkdtemp(prefix="recovery-neighbour-")
    durations: list[float] = []
    rows = 0
    try:
        running = query(spark, rows_per_second, keys, checkpoint)
        print(json.dumps({"started": time.time()}), flush=True)
        seen = -1
        while not stop.wait(0.5) and running.isActive:
            for progress in running.recentProgress:
                if int(progress["batchId"]) > seen:
                    seen = int(progress["batchId"])
                    durations.append(progress["durationMs"]["triggerExecution"] / 1000)
                    rows += int(progress["numInputRows"])
        error = running.exception()
        running.stop()
    finally:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    if error is not None:
        raise RuntimeError(f"the neighbour's query failed: {error}")
    return {
        "batches": len(durations),
        "rows": rows,
        "batch_p50_s": round(statistics.median(durations), 2) if durations else None,
        "batch_p90_s": (
            round(statistics.quantiles(durations, n=10)[-1], 2) if len(durations) > 1 else None
        ),
    }


class Neighbour:
    """A neighbour run started from the benchmark (a context manager: started on entry,
    stopped on exit, with every process it left killed)."""

    def __init__(self, rows_per_second: int, keys: int, log_path: str) -> None:
        self.rows_per_second, self.keys, self.log_path = rows_per_second, keys, log_path
        self.token = uuid.uuid4().hex
        self.proc: subprocess.Popen[str] | None = None
        self.summary: dict[str, Any] = {}

    def __enter__(self) -> Neighbour:
        env = {**os.environ, TOKEN_ENV: self.token, "PYSPARK_PYTHON": sys.executable}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "integration.bench.neighbour",
                    f"--rows-per-second={self.rows_per_second}",
                    f"--keys={self.keys}",
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                start_new_session=True,  # its own process group: a kill reaches all of it
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # its query started (or it failed)
        if not line.startswith("{"):
            self.__exit__(None, None, None)
            with open(self.log_path, errors="replace") as log:
                tail = log.read()[-2000:]
            raise RuntimeError(f"the neighbour did not start ({self.log_path}):\n{tail}")
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # it stops its query and session itself
        try:
            out, _ = proc.communicate(timeout=STOP_SECONDS)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            self.summary = json.loads(lines[-1]) if lines else {}
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in processes_with_token(self.token):  # PySpark's daemons leave the group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc = None

    def describe(self) -> str:
        """What the neighbour did while it ran (after the exit)."""
        s = self.summary
        if not s:
            return f"neighbour: no summary (see {self.log_path})"
        return (
            f"neighbour ({self.rows_per_second} rows/s, plain PySpark): {s['batches']} batches, "
            f"{s['rows']} rows, batch p50 {s['batch_p50_s']} s, p90 {s['batch_p90_s']} s"
        )


def processes_with_token(token: str) -> list[int]:
    """The processes whose environment carries this neighbour run's token."""
    mark = f"{TOKEN_ENV}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as fh:
            if mark in fh.read().split(b"\0"):
                found.append(int(name))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.bench.neighbour")
    parser.add_argument(
        "--rows-per-second", type=int, default=4000, help="rate source (default: %(default)s)"
    )
    parser.add_argument("--keys", type=int, default=500, help="keys (default: %(default)s)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.rows_per_second, args.keys)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
