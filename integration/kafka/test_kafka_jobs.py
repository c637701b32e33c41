"""Whole jobs on Kafka with the real broker: Kafka → Spark (keyed aggregation in Spark state)
→ Kafka exactly-once across a driver kill, and a Kafka → Kafka copy that survives a broker
stop/restart in the middle of the run."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from epochal_kafka.testing import (
    KafkaSinkUnderTest,
    KafkaSourceUnderTest,
    read_to_end,
    unstable_partitions,
)

from epochal.api import Job
from epochal.base.fault_plan import Fault
from epochal.config import JobConfig
from epochal.pipelines import SPEC_ENV
from epochal.state.jobs import JobStatus
from epochal.testing import Scenario, run_case
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_sdk import Guarantee
from integration.harness.kafka import KafkaServer

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _kafka_to_kafka(kafka_source: KafkaSourceUnderTest, kafka_sink: KafkaSinkUnderTest) -> None:
    """The kit's copy pipeline, Kafka → the Kafka sink (transactional), 25 records a batch."""
    spec = {
        "source": "kafka",
        "source_options": {**kafka_source.options(), "maxRecordsPerBatch": "25"},
        "sink": "kafka",
        "sink_options": kafka_sink.options("transactional"),
        "id_expr": kafka_source.id_expr,
    }
    os.environ[SPEC_ENV] = json.dumps(spec)


def test_kafka_aggregate_kafka_exactly_once_across_a_driver_kill(
    kafka_source: KafkaSourceUnderTest, kafka_sink: KafkaSinkUnderTest, tmp_path: Any
) -> None:
    """Running count and sum per group in Spark state, read from and written to Kafka; the
    driver is killed after batch 2's decision. Every group's last value is exact."""
    fault = Fault("sink.after_decision", 2)
    scenario = Scenario(
        "aggregate", Guarantee.EXACTLY_ONCE, "transactional", (fault,), pipeline="aggregate"
    )
    outcome = run_case(
        scenario, kafka_source, kafka_sink, str(tmp_path / "snapshots"), records=200, per_batch=50
    )
    assert outcome.record.status == JobStatus.COMPLETED, outcome.record.failure
    assert outcome.fired == [fault.label], str(outcome)
    assert not outcome.lost and not outcome.duplicated, str(outcome)
    assert kafka_sink.in_doubt() == []


def test_copy_survives_a_broker_restart_mid_run(
    kafka_server: KafkaServer,
    kafka_source: KafkaSourceUnderTest,
    kafka_sink: KafkaSinkUnderTest,
    tmp_path: Any,
) -> None:
    """Kafka → Kafka, exactly-once: the broker is stopped (cleanly) and started again while
    the job runs; every record reaches the sink exactly once."""
    kafka_server.require_faults()
    ids = list(range(400))
    kafka_source.produce(ids)
    _kafka_to_kafka(kafka_source, kafka_sink)
    config = JobConfig(
        guarantee=Guarantee.EXACTLY_ONCE,
        available_now=True,
        snapshot_dir=str(tmp_path / "snapshots"),
        restart_backoff=1.0,
        max_restarts=8,
        master=LOCAL,
        spark_conf=dict(TEST_SPARK_CONF),
    )
    job = Job.submit(
        f"broker-restart-{uuid.uuid4().hex[:8]}",
        "epochal.pipelines:copy",
        config,
    )
    deadline = time.monotonic() + 300
    while not _some_output(kafka_sink):
        assert time.monotonic() < deadline, "the job wrote nothing in time"
        assert job.status().status not in (JobStatus.FAILED, JobStatus.COMPLETED), job.status()
        time.sleep(0.5)
    kafka_server.stop()
    kafka_server.start()
    record = job.join(timeout=600)
    assert record.status == JobStatus.COMPLETED, record.failure
    seen = Counter(int(v) for _, v in kafka_sink.committed("transactional"))
    assert sorted(seen) == ids
    assert [i for i, n in seen.items() if n > 1] == []
    assert unstable_partitions(kafka_sink.bootstrap, kafka_sink.topic) == []


def _some_output(sink: KafkaSinkUnderTest) -> bool:
    """Whether the sink topic holds committed records (a short read_committed look)."""
    try:
        return bool(read_to_end(sink.bootstrap, sink.topic, timeout=5))
    except AssertionError:  # a transaction is open right now: output is coming
        return True


def test_a_killed_job_cancelled_leaves_no_open_transaction_and_its_name_runs_again(
    kafka_source: KafkaSourceUnderTest, kafka_sink: KafkaSinkUnderTest, tmp_path: Any
) -> None:
    """Killed before batch 1's decision, then cancelled: the cancel fences the old job's
    writer ids (aborting what they left open) before it deletes the snapshots. The same name
    then runs again with writer ids of a new incarnation and writes every record once."""
    ids = list(range(200))
    kafka_source.produce(ids)
    _kafka_to_kafka(kafka_source, kafka_sink)
    name = f"reuse-{uuid.uuid4().hex[:8]}"

    def config(**changes: Any) -> JobConfig:
        return JobConfig(
            available_now=True,
            snapshot_dir=str(tmp_path / "snapshots"),
            master=LOCAL,
            spark_conf=dict(TEST_SPARK_CONF),
            **changes,
        )

    killed = config(faults="sink.before_decision@1", max_restarts=0)
    job = Job.submit(name, "epochal.pipelines:copy", killed)
    assert job.join(600).status == JobStatus.FAILED
    first = Counter(int(v) for _, v in kafka_sink.committed("transactional"))
    assert job.cancel().status == JobStatus.CANCELLED
    assert unstable_partitions(kafka_sink.bootstrap, kafka_sink.topic) == []

    again = Job.submit(name, "epochal.pipelines:copy", config()).join(600)
    assert again.status == JobStatus.COMPLETED, again.failure
    seen = Counter(int(v) for _, v in kafka_sink.committed("transactional"))
    assert sorted(seen) == ids, "lost records"
    assert {i: n - first[i] for i, n in seen.items()} == dict.fromkeys(ids, 1)
    assert unstable_partitions(kafka_sink.bootstrap, kafka_sink.topic) == []
