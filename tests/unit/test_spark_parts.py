"""Spark's own parts in a job, without Spark: their ids and records, the remedies a refusal
names (a supervised job, a plain session), and the plain-session verdict a planner reads
(its own driver's only, a refusing one only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from epochal.parts.job_context import JobContext
from epochal.parts.spark_plan import (
    SPARK_PARTS,
    Origin,
    PlanPart,
    Role,
    judge,
    part_records,
    session_refusal,
    session_verdict_path,
)
from epochal.parts.spark_plan.classification import class_name
from epochal.state.layout import JobLayout
from epochal.state.lease.session import DriverJvm
from epochal_sdk import Guarantee
from epochal_sdk.errors import GuaranteeError


def _spark(role: Role, fmt: str, label: str, family: str | None = None) -> PlanPart:
    capability = SPARK_PARTS[(role, family or fmt)]
    return PlanPart(role, fmt, label, Origin.SPARK, capability.guarantee, capability.why)


KAFKA_SOURCE = _spark(Role.SOURCE, "kafka", "Spark's Kafka source (topics: events)")
CONSOLE = _spark(Role.SINK, "console", "Spark's console sink")
FOREACH_BATCH = _spark(Role.SINK, "foreachBatch", "a foreachBatch function", "foreachbatch")
EPOCHAL_SINK = PlanPart(
    Role.SINK, "epochal.jdbc", "epochal's 'jdbc' connector", Origin.EPOCHAL, None, ""
)
STATIC = PlanPart(Role.STATIC, "Range", "a batch relation (Range)", Origin.SPARK, None, "")


def test_a_parts_id_is_stable_names_its_origin_and_format_and_holds_only_safe_characters() -> None:
    again = _spark(Role.SOURCE, "kafka", "Spark's Kafka source (topics: events)")
    assert KAFKA_SOURCE.part_id == again.part_id
    assert KAFKA_SOURCE.part_id.startswith("spark-kafka-")
    assert FOREACH_BATCH.part_id.startswith("spark-foreachbatch-")
    other_topic = _spark(Role.SOURCE, "kafka", "Spark's Kafka source (topics: other)")
    assert other_topic.part_id != KAFKA_SOURCE.part_id
    assert all(c.isalnum() or c == "-" for c in KAFKA_SOURCE.part_id)
    assert (KAFKA_SOURCE.connector, FOREACH_BATCH.connector) == (
        "spark:kafka",
        "spark:foreachBatch",
    )


def test_records_name_each_part_judged_here_with_the_guarantee_it_runs_with() -> None:
    verdict = judge(
        (KAFKA_SOURCE, STATIC, EPOCHAL_SINK), Guarantee.EXACTLY_ONCE, allow_downgrade=False
    )
    records = part_records(verdict)
    assert [(r.kind, r.connector, r.guarantee, r.contract) for r in records] == [
        ("source", "spark:kafka", "exactly-once", "spark")
    ]
    assert records[0].target == {"label": "Spark's Kafka source (topics: events)"}
    assert records[0].key == f"source-{KAFKA_SOURCE.part_id}"
    assert "replayable" in records[0].reason

    downgraded = judge((KAFKA_SOURCE, FOREACH_BATCH), "exactly-once", allow_downgrade=True)
    assert downgraded.effective is Guarantee.AT_LEAST_ONCE
    assert [r.guarantee for r in part_records(downgraded)] == ["exactly-once", "at-least-once"]


def test_a_refusal_names_the_remedies_of_where_the_job_runs() -> None:
    with pytest.raises(GuaranteeError) as supervised:
        judge((KAFKA_SOURCE, CONSOLE), "exactly-once", allow_downgrade=False)
    assert "--guarantee none" in str(supervised.value)
    assert "JobConfig(allow_downgrade=True)" in str(supervised.value)
    with pytest.raises(GuaranteeError) as session:
        judge((KAFKA_SOURCE, CONSOLE), "exactly-once", allow_downgrade=False, in_session=True)
    assert ".option('epochal.guarantee', 'none')" in str(session.value)
    assert ".option('epochal.allowDowngrade', 'true')" in str(session.value)
    assert "JobConfig" not in str(session.value)


def _write_verdict(job_dir: str, driver: DriverJvm, refused: str | None) -> None:
    path = session_verdict_path(job_dir, driver)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"driver": driver.key, "refused": refused}, fh)


def test_a_planner_reads_its_own_drivers_refusing_verdict_only(tmp_path: Path) -> None:
    job_dir = JobLayout(str(tmp_path), "job").path
    context = JobContext(job="job", job_dir=job_dir)
    assert session_refusal(context) is None  # no verdict

    this_driver = DriverJvm.current()
    _write_verdict(job_dir, this_driver, "sink 'console' ... Refusing to start.")
    assert session_refusal(context) == "sink 'console' ... Refusing to start."
    assert session_verdict_path(job_dir, this_driver).startswith(f"{job_dir}/sessions/")

    supervised = JobContext(job="job", job_dir=job_dir, supervised=True)
    assert session_refusal(supervised) is None  # its driver judged the query before it started
    assert session_refusal(JobContext(job="job")) is None  # no job directory

    _write_verdict(job_dir, this_driver, None)  # the next query of this driver passed
    assert session_refusal(context) is None

    os.remove(session_verdict_path(job_dir, this_driver))
    earlier_jvm = DriverJvm(this_driver.pid, this_driver.started + 1)
    _write_verdict(job_dir, earlier_jvm, "refused long ago")
    assert session_refusal(context) is None  # another JVM's verdict is never read


class _JvmObject:
    """A py4j object as far as ``class_name`` reads it: its class's name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def getClass(self) -> _JvmObject:
        return self

    def getName(self) -> str:
        return self.name


@pytest.mark.parametrize(
    ("spark_4_0", "spark_4_1"),
    [
        ("StreamingRelation", "runtime.StreamingRelation"),
        ("StreamingExecutionRelation", "runtime.StreamingExecutionRelation"),
        ("MemoryStream", "runtime.MemoryStream"),
        ("FileStreamSource", "runtime.FileStreamSource"),
        ("FileStreamSink", "sinks.FileStreamSink"),
    ],
)
def test_the_streaming_classes_spark_4_1_moved_are_named_as_4_1_names_them(
    spark_4_0: str, spark_4_1: str
) -> None:
    """Spark 4.0 keeps these in ``execution.streaming`` itself: a Delta or file source there
    was 'a streaming plan node epochal does not know', and an exactly-once job refused."""
    streaming = "org.apache.spark.sql.execution.streaming."
    expected = streaming + spark_4_1
    assert class_name(_JvmObject(streaming + spark_4_0)) == expected
    assert class_name(_JvmObject(expected)) == expected  # 4.1+: as it is
    other = "org.apache.spark.sql.execution.streaming.sources.MemorySink"
    assert class_name(_JvmObject(other)) == other
