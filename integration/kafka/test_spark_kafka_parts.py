"""Spark's own Kafka source and sink inside epochal jobs (issue 25), with the real broker and
the real PostgreSQL server: what a job submitted with each mix runs with, or why it is refused.

* Spark's Kafka sink (``format("kafka")``) is at-least-once: an exactly-once job with it is
  refused at submit (no batch runs), naming the sink and what to do.
* Spark's Kafka source (``format("kafka")``, replayable) into epochal's JDBC two-phase-commit
  sink and into its Kafka exactly-once sink: the job runs exactly-once, records Spark's source
  (``spark:kafka``) and epochal's sink with the guarantee each runs with, and its effective
  guarantee; the output holds every record once. The kit's crash tests of these mixes are in
  ``test_spark_kafka_source.py``.
* Spark's Kafka source does not give a replayed batch's records to the same Spark partitions
  as the first attempt (a batch planned live and the same batch replayed from the offset log
  list the topic's partitions in other orders), and epochal's Kafka sink commits per Spark
  partition: straight into it, an exactly-once job is refused at submit; rows routed by key
  (a keyed aggregation, ``repartition(col)``) keep it exactly-once across a whole-driver kill
  in the middle of a batch.

Warm drivers of the kit's pool run the jobs (the kit's session profile): the pipelines add
Spark's Kafka connector to the running session (:data:`epochal.pipelines.SOURCE_JARS_OPTION`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest
from epochal_kafka.testing import KafkaSinkUnderTest

from epochal.api import Job
from epochal.base.fault_plan import Fault
from epochal.config import JobConfig
from epochal.parts.records import PartRecord, read_parts
from epochal.pipelines import SPEC_ENV
from epochal.state.jobs import JobRecord, JobStatus
from epochal.testing import Scenario, run_case
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_sdk import Guarantee
from integration.harness.kafka import KafkaServer
from integration.kafka.spark_kafka import (
    SparkKafkaSourceUnderTest,
    kafka_jars,  # noqa: F401 - a fixture
    kafka_source_spec,
    spark_kafka_source,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

RECORDS = 100


@pytest.fixture
def source(
    kafka_server: KafkaServer,
    make_topic: Any,
    kafka_jars: list[str],  # noqa: F811
) -> SparkKafkaSourceUnderTest:
    """A 3-partition topic read by Spark's Kafka source, 50 records a batch."""
    return spark_kafka_source(kafka_server, make_topic(3), kafka_jars)


def _submit(
    name: str, spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, JobRecord]:
    """Run the kit's copy pipeline of ``spec`` as an exactly-once job to its end."""
    monkeypatch.setenv(SPEC_ENV, json.dumps(spec))
    config = JobConfig(
        guarantee=Guarantee.EXACTLY_ONCE,
        available_now=True,
        snapshot_dir=str(tmp_path / "snapshots"),
        restart_backoff=0.2,
        master=LOCAL,
        spark_conf=dict(TEST_SPARK_CONF),
    )
    job = Job.submit(f"{name}-{uuid.uuid4().hex[:6]}", "epochal.pipelines:copy", config)
    return job, job.join(timeout=300)


def _parts(job: Job) -> dict[str, PartRecord]:
    """The job's part records by ``<kind>:<connector>``."""
    return {f"{p.kind}:{p.connector}": p for p in read_parts(job.jobdir.store).values()}


def _check_sparks_source_recorded(job: Job, record: JobRecord, sink_connector: str) -> None:
    assert record.status == JobStatus.COMPLETED, record.failure
    assert record.effective_guarantee == "exactly-once"
    parts = _parts(job)
    assert set(parts) == {"source:spark:kafka", f"sink:{sink_connector}"}
    source = parts["source:spark:kafka"]
    assert (source.guarantee, source.contract) == ("exactly-once", "spark")
    assert source.target["label"].startswith("Spark's Kafka source (topics: it-kafka-")
    assert "replayable" in source.reason
    sink = parts[f"sink:{sink_connector}"]
    assert (sink.guarantee, sink.contract) == ("exactly-once", "transactional")


def test_sparks_kafka_sink_is_refused_at_submit_under_exactly_once(
    source: SparkKafkaSourceUnderTest,
    kafka_server: KafkaServer,
    make_topic: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = make_topic(2)  # nothing is read or written: the job is refused before it starts
    spec = {
        **kafka_source_spec(source),
        "sink": "kafka",
        "sink_format": "kafka",
        "sink_options": {"kafka.bootstrap.servers": kafka_server.bootstrap_servers, "topic": out},
    }
    _, record = _submit("spark-kafka-sink", spec, tmp_path, monkeypatch)
    assert record.status == JobStatus.FAILED, record.failure
    assert record.restarts == 0 and record.progress == {}
    failure = record.failure or ""
    assert "GuaranteeError" in failure
    assert f"sink 'kafka' (Spark's Kafka sink (topic: {out})) can give at most at-least-once" in (
        failure
    )
    assert "not transactional" in failure and "source 'kafka'" not in failure
    assert "--guarantee at-least-once" in failure and "--allow-downgrade" in failure


def test_sparks_kafka_source_straight_into_the_kafka_sink_is_refused_under_exactly_once(
    source: SparkKafkaSourceUnderTest,
    kafka_sink: KafkaSinkUnderTest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy pipeline without routing: epochal's Kafka sink settles each Spark partition
    on its own, and Spark's Kafka source may move a replayed batch's records between them."""
    spec = {
        **kafka_source_spec(source),
        "sink": "kafka",
        "sink_options": kafka_sink.options("transactional"),
    }
    _, record = _submit("spark-kafka-unrouted", spec, tmp_path, monkeypatch)
    assert record.status == JobStatus.FAILED, record.failure
    assert record.restarts == 0 and record.progress == {}
    failure = record.failure or ""
    assert "GuaranteeError" in failure and "source 'kafka'" in failure
    assert "settles each Spark partition on its own" in failure
    assert "route the rows by key" in failure
    assert kafka_sink.committed("transactional") == []


def test_sparks_kafka_source_into_the_jdbc_2pc_sink_runs_exactly_once(
    source: SparkKafkaSourceUnderTest,
    epochal_jdbc_sink: JdbcSinkUnderTest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = list(range(RECORDS))
    source.produce(ids)
    spec = {
        **kafka_source_spec(source),
        "sink": "jdbc",
        "sink_options": epochal_jdbc_sink.options("transactional"),
    }
    job, record = _submit("spark-kafka-jdbc", spec, tmp_path, monkeypatch)
    _check_sparks_source_recorded(job, record, "jdbc")
    seen = Counter(int(key) for key, _ in epochal_jdbc_sink.committed("transactional"))
    assert sorted(seen) == ids and max(seen.values()) == 1
    assert epochal_jdbc_sink.in_doubt() == []


def test_sparks_kafka_source_into_the_kafka_exactly_once_sink_with_rows_routed_by_key(
    source: SparkKafkaSourceUnderTest, kafka_sink: KafkaSinkUnderTest, tmp_path: Path
) -> None:
    """Spark's Kafka source → a keyed running aggregation (a hash shuffle routes each group to
    one Spark partition whatever order the source lists its partitions in) → epochal's Kafka
    sink. The whole driver is killed when the first task of batch 1 has committed its Kafka
    transaction (the sink commits in ``prepare``) and the others may not have: the replay
    writes only the partitions whose marker is not there. Every group's last value (count and
    sum of its IDs) is exact, and the job records Spark's source and epochal's sink."""
    fault = Fault("sink.after_prepare", 1, action="driver")
    scenario = Scenario(
        "aggregate", Guarantee.EXACTLY_ONCE, "transactional", (fault,), pipeline="aggregate"
    )
    snapshots = str(tmp_path / "snapshots")
    outcome = run_case(scenario, source, kafka_sink, snapshots, records=150, per_batch=50)
    assert outcome.fired == [fault.label], str(outcome)
    assert not outcome.lost and not outcome.duplicated, str(outcome)
    assert kafka_sink.in_doubt() == []
    job = Job(outcome.record.name, snapshots)
    _check_sparks_source_recorded(job, outcome.record, "kafka")


def test_sparks_kafka_source_read_in_order_runs_exactly_once_straight_into_the_kafka_sink(
    kafka_server: KafkaServer,
    make_topic: Any,
    kafka_jars: list[str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """``format("kafka-ordered")`` (:mod:`epochal.spark.ordered_kafka`) → epochal's Kafka
    sink, no routing: the whole driver is killed when the first task of batch 1 has committed
    its Kafka transaction, and the replay from the offset log gives every Spark partition the
    offset range it had. 0 lost, 0 duplicated, nothing left open, and the job records the
    ordered source as exactly-once.

    The mechanisms' checks (:mod:`integration.kafka.partition_order`, a plain session on the
    same topic of four partitions): Spark's own ``kafka`` plans a batch in the order its end
    offsets are listed (sorted as the offset log lists them on a replay, reversed as a broker
    may list them live), which is what loses and repeats records here; ``kafka-ordered`` plans
    both in partition order. And a ``kafka-ordered`` query stopped while it asks a broker that
    never answers for offsets ends stopped, without an error, as Spark's own does.
    """
    from epochal.spark import ordered_kafka

    fault = Fault("sink.after_prepare", 1, action="driver")
    scenario = Scenario("copy", Guarantee.EXACTLY_ONCE, "transactional", (fault,))
    ordered = spark_kafka_source(
        kafka_server, make_topic(4), kafka_jars, 80, ordered_jar=ordered_kafka.jar(), partitions=4
    )
    sink = KafkaSinkUnderTest(kafka_server.bootstrap_servers, make_topic(2))
    snapshots = str(tmp_path / "snapshots")
    outcome = run_case(scenario, ordered, sink, snapshots, records=320, per_batch=80)
    assert outcome.fired == [fault.label], str(outcome)
    assert not outcome.lost and not outcome.duplicated, str(outcome)
    assert sink.in_doubt() == []
    assert outcome.record.effective_guarantee == "exactly-once"
    recorded = _parts(Job(outcome.record.name, snapshots))["source:spark:kafka-ordered"]
    assert recorded.guarantee == "exactly-once", recorded
    assert "batches planned in order" in recorded.target["label"]

    probe_args = (kafka_server.bootstrap_servers, ordered.topic, "4", "kafka", ordered_kafka.FORMAT)
    try:
        probe = subprocess.run(
            [sys.executable, "-m", "integration.kafka.partition_order", *probe_args],
            env={
                **os.environ,
                "EPOCHAL_PROBE_JARS": ",".join(ordered.jars),
                "PYTHONPATH": str(ROOT),
            },
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # its stderr has its threads' stacks by then
        raw = exc.stderr or b""
        stderr = raw if isinstance(raw, str) else raw.decode(errors="replace")
        pytest.fail(f"the order probe ran past 300 s; its stderr ends:\n{stderr[-6000:]}")
    lines = [json.loads(x) for x in probe.stdout.splitlines() if x.startswith("{")]
    formats = {line["format"]: line for line in lines}
    assert set(formats) == {"kafka", "kafka-ordered"}, probe.stderr[-3000:]
    assert formats["kafka"]["planned"] == {"sorted": [0, 1, 2, 3], "reversed": [3, 2, 1, 0]}
    assert formats["kafka-ordered"]["planned"] == {
        "sorted": [0, 1, 2, 3],
        "reversed": [0, 1, 2, 3],
    }
    stopped = {"was_asking": True, "active": False, "exception": None}
    assert formats["kafka"]["stopped"] == stopped, formats["kafka"]
    assert formats["kafka-ordered"]["stopped"] == stopped, formats["kafka-ordered"]
