"""A broker restart in the middle of a run: JMS queue → Spark → map (transactional),
exactly-once. The driver's STOMP session is lost, the source raises RestartableError, the
supervisor restarts the job, unacknowledged messages come back and are deduplicated; an
independent count by ID finds nothing lost and nothing duplicated."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from epochal_jms.testing import JmsQueueUnderTest, broker_config

from epochal.api import Job
from epochal.config import JobConfig
from epochal.pipelines import SPEC_ENV
from epochal.state.jobs import JobStatus
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_map.testing import MapSinkUnderTest
from integration.harness.jms import JmsQueue, JmsServer

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RECORDS = 400
PER_BATCH = 20


def test_broker_restart_mid_run_is_exactly_once(
    jms_server: JmsServer,
    jms_queue: JmsQueue,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jms_server.require_faults()
    config = broker_config(jms_server.host, jms_server.port, jms_server.user, jms_server.password)
    source = JmsQueueUnderTest(config, jms_queue.destination)
    sink = MapSinkUnderTest(tmp_path / "sink.sqlite")
    ids = list(range(RECORDS))
    source.produce(ids)
    spec = {
        "source": "jms",
        "source_options": {**source.options(), "maxRecordsPerBatch": str(PER_BATCH)},
        "sink": "map",
        "sink_options": sink.options("transactional"),
        "id_expr": source.id_expr,
    }
    monkeypatch.setenv(SPEC_ENV, json.dumps(spec))
    job_config = JobConfig(
        available_now=True,
        snapshot_dir=str(tmp_path / "snapshots"),
        restart_backoff=0.5,
        max_restarts=5,
        master=LOCAL,
        spark_conf=dict(TEST_SPARK_CONF),
    )
    name = f"jms-restart-{uuid.uuid4().hex[:6]}"
    job = Job.submit(name, "epochal.pipelines:copy", job_config)

    def written() -> int:
        if not os.path.exists(sink.path):
            return 0
        try:
            return len(sink.committed("transactional"))
        except Exception:  # the map is being created by the job
            return 0

    deadline = time.monotonic() + 600
    while written() < PER_BATCH:  # at least one batch went through before the restart
        assert time.monotonic() < deadline, "the job wrote nothing within 10 minutes"
        assert job.status().status not in (JobStatus.FAILED, JobStatus.COMPLETED)
        time.sleep(0.2)
    before = written()
    jms_server.restart()

    record = job.join(timeout=900)
    assert record.status == JobStatus.COMPLETED, record.failure
    assert before < RECORDS, "the job finished before the broker restart: nothing was proven"
    assert record.restarts >= 1, "the lost connection did not restart the job"
    seen = Counter(int(key) for key, _ in sink.committed("transactional"))
    lost = sorted(set(ids) - set(seen))
    duplicated = {i: n for i, n in seen.items() if n > 1}
    assert not lost, f"lost {len(lost)}: {lost[:10]}"
    assert not duplicated, f"duplicated {len(duplicated)}: {list(duplicated)[:10]}"
    assert source.unsettled() == []
