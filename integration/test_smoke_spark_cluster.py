"""Smoke test: the standalone cluster runs Python jobs on two executors and survives the
loss of a worker.

A driver (its own process, as epochal runs drivers) runs a Python UDF over 8 partitions on
the cluster's two 1-core executors. Every row the UDF starts leaves a marker file naming
its partition, attempt and process ancestry, so the test knows which worker runs which
task. While a task runs on worker 1's executor, worker 1 is killed with SIGKILL (with its
executor): the master marks it DEAD, the job still finishes with every row exactly once
(the lost task ran again on worker 0), and worker 1, started again on the same ports,
registers ALIVE and gets an executor of the running application.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from integration.harness import HarnessError, wait_until
from integration.harness.spark_cluster import SparkCluster, driver_argv, driver_result

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 8
ROWS_PER_PARTITION = 4
ROW_SECONDS = 0.3
DEADLINE = 180.0


class DriverDiedError(HarnessError):
    """The driver process exited early (a HarnessError, so wait_until stops at once)."""


def _executors(spark: Any) -> int:
    """Executors registered with the driver (the driver's own block manager excluded)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def _cluster_driver(args: dict[str, Any]) -> dict[str, Any]:
    """Run in the driver process: the UDF job, then wait for the test's go to stop."""
    from pyspark.sql import SparkSession, functions, types

    builder = SparkSession.builder.appName("epochal-cluster-smoke")
    for key, value in args["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    markers, row_seconds = args["markers"], args["row_seconds"]

    def slow_double(value: int) -> int:
        import os
        import time
        from pathlib import Path

        from pyspark import TaskContext

        import epochal  # noqa: F401 - the executors' Python sees the installed packages

        chain, pid = [], os.getpid()
        while pid > 1 and len(chain) < 10:  # this Python worker and its ancestors
            chain.append(pid)
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        ctx = TaskContext.get()
        name = f"{ctx.partitionId()}-{ctx.attemptNumber()}-{value}-{os.getpid()}"
        Path(markers, name + ".tmp").write_text(" ".join(map(str, chain)))
        Path(markers, name + ".tmp").rename(Path(markers, name))
        time.sleep(row_seconds)
        return value * 2

    try:
        deadline = time.monotonic() + 60
        while _executors(spark) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {_executors(spark)} executors registered")
            time.sleep(0.1)
        double = functions.udf(slow_double, types.LongType())
        rows = PARTITIONS * ROWS_PER_PARTITION
        frame = spark.range(0, rows, 1, numPartitions=PARTITIONS).select(double("id").alias("v"))
        values = sorted(row.v for row in frame.collect())
        Path(args["result"]).write_text(json.dumps(values))
        deadline = time.monotonic() + 120
        while not Path(args["done"]).exists():  # the test restarts the worker meanwhile
            if time.monotonic() > deadline:
                raise TimeoutError("the test never said done")
            time.sleep(0.1)
        deadline = time.monotonic() + 60  # the restarted worker's executor registers
        while _executors(spark) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        return {"values": values, "executors_at_end": _executors(spark)}
    finally:
        spark.stop()


def _markers(directory: Path) -> list[dict[str, Any]]:
    """The UDF's marker files: partition, attempt, row, pid and ancestry of each row."""
    found = []
    for path in directory.iterdir():
        if path.name.endswith(".tmp"):
            continue
        partition, attempt, row, pid = (int(part) for part in path.name.split("-"))
        chain = [int(p) for p in path.read_text().split()]
        found.append(
            {"partition": partition, "attempt": attempt, "row": row, "pid": pid, "chain": chain}
        )
    return found


def test_job_survives_a_killed_worker(spark_cluster: SparkCluster, tmp_path: Path) -> None:
    """Kill a worker (and its executor) mid-job: the job finishes, the worker comes back."""
    spark_cluster.require_faults()
    cluster = spark_cluster
    cluster.wait_for_alive_workers(2)
    victim = cluster.workers[1]
    victim_pid = victim.pid
    assert victim_pid is not None
    markers = tmp_path / "markers"
    markers.mkdir()
    args = {
        "conf": cluster.session_conf(),
        "markers": str(markers),
        "row_seconds": ROW_SECONDS,
        "result": str(tmp_path / "result.json"),
        "done": str(tmp_path / "done"),
    }
    log_path = tmp_path / "driver.log"

    def driver_log() -> str:
        return log_path.read_text(errors="replace")[-6000:]

    with log_path.open("wb") as log:
        driver = subprocess.Popen(
            driver_argv("integration.test_smoke_spark_cluster", "_cluster_driver", args),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **cluster.driver_env()},
        )
    try:

        def alive() -> None:
            if driver.poll() is not None:
                raise DriverDiedError(f"driver exited {driver.returncode}:\n{driver_log()}")

        def running_on_victim() -> tuple[int, int] | None:
            """A task on the victim's executor with at least two rows still to go."""
            alive()
            rows: dict[tuple[int, int], int] = {}
            for marker in _markers(markers):
                if victim_pid in marker["chain"]:
                    task = (marker["partition"], marker["attempt"])
                    rows[task] = rows.get(task, 0) + 1
            return next((t for t, n in rows.items() if n <= ROWS_PER_PARTITION - 2), None)

        task = wait_until(running_on_victim, DEADLINE, "a task on worker 1", interval=0.05)
        partition = task[0]
        cluster.kill_worker(1)
        wait_until(
            lambda: victim.state() in ("DEAD", "ABSENT") and cluster.alive_workers == 1,
            30,
            "the master to mark worker 1 dead",
        )

        def result() -> list[int] | None:
            alive()
            path = Path(args["result"])
            return json.loads(path.read_text()) if path.exists() else None

        values = wait_until(result, DEADLINE, "the job's result", interval=0.2)
        assert values == [2 * i for i in range(PARTITIONS * ROWS_PER_PARTITION)]
        lost = [m for m in _markers(markers) if (m["partition"], m["attempt"]) == task]
        assert len(lost) < ROWS_PER_PARTITION, f"the killed task of partition {partition} finished"
        reruns = {
            m["attempt"]
            for m in _markers(markers)
            if m["partition"] == partition and victim_pid not in m["chain"]
        }
        assert reruns, f"partition {partition} was not run again on the surviving worker"

        started = time.monotonic()
        cluster.start_worker(1)
        assert victim.state() == "ALIVE"
        assert cluster.alive_workers == 2
        assert victim.pid != victim_pid
        wait_until(
            lambda: (victim.worker.entry() or {}).get("coresused") == 1,
            90,
            "the running application to get an executor on the restarted worker",
        )
        rejoin_seconds = time.monotonic() - started

        Path(args["done"]).touch()
        assert driver.wait(timeout=DEADLINE) == 0, f"driver failed:\n{driver_log()}"
        outcome = driver_result(log_path.read_text(errors="replace"))
        assert outcome is not None, driver_log()
        assert outcome["executors_at_end"] == 2
        assert rejoin_seconds < 90
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
