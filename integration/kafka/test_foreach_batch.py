"""Exactly-once through ``foreachBatch`` (:mod:`epochal.spark.foreach_batch`), with the real
broker and PostgreSQL server: Spark's own Kafka source → ``foreachBatch`` → the JDBC 2PC sink,
the Kafka exactly-once sink, and an update-mode ``groupBy().agg()`` → the JDBC upsert sink.

The query runs in a user's plain session (:mod:`epochal.testing.session_app`, an
``availableNow`` run), the job in the writer's options. The whole driver (the application,
its JVM, its Python workers, its lease keeper) is killed with SIGKILL at the protocol's named
steps, one after another in one job (a sequential fault plan: each step fires after the one
before it fired, at a later batch); the test is the restarter, starting the application again
until it finishes. An independent reader then counts the records by ID: 0 lost,
0 duplicated, nothing left prepared or open; for the aggregation the table equals a recount.

The mutant case runs the JDBC case with a writer that writes a replayed batch again (each
task committing its own transaction) instead of completing its decision: it must duplicate.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest
from epochal_kafka.testing import KafkaSinkUnderTest

from epochal.base import processes
from epochal.base.fault_plan import FaultPlan
from epochal.pipelines import SPEC_ENV
from epochal.spark import ordered_kafka
from epochal.spark.common import Part
from epochal.spark.foreach_batch import ForeachBatchWriter, run_tasks
from epochal.state.layout import JobLayout
from epochal.testing.scenarios import KIT_LEASE_TTL, with_temp_dir
from epochal_sdk import Guarantee
from integration.harness.kafka import KafkaServer
from integration.kafka.spark_kafka import (
    SparkKafkaSourceUnderTest,
    kafka_jars,  # noqa: F401 - a fixture
    kafka_source_spec,
    spark_kafka_source,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

APP_MODULE = "epochal.testing.session_app"
MAX_STARTS = 8
RECORDS = 300
PER_BATCH = 50
KILLS = "sink.before_decision@1 > sink.after_decision@2 > sink.mid_commit@3 > sink.after_commit@4"
"""The driver killed at each step of the sink's two-phase commit, at batches 1 to 4: an
undecided batch (rolled back, written again), a decided one before phase 2 and one half
committed (completed by the next run's recovery, not written again), and one committed but
not in Spark's commit log (a replay of a decided batch: completed, nothing written)."""


def job_spec(tmp_path: Path, spec: dict[str, Any], plan: str, job: str = "fb") -> dict[str, Any]:
    """``spec`` with its sink as a ``foreachBatch`` writer of job ``job`` (its snapshot
    directory under ``tmp_path``) and the fault plan ``plan``."""
    options = {
        **spec["sink_options"],
        "epochal.job": job,
        "epochal.snapshotDir": str(tmp_path / "snapshots"),
        "epochal.faults": plan,
        "epochal.leaseTtl": str(KIT_LEASE_TTL),
    }
    return {**spec, "sink_path": "foreachBatch", "sink_options": options}


def start_app(tmp_path: Path, spec: dict[str, Any], tag: str) -> tuple[int, Path]:
    """Run the application once, to its end: its exit code and its log. What is left of a
    killed run is killed after it, as a restarter's container is."""
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir(exist_ok=True)
    token = processes.new_run_token()
    env = {
        **with_temp_dir(str(temp_dir)),
        SPEC_ENV: json.dumps(spec),
        processes.RUN_TOKEN_ENV: token,
        "PYSPARK_PYTHON": sys.executable,
    }
    log = tmp_path / f"app-{tag}.log"
    with open(log, "w") as out:
        app = subprocess.run(
            [sys.executable, "-m", APP_MODULE, str(tmp_path / "checkpoint")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=600,
            check=False,
        )
    processes.kill_run(token)
    return app.returncode, log


def run_until_done(tmp_path: Path, spec: dict[str, Any], plan: str) -> tuple[list[str], int]:
    """Run the application of ``spec`` with the fault plan ``plan`` as a restarter does,
    until it finishes; returns the faults that fired and how many starts it took."""
    spec = job_spec(tmp_path, spec, plan)
    layout = JobLayout(str(tmp_path / "snapshots"), "fb")
    starts = 0
    while True:
        assert starts < MAX_STARTS, f"the application did not finish in {MAX_STARTS} starts"
        code, log = start_app(tmp_path, spec, str(starts))
        starts += 1
        if code == 0:
            break
        assert code == -signal.SIGKILL, f"the application failed ({code}):\n" + _tail(log)
    return FaultPlan.parse(plan, layout.faults).fired(), starts


def _tail(path: Path) -> str:
    return "\n".join(path.read_text().splitlines()[-60:])


def counted(ids: Sequence[int], committed: Sequence[tuple[str, str]]) -> tuple[int, int]:
    """(lost, duplicated) records, by ID."""
    seen = collections.Counter(int(key) for key, _ in committed)
    lost = sum(1 for i in ids if seen[i] == 0)
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    return lost, duplicated


@pytest.fixture
def source(
    kafka_server: KafkaServer,
    make_topic: Any,
    kafka_jars: list[str],  # noqa: F811
) -> SparkKafkaSourceUnderTest:
    made = spark_kafka_source(kafka_server, make_topic(3), kafka_jars, PER_BATCH)
    made.produce(range(RECORDS))
    return made


def copy_spec(source: SparkKafkaSourceUnderTest, sink: Any, route_by_key: bool) -> dict[str, Any]:
    return {
        **kafka_source_spec(source),
        "sink": sink.connector,
        "sink_options": sink.options("transactional"),
        "pipeline": "copy",
        "route_by_key": route_by_key,
    }


def jdbc_case(
    tmp_path: Path, source: SparkKafkaSourceUnderTest, sink: JdbcSinkUnderTest, writer: str = ""
) -> tuple[int, int, list[str]]:
    """The JDBC 2PC case (with the writer factory ``writer`` names, default epochal's):
    lost, duplicated, in doubt."""
    spec = copy_spec(source, sink, False)
    if writer:
        spec["writer"] = writer
    fired, starts = run_until_done(tmp_path, spec, KILLS)
    assert fired == [k.strip() for k in KILLS.split(">")]
    lost, duplicated = counted(range(RECORDS), sink.committed("transactional"))
    in_doubt = sink.in_doubt()
    print(
        f"jdbc 2pc{' ' + writer if writer else ''}: {starts} starts, lost {lost}, "
        f"duplicated {duplicated}, in doubt {in_doubt}"
    )
    return lost, duplicated, in_doubt


def test_kafka_source_into_the_jdbc_2pc_sink(
    tmp_path: Path, source: SparkKafkaSourceUnderTest, epochal_jdbc_sink: JdbcSinkUnderTest
) -> None:
    assert jdbc_case(tmp_path, source, epochal_jdbc_sink) == (0, 0, [])


@pytest.mark.parametrize("form", ["read-in-order", "routed-by-key"])
def test_kafka_source_into_the_kafka_sink(
    tmp_path: Path,
    form: str,
    kafka_server: KafkaServer,
    make_topic: Any,
    kafka_jars: list[str],  # noqa: F811
    kafka_sink: KafkaSinkUnderTest,
) -> None:
    """The Kafka sink settles each Spark partition on its own, so Spark's Kafka source is
    read in order (``format("kafka-ordered")``, no shuffle) or its rows routed by key. Read
    in order, every kill of :data:`KILLS`; routed by key, the first only (an undecided batch
    replayed: the one step where it matters which Spark partition a record is in; the later
    ones test the sink's decision, the same in both forms)."""
    ordered_jar = ordered_kafka.jar() if form == "read-in-order" else None
    source = spark_kafka_source(
        kafka_server, make_topic(3), kafka_jars, PER_BATCH, ordered_jar=ordered_jar
    )
    source.produce(range(RECORDS))
    spec = copy_spec(source, kafka_sink, route_by_key=ordered_jar is None)
    kills = KILLS if ordered_jar else KILLS.split(">")[0].strip()
    fired, starts = run_until_done(tmp_path, spec, kills)
    assert fired == [k.strip() for k in kills.split(">")]
    lost, duplicated = counted(range(RECORDS), kafka_sink.committed("transactional"))
    in_doubt = kafka_sink.in_doubt()
    print(f"kafka ({form}): {starts} starts, lost {lost}, duplicated {duplicated}")
    print(f"kafka ({form}): in doubt {in_doubt}")
    assert (lost, duplicated, in_doubt) == (0, 0, [])


def test_kafka_source_straight_into_the_kafka_sink_is_refused_under_exactly_once(
    tmp_path: Path, source: SparkKafkaSourceUnderTest, kafka_sink: KafkaSinkUnderTest
) -> None:
    """The writer judges Spark's sources of its query as the session check does: the Kafka
    sink settles each Spark partition on its own, so Spark's Kafka source (``format("kafka")``)
    needs the rows routed by key before it, or to be read in order; without, the run is
    refused before it writes anything."""
    code, log = start_app(
        tmp_path, job_spec(tmp_path, copy_spec(source, kafka_sink, False), ""), "0"
    )
    text = log.read_text()
    assert code == 1, _tail(log)
    assert "GuaranteeError" in text and "route the rows by key" in text, _tail(log)
    assert "format('kafka-ordered')" in text, _tail(log)
    assert kafka_sink.committed("transactional") == []


GROUPS = 7


def test_update_mode_aggregation_into_the_jdbc_upsert_sink(
    tmp_path: Path, source: SparkKafkaSourceUnderTest, epochal_jdbc_sink: JdbcSinkUnderTest
) -> None:
    spec = {
        **kafka_source_spec(source),
        "sink": "jdbc",
        "sink_options": epochal_jdbc_sink.options("idempotent"),
        "pipeline": "group_counts",
        "groups": GROUPS,
        "output_mode": "update",
    }
    plan = "sink.after_flush@1:driver > sink.after_commit@3"
    fired, starts = run_until_done(tmp_path, spec, plan)
    assert fired == ["sink.after_flush@1:driver", "sink.after_commit@3"]
    table = dict(epochal_jdbc_sink.committed("idempotent"))
    recount = {
        str(g): f"{len(ids)}:{sum(ids)}"
        for g in range(GROUPS)
        for ids in [[i for i in range(RECORDS) if i % GROUPS == g]]
    }
    print(f"aggregation: {starts} starts, table == recount: {table == recount}")
    assert table == recount


# -- the mutant -------------------------------------------------------------------------------
class RewritingWriter(ForeachBatchWriter):
    """A writer that writes a replayed batch again instead of completing its decision: each
    task commits its own transaction, as a plain ``foreachBatch`` function does."""

    def _complete_replay(self, part: Part, frame: Any, batch: int) -> None:
        run_tasks(replace(part, guarantee=Guarantee.AT_LEAST_ONCE), frame, batch, "transactional")


def rewriting_writer(connector: str, options: dict[str, str]) -> RewritingWriter:
    """:class:`RewritingWriter`, built as :func:`epochal.foreach_batch` builds the writer."""
    return RewritingWriter(connector, options)


def test_the_jdbc_case_catches_a_writer_that_writes_a_replayed_batch_again(
    tmp_path: Path, source: SparkKafkaSourceUnderTest, epochal_jdbc_sink: JdbcSinkUnderTest
) -> None:
    lost, duplicated, _ = jdbc_case(
        tmp_path, source, epochal_jdbc_sink, f"{__name__}:rewriting_writer"
    )
    assert duplicated > 0, "the mutant writes replayed batches again: the case must see it"
    assert lost == 0
