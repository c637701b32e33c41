"""Whole jobs on Kafka with the real broker: Kafka → Spark (keyed aggregation in Spark state)
→ Kafka exactly-once across a driver kill, a Kafka → Kafka copy that survives a broker
stop/restart in the middle of the run, a killed job cancelled and its name run again, and
partitions added to the source topic in the middle of a stream."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer
from epochal_kafka.testing import (
    QUIET,
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
from epochal_map.testing import MapSinkUnderTest
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


FROZEN_SECONDS = 20.0
"""How long a frozen server stays frozen: longer than the clients' request time-outs, so the
job's tasks see it silent, not slow."""


@pytest.mark.parametrize("fault", ["restart", "freeze"])
def test_copy_survives_a_broker_restart_mid_run(
    fault: str,
    kafka_server: KafkaServer,
    kafka_source: KafkaSourceUnderTest,
    kafka_sink: KafkaSinkUnderTest,
    tmp_path: Any,
) -> None:
    """Kafka → Kafka, exactly-once: while the job runs, the broker is stopped (cleanly) and
    started again, or frozen (its container paused, a local broker SIGSTOPped: connections
    open and silent) for :data:`FROZEN_SECONDS`; every record reaches the sink exactly once and
    no transaction is left open."""
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
    if fault == "restart":
        kafka_server.stop()
        kafka_server.start()
    else:
        kafka_server.pause()
        try:
            time.sleep(FROZEN_SECONDS)  # the fault's length, not a wait for something
        finally:
            kafka_server.unpause()
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


KILL_AT = 4
"""The batch of the partitions test whose decision is never made. Batches 0-1: the first 100
records; 2: the records of the old partitions after the first change (the new partition joins
the batch's offsets at its start); 3: the new partition's records; 4: the 50 produced while
the job runs."""


def _produce_plain(bootstrap: str, topic: str, ids: range, partitions: int) -> None:
    """Records ``key = value = str(id)`` round-robin over ``partitions``, without
    transactions: each takes one offset, so a batch of 50 offsets is 50 records."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **QUIET})
    for i in ids:
        producer.produce(topic, str(i).encode(), str(i).encode(), partition=i % partitions)
    assert producer.flush(60) == 0, "records not delivered"


def test_kafka_partitions_added_mid_stream_after_a_suspend_and_after_a_kill(
    kafka_server: KafkaServer, make_topic: Any, tmp_path: Any
) -> None:
    """Partitions added to the source topic in the middle of a stream (Kafka → the map sink,
    exactly-once, two-phase commit, 50 records a batch): once while the job is suspended,
    once after a kill before batch 4's decision left its transactions prepared. A new
    partition joins a batch's offsets at its earliest offset and is read from the next batch
    (a replay plans the same); the killed batch is read again with its planned offsets."""
    topic = make_topic(2)
    sink = MapSinkUnderTest(tmp_path / "sink.sqlite")
    bootstrap = kafka_server.bootstrap_servers
    _produce_plain(bootstrap, topic, range(0, 100), 2)
    spec = {
        "source": "kafka",
        "source_options": {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic,
            "maxRecordsPerBatch": "50",
        },
        "sink": "map",
        "sink_options": sink.options("transactional"),
        "id_expr": "CAST(CAST(value AS STRING) AS BIGINT)",
    }
    os.environ[SPEC_ENV] = json.dumps(spec)
    config = JobConfig(
        guarantee=Guarantee.EXACTLY_ONCE,
        available_now=False,
        snapshot_interval=0.5,
        snapshot_dir=str(tmp_path / "snapshots"),
        restart_backoff=0.2,
        max_restarts=0,
        faults=f"sink.before_decision@{KILL_AT}",
        master=LOCAL,
        spark_conf=dict(TEST_SPARK_CONF),
    )
    name = f"partitions-{uuid.uuid4().hex[:8]}"

    def written() -> Counter[int]:
        return Counter(int(v) for _, v in sink.committed("transactional"))

    def wait_for_written(count: int, job: Job, what: str) -> None:
        # a resumed job's record reads FAILED until its new run starts: wait on the output
        deadline = time.monotonic() + 240
        while sum(written().values()) < count:
            assert time.monotonic() < deadline, (
                f"{what}: {sum(written().values())} of {count} written; job {job.status()}"
            )
            time.sleep(0.2)

    job = Job.submit(name, "epochal.pipelines:copy", config, report=lambda line: None)
    wait_for_written(100, job, "batches 0-1")
    job.suspend()
    assert job.join(120).status == JobStatus.SUSPENDED

    kafka_server.add_partitions(topic, 3)  # the first change, while suspended
    _produce_plain(bootstrap, topic, range(100, 150), 3)
    job = Job(name, str(tmp_path / "snapshots")).resume(report=lambda line: None)
    wait_for_written(150, job, "batches 2-3, with the new partition 2")
    _produce_plain(bootstrap, topic, range(150, 200), 3)
    killed = job.join(240)
    assert killed.status == JobStatus.FAILED, killed
    assert sum(written().values()) == 150, f"batch {KILL_AT} was committed before its kill"
    assert sink.in_doubt(), f"the kill at batch {KILL_AT} left nothing prepared"

    kafka_server.add_partitions(topic, 4)  # the second change, with a batch in doubt
    _produce_plain(bootstrap, topic, range(200, 250), 4)
    job = Job(name, str(tmp_path / "snapshots")).resume(report=lambda line: None)
    wait_for_written(250, job, f"batch {KILL_AT} again, then the new partition 3")
    job.cancel()
    seen = written()
    counts = {
        "lost": len(set(range(250)) - set(seen)),
        "duplicated": sum(n - 1 for n in seen.values()),
        "in_doubt": len(sink.in_doubt()),
        "written": sum(seen.values()),
    }
    assert counts == {"lost": 0, "duplicated": 0, "in_doubt": 0, "written": 250}, counts
