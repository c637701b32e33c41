"""Spark Declarative Pipelines: an epochal source and an epochal sink in a pipeline run by
``spark-pipelines run``, killed hard at a protocol step and run again.

The pipeline (``pipeline.yml`` and one Python file of definitions, written by the test) reads
the map connector's journal with ``spark.readStream.format("epochal.map")`` in an
``@dp.append_flow`` and writes it to a sink declared with ``dp.create_sink(..., format=
"epochal.map", options=...)``. The first run is SIGKILLed whole (the CLI, its Spark Connect
server's JVM, the Python workers) when the sink has prepared a batch's transactions and
recorded no decision; the second run completes the pipeline. An independent reader (the
target map's journal, one event per applied write) counts every key: each exactly once,
nothing left prepared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from epochal.base import processes
from epochal.base.fault_plan import FaultPlan
from epochal.state.layout import JobLayout
from epochal_map import MapStore

pytestmark = pytest.mark.spark

RECORDS = 200
JOB = "sdp"
FAULT = "sink.before_decision@2"


def spark_pipelines() -> list[str]:
    """The ``spark-pipelines`` launcher of the installed pyspark (never taken from PATH)."""
    import pyspark

    return ["bash", str(Path(pyspark.__file__).parent / "bin" / "spark-pipelines")]


def write_pipeline(root: Path, journal: str, snapshot_dir: str) -> Path:
    """A pipeline project: its spec and one file of definitions."""
    (root / "transformations").mkdir(parents=True)
    spec = root / "pipeline.yml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            name: epochal_in_a_pipeline
            storage: file://{root / "storage"}
            configuration:
              spark.sql.shuffle.partitions: "1"
            libraries:
              - glob:
                  include: transformations/**
            """
        )
    )
    job = {
        "epochal.job": JOB,
        "epochal.snapshotDir": snapshot_dir,
        "epochal.guarantee": "exactly-once",
        "epochal.faults": FAULT,
    }
    (root / "transformations" / "flows.py").write_text(
        textwrap.dedent(
            f"""\
            from pyspark import pipelines as dp
            from pyspark.sql import SparkSession

            spark = SparkSession.active()
            job = {job!r}
            dp.create_sink(
                "upper_sink",
                format="epochal.map",
                options={{"path": {journal!r}, "map": "upper", "mode": "transactional", **job}},
            )


            @dp.append_flow(target="upper_sink")
            def upper():
                return (
                    spark.readStream.format("epochal.map")
                    .option("path", {journal!r})
                    .option("map", "events")
                    .option("maxRecordsPerBatch", "50")
                    .options(**job)
                    .load()
                    .selectExpr("key", "upper(value) AS value")
                )
            """
        )
    )
    return spec


def run_pipeline(spec: Path, log: Path, token: str) -> subprocess.CompletedProcess[str]:
    """``spark-pipelines run`` as a user starts it; every process of it carries ``token``
    (the fault's ``driver`` action kills them all)."""
    env = {
        **os.environ,
        processes.RUN_TOKEN_ENV: token,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    with log.open("w") as out:
        return subprocess.run(
            [*spark_pipelines(), "run", "--spec", str(spec)],
            cwd=spec.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=600,
        )


def test_a_pipeline_with_epochal_parts_is_exactly_once_through_a_kill(tmp_path: Path) -> None:
    journal = str(tmp_path / "journal.sqlite")
    with MapStore(journal) as store:
        store.append_events("events", [(str(i), f"v{i}") for i in range(RECORDS)])
    snapshot_dir = str(tmp_path / "snapshots")
    spec = write_pipeline(tmp_path / "project", journal, snapshot_dir)
    plan = FaultPlan.parse(FAULT, JobLayout(snapshot_dir, JOB).faults)

    first = run_pipeline(spec, tmp_path / "first.log", processes.new_run_token())
    first_log = (tmp_path / "first.log").read_text()
    assert first.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), first_log[-4000:]
    assert plan.fired() == ["sink.before_decision@2"], first_log[-4000:]
    with MapStore(journal) as store:
        assert store.in_doubt("ep."), "the kill left no prepared transaction to recover"

    second = run_pipeline(spec, tmp_path / "second.log", processes.new_run_token())
    second_log = (tmp_path / "second.log").read_text()
    assert second.returncode == 0, second_log[-4000:]
    assert "Run is COMPLETED" in second_log, second_log[-4000:]

    with MapStore(journal) as store:
        written = Counter(
            event[1]
            for partition in store.journal_partitions("upper")
            for event in store.journal_read("upper", partition, 0, 1 << 62)
        )
        left_prepared = store.in_doubt("ep.")
        entries = store.entries("upper")
    lost = [str(i) for i in range(RECORDS) if str(i) not in written]
    duplicated = {key: n for key, n in written.items() if n > 1}
    assert (lost, duplicated, left_prepared) == ([], {}, []), (
        f"lost {len(lost)}, duplicated {len(duplicated)}, in doubt {len(left_prepared)}"
    )
    assert entries == {str(i): f"V{i}" for i in range(RECORDS)}
