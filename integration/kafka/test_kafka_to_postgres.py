"""Kafka → Spark → PostgreSQL, exactly-once across a hard driver kill (issue 5's pipeline
test, now that both connectors exist): the job is killed right after the commit decision of
a batch, restarted by the supervisor, and an independent reader of the table counts every
record ID once; no prepared transaction is left in PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest
from epochal_kafka.testing import KafkaSourceUnderTest

from epochal import JobStatus
from epochal.testing import Case, run_case
from epochal_sdk import Guarantee

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.mark.parametrize("point", ["sink.after_decision", "sink.mid_commit"])
def test_kafka_to_postgres_exactly_once_across_a_driver_kill(
    point: str,
    kafka_source: KafkaSourceUnderTest,
    epochal_jdbc_sink: JdbcSinkUnderTest,
    tmp_path: Path,
) -> None:
    case = Case(point, Guarantee.EXACTLY_ONCE, "transactional", batch=1)
    outcome = run_case(
        case,
        kafka_source,
        epochal_jdbc_sink,
        str(tmp_path / "snapshots"),
        records=300,
        per_batch=100,
    )
    assert outcome.record.status == JobStatus.COMPLETED, outcome.record.failure
    assert outcome.fired == [case.fault], str(outcome)
    assert outcome.record.restarts >= 1
    assert not outcome.lost, str(outcome)
    assert not outcome.duplicated, str(outcome)
    assert epochal_jdbc_sink.in_doubt() == []
