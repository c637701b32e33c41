"""Every benchmark command runs: each ``python -m integration.bench.<name> --smoke`` (one round,
small batches, no warm-up) against the session's servers, printing its figures.

The figures of a smoke run measure nothing; what fails here is a benchmark that no longer
runs (a refused job, a changed option, a broken report) or that stops printing its ratios with
their spread. The servers are the harness's, shared by every command through
``EPOCHAL_KAFKA_BOOTSTRAP``, ``EPOCHAL_POSTGRES_DSN`` (a fresh database per command) and
``EPOCHAL_STOMP_URL``, so no command starts a server of its own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from integration.harness.jms import JmsServer
from integration.harness.kafka import KafkaServer
from integration.harness.plugin import PostgresDatabase

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parent.parent
SPREAD = re.compile(r"\d+\.\d{3} \(IQR [\d.]+-[\d.]+, 95% CI [\d.]+-[\d.]+, 1 rounds\)")
"""A figure with its spread as :class:`integration.bench.common.Spread` prints it."""
PLOTS = importlib.util.find_spec("matplotlib") is not None


def run_bench(module: str, tmp_path: Path, env: dict[str, str], *args: str) -> str:
    """Run ``python -m integration.bench.<module> --smoke`` with the servers in ``env``;
    its output (stdout and stderr), after checking that it exited 0 and drew its plot."""
    plot = tmp_path / f"{module}.png"
    command = [sys.executable, "-m", f"integration.bench.{module}", "--smoke", "--plot", str(plot)]
    completed = subprocess.run(
        [*command, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=840,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]
    if PLOTS:
        assert plot.stat().st_size > 0, output[-2000:]
    else:
        assert "no plot: matplotlib is not installed" in output
    return completed.stdout


def kafka_env(kafka_server: KafkaServer) -> dict[str, str]:
    return {"EPOCHAL_KAFKA_BOOTSTRAP": kafka_server.bootstrap_servers}


def ratios(output: str, *labels: str) -> None:
    """Each of ``labels`` is printed, with a ratio and its spread right after it."""
    for label in labels:
        at = output.find(label)
        assert at >= 0, f"{label!r} not printed:\n{output}"
        assert SPREAD.search(output, at, at + len(label) + 200), output[at : at + 400]


@pytest.mark.timeout(900)
def test_fastpath_bench(
    kafka_server: KafkaServer, postgres_db: PostgresDatabase, tmp_path: Path
) -> None:
    env = {**kafka_env(kafka_server), "EPOCHAL_POSTGRES_DSN": postgres_db.dsn}
    output = run_bench("fastpath_bench", tmp_path, env)
    assert "MISSED" in output or "met" in output
    assert "OUTPUT DOES NOT HOLD EVERY RECORD ONCE" not in output
    assert re.search(r"fast path, keyed → epochal Kafka \(EO\) +\d+", output), output
    ratios(
        output,
        "fast path, keyed → epochal Kafka (EO) / Spark Kafka → Spark Kafka (ALO)",
        "fast path → epochal JDBC 2PC (EO) / foreachBatch psycopg COPY (ALO)",
        "fast path, in order → foreachBatch epochal Kafka (EO) / Spark Kafka → Spark Kafka (ALO)",
        "fast path → foreachBatch epochal JDBC 2PC (EO) / foreachBatch psycopg COPY (ALO)",
    )


@pytest.mark.timeout(900)
def test_kafka_bench(kafka_server: KafkaServer, tmp_path: Path) -> None:
    output = run_bench("kafka_bench", tmp_path, kafka_env(kafka_server))
    assert "MISMATCH" not in output and "every record once" in output
    ratios(
        output,
        "epochal exactly-once / epochal at-least-once",
        "epochal at-least-once / spark built-in",
    )


@pytest.mark.timeout(900)
def test_flink_bench(kafka_server: KafkaServer, tmp_path: Path) -> None:
    """Both ways (epochal in a SparkSession, PyFlink's SQL job in its own process) copy the
    same topic exactly-once; the reader finds every record once in each output."""
    output = run_bench("flink_bench", tmp_path, kafka_env(kafka_server))
    assert "every output holds every record once" in output, output
    assert re.search(r"PyFlink exactly-once +\d+ ", output), output
    ratios(output, "epochal exactly-once / PyFlink exactly-once")


@pytest.mark.timeout(900)
def test_kafka_jdbc_bench(
    kafka_server: KafkaServer, postgres_db: PostgresDatabase, tmp_path: Path
) -> None:
    env = {**kafka_env(kafka_server), "EPOCHAL_POSTGRES_DSN": postgres_db.dsn}
    output = run_bench("kafka_jdbc_bench", tmp_path, env)
    ratios(
        output,
        "2PC (exactly-once) / plain (at-least-once)",
        "upsert (exactly-once, idempotent) / plain (at-least-once)",
    )


def test_jdbc_bench(postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    output = run_bench("jdbc_bench", tmp_path, {"EPOCHAL_POSTGRES_DSN": postgres_db.dsn})
    assert "2PC (exactly-once)" in output and "bare psycopg COPY" in output
    ratios(output, "2PC / plain", "plain / bare")


@pytest.mark.timeout(900)
def test_jms_bench(jms_server: JmsServer, tmp_path: Path) -> None:
    output = run_bench("jms_bench", tmp_path, {"EPOCHAL_STOMP_URL": jms_server.url})
    assert "epochal source exactly-once" in output and "epochal sink exactly-once" in output
    ratios(output, "source exactly-once / at-least-once", "sink exactly-once / at-least-once")


@pytest.mark.timeout(900)
def test_latency_bench(kafka_server: KafkaServer, tmp_path: Path) -> None:
    # one trigger (the 1 s one): each trigger is the same code with another interval, and
    # each costs three more queries
    kept = tmp_path / "latency.json"
    output = run_bench(
        "latency_bench", tmp_path, kafka_env(kafka_server), "--triggers", "1", "--json", str(kept)
    )
    assert "MISSING" not in output, output
    assert "trigger 1s" in output and "trigger asap" not in output, output
    assert re.search(r"p99 +\d+\.\d{3} \(IQR", output), output
    ratios(
        output,
        "p99 epochal exactly-once / Spark Kafka → Spark Kafka (ALO) (target <= 1.2)",
        "p99 fast path, in order → foreachBatch epochal (EO) / Spark Kafka → Spark Kafka (ALO)",
        "p99 epochal at-least-once / Spark Kafka → Spark Kafka (ALO)",
    )
    # the kept runs give the same report again, without a broker or Spark
    replot = ["--replot", str(kept), "--plot", str(tmp_path / "again.png")]
    again = subprocess.run(
        [sys.executable, "-m", "integration.bench.latency_bench", *replot],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("trigger 1s:"))
    end = next(i for i, line in enumerate(lines) if "plot" in line and i > start)
    report = lines[start:end]
    assert "\n".join(report) in again.stdout, again.stdout


@pytest.mark.timeout(900)
def test_batch_timeline_bench(kafka_server: KafkaServer, tmp_path: Path) -> None:
    """Every way's batches are taken apart: epochal's ways show their sink tasks' steps and
    the driver's commit (from epochal's timeline), Spark's pair and PySpark's floor only
    Spark's own parts."""
    output = run_bench("batch_timeline", tmp_path, kafka_env(kafka_server))
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in output.splitlines()
        if line.startswith("| ")
    }
    header = rows["ms per batch (mean)"]
    assert header == ["2 p EO", "2 p fast EO", "2 p ALO", "2 p Spark", "2 p PySpark floor"], header
    steps = [r for r in rows if r.startswith("addBatch: ") and r != "addBatch: task run"]
    python = ("Python worker hand-off", "sink start", "first rows", "more rows", "writing")
    marked = {
        way: sum(int(rows[r][n]) for r in steps if r.removeprefix("addBatch: ") in python)
        for n, way in enumerate(header)
    }  # epochal's timeline: only epochal's ways have steps in a Python worker
    assert all(marked[w] > 0 for w in header[:3]), marked
    assert marked["2 p Spark"] == marked["2 p PySpark floor"] == 0, marked
    assert int(rows["addBatch: task run"][3]) > 0 and int(rows["addBatch: task run"][4]) > 0, rows


@pytest.mark.timeout(900)
def test_recovery_bench(tmp_path: Path) -> None:
    output = run_bench("recovery", tmp_path, {})
    assert "| recovery |" in output
    assert re.search(r"in-place.*\(1 MB\): \d+\.\d\d", output), output
    assert "plain PySpark, new process, no state" in output


@pytest.mark.timeout(900)
def test_scale_bench(kafka_server: KafkaServer, tmp_path: Path) -> None:
    """Every part runs and prints its figures: throughput by partitions beside Spark's pair,
    restart by age with the reads of the verification, several jobs, memory over a run."""
    output = run_bench("scale_bench", tmp_path, kafka_env(kafka_server))
    assert "MISMATCH" not in output and "every record once" in output
    assert re.search(r"exactly-once / Spark pair at 4 partitions against 2: \d", output), output
    assert re.search(r"age +300 batches: resume → first batch [\d.]+ s", output), output
    assert re.search(r"1 x epochal exactly-once, a driver each +\d+ rec/s", output), output
    assert re.search(r"batch +\d+: heap after GC \d+ MB", output), output
