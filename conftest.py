"""The suite on two cores: which tests go to which pytest-xdist worker, and in what order.

``scripts/test.sh`` runs the suite as ``pytest -n 2 --dist loadgroup``: two worker processes,
each taking the next unit of work when it is nearly done with its own. This hook decides the
units (:func:`work_unit`) and hands them out longest first (:func:`order_by_cost`), so the
last minutes are not one long test running alone:

- a module is one unit, so a module's shared fixtures (a SparkSession, a virtual
  environment, a database) are made once, by one worker;
- a crash test of the conformance kit is a unit of its own (its fixtures are per test), and
  so is each pyspark release of tests/releases (its own virtual environment).

Session fixtures (the integration servers, the kit's warm drivers) are per worker: a server
both workers need is started by each. Without ``-n`` nothing here changes the run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.lane import FULL, LANE_ENV

ROOT = Path(__file__).resolve().parent
#: Seconds each test took in a recent whole run (``python -m integration.harness.timing
#: --update`` rewrites it from a run's ``EPOCHAL_TEST_TIMES`` file); only the order of the
#: units depends on it, never a result. A test it does not know counts one second.
DURATIONS = ROOT / "tests" / "durations.json"


NO_SMOKE = "no smoke of it: benchmarks are run for their figures"
"""What covers a benchmark's smoke in CI's lane: nothing; the command is run for figures."""
#: The proofs CI's lane leaves to the full lane (``EPOCHAL_TEST_LANE=full make test``): each
#: repeats, on another release, connector or guarantee, what a test of the CI lane proves, so
#: CI's 90 minutes on two cores hold the rest. The value says which test of the CI lane
#: covers it. A ``*`` in a node id stands for any text.
FULL_LANE_ONLY: dict[str, str] = {
    "tests/releases/test_pyspark_releases.py::"
    "test_the_demo_is_exactly_once_on_a_pyspark_installed_before_epochal[*]": (
        "the demo on the suite's own pyspark (tests/quickstart)"
    ),
    "tests/releases/test_pyspark_releases.py::"
    "test_the_reference_connectors_kit_cases_run_on_each_release[*]": (
        "the map suite's crash cases on each release (the runtime's protocols), and each "
        "connector's own suite on the suite's own pyspark"
    ),
    "tests/releases/test_pyspark_releases.py::test_foreach_batch_crash_points_on_pyspark_3_5": (
        "the foreachBatch cases on the suite's own pyspark (integration/kafka)"
    ),
    "integration/test_benchmarks.py::test_scale_bench": (
        "no smoke of it; the bound on what a restart reads, which its age part shows, is "
        "counted by tests/unit/test_retention.py"
    ),
    "integration/test_benchmarks.py::test_fastpath_bench": NO_SMOKE,
    "tests/releases/test_iceberg.py::"
    "test_iceberg_tables_as_sink_and_source_exactly_once_through_kills_and_suspends[4.0.5]": (
        "the same cases on Iceberg's newest Spark line (4.1.4)"
    ),
    "tests/releases/test_delta.py::"
    "test_delta_tables_on_older_sparks_with_input_that_keeps_arriving[*]": (
        "the same cases on Iceberg 4.1.4, Delta's own on its newest Spark line (4.2.1)"
    ),
    "integration/test_benchmarks.py::test_flink_bench": NO_SMOKE,
    "integration/test_benchmarks.py::test_jms_bench": "the JMS connector's kit cases",
    "integration/test_benchmarks.py::test_kafka_jdbc_bench": NO_SMOKE,
    "integration/kafka/test_foreach_batch.py::test_kafka_source_into_the_kafka_sink[*]": (
        "the kit's suite of the foreachBatch writers (every kill kind, on 4.3 and 3.5) and the "
        "Kafka sink's own kit cases"
    ),
    "integration/kafka/test_foreach_batch.py::test_kafka_source_into_the_jdbc_2pc_sink": (
        "the kit's suite of the foreachBatch writers (every kill kind, on 4.3 and 3.5) and the "
        "JDBC sink's own kit cases"
    ),
    "integration/kafka/test_foreach_batch.py::"
    "test_the_jdbc_case_catches_a_writer_that_writes_a_replayed_batch_again": (
        "the same broken writer caught by the kit's foreachBatch suite "
        "(tests/conformance/test_foreach_batch_conformance.py)"
    ),
    "tests/conformance/test_foreach_batch_conformance.py::TestMapSinkThroughForeachBatch::"
    "test_crash_and_recover[session-failures-*]": (
        "the same case on pyspark 3.5 (tests/releases: the kit's foreachBatch suite on 3.5)"
    ),
    "integration/kafka/test_foreach_batch.py::"
    "test_update_mode_aggregation_into_the_jdbc_upsert_sink": (
        "the kit's foreachBatch suite in idempotent mode and the JDBC sink's own upsert cases"
    ),
    "integration/test_smoke_spark_cluster.py::test_job_survives_a_killed_worker": (
        "integration/cluster: exactly-once through a lost worker and a killed driver"
    ),
    "integration/jdbc/test_jdbc_conformance.py::TestJdbcSinkConformance::"
    "test_crash_and_recover[points-*-at-least-once]": "the same points at exactly-once",
    "integration/jdbc/test_jdbc_conformance.py::TestJdbcSinkConformance::"
    "test_crash_and_recover[aggregate-*]": (
        "the aggregate case of the map (transactional sink), JMS (idempotent sink) and ack suites"
    ),
    "integration/jms/test_jms_conformance.py::TestJmsSourceConformance::"
    "test_crash_and_recover[aggregate-*]": (
        "the acknowledging reference source's aggregate case (tests/conformance/test_ack_*)"
    ),
    "integration/kafka/test_spark_kafka_source.py::TestSparkKafkaSourceIntoJdbc::"
    "test_crash_and_recover[real-failures-*]": (
        "the JDBC sink's own real-failures case (Spark's Kafka source is not a part of ours)"
    ),
    "integration/jms/test_jms_conformance.py::TestJmsSourceConformance::"
    "test_crash_and_recover[session-failures-*]": (
        "the map suite's session-failures (the lease and restarts are the runtime's) and the "
        "JMS source's real-failures, which stops it gracefully"
    ),
    "integration/kafka/test_spark_kafka_source.py::TestSparkKafkaSourceInto*::"
    "test_crash_and_recover[points-*]": (
        "the JDBC and Kafka sinks' own crash points (Spark's Kafka source is not a part of ours)"
    ),
    "integration/test_soak.py::test_a_small_soak_loses_and_duplicates_nothing": (
        "the kit's random kills of drivers and Python workers in every real-failures case"
    ),
    "integration/test_benchmarks.py::test_kafka_bench": NO_SMOKE,
    "integration/test_benchmarks.py::test_latency_bench": NO_SMOKE,
    "integration/test_benchmarks.py::test_batch_timeline_bench": NO_SMOKE,
    "integration/test_benchmarks.py::test_recovery_bench": (
        "the warm standby's take-over (tests/spark/test_jobs.py)"
    ),
    "integration/yarn/test_yarn_exactly_once.py::"
    "test_exactly_once_on_yarn_with_hdfs_across_driver_kill_partition_and_namenode_restart": (
        "the HDFS lease tests (integration/hdfs) and the standalone cluster's killed-driver job"
    ),
    "integration/kafka/test_spark_kafka_parts.py::"
    "test_sparks_kafka_source_into_the_kafka_exactly_once_sink_with_rows_routed_by_key": (
        "the foreachBatch case of Spark's Kafka source routed by key into the Kafka sink"
    ),
    "integration/kafka/test_spark_kafka_parts.py::"
    "test_sparks_kafka_source_read_in_order_runs_exactly_once_straight_into_the_kafka_sink": (
        "the foreachBatch case routed by key into the Kafka sink"
    ),
    "integration/jms/test_jms_conformance.py::TestJmsSinkConformance::"
    "test_crash_and_recover[aggregate-*]": "the map suite's aggregate case",
    "integration/connect/test_connect_two_servers.py::"
    "test_two_servers_on_one_job_one_runs_it_the_other_takes_over_when_it_is_gone": (
        "the warm standby's take-over of a killed driver (tests/spark/test_jobs.py)"
    ),
    "tests/quickstart/test_outside_connector.py::"
    "test_the_page_for_outside_connector_authors_works_as_written": (
        "the guide's package, installed, passing one kit case per contract"
    ),
    "tests/conformance/test_map_conformance.py::TestMapConformance::"
    "test_crash_and_recover[points-idempotent-at-least-once]": (
        "the same points at exactly-once, and the transactional sink's at at-least-once"
    ),
    "integration/jms/test_jms_conformance.py::TestJmsSinkConformance::"
    "test_crash_and_recover[points-idempotent-at-least-once]": "the same points at exactly-once",
    "integration/connect/test_connect_kafka_to_postgres.py::"
    "test_exactly_once_kafka_to_postgres_over_spark_connect_across_a_server_kill": (
        "the refusals and register() over Spark Connect in the same module (no exactly-once "
        "job over Spark Connect runs in CI's lane)"
    ),
    "integration/kafka/test_kafka_conformance.py::TestKafkaSinkConformance::"
    "test_crash_and_recover[points-*-at-least-once]": "the same points at exactly-once",
    "integration/jms/test_jms_conformance.py::TestJmsSourceConformance::"
    "test_crash_and_recover[points-*-at-least-once]": "the same points at exactly-once",
}


def full_lane_reason(nodeid: str) -> str | None:
    """Why the CI lane skips ``nodeid`` (None: it runs in both lanes)."""
    for pattern, covered_by in FULL_LANE_ONLY.items():
        if re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), nodeid):
            return covered_by
    return None


def work_unit(item: pytest.Item) -> str:
    """The unit of work ``item`` belongs to (tests of one unit run on one worker, in order)."""
    if "conformance_case" in getattr(item, "fixturenames", ()):
        return f"case:{item.nodeid}"
    if "pyspark_release" in getattr(item, "fixturenames", ()):
        return f"release:{item.nodeid}"
    return f"module:{item.nodeid.split('::', 1)[0]}"


def _known_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def order_by_cost(units: dict[str, list[Any]], known: dict[str, float]) -> list[str]:
    """The units, longest first."""

    def cost(unit: str) -> float:
        return sum(known.get(item.nodeid, 1.0) for item in units[unit])

    return sorted(units, key=lambda unit: (-cost(unit), unit))


def distributed_by_group(config: Any) -> bool:
    """Whether this process collects for ``--dist loadgroup``: the controller's option, or
    the flag xdist leaves a worker's configuration with."""
    option = config.option
    return getattr(option, "dist", "no") == "loadgroup" or bool(getattr(option, "loadgroup", False))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    """Under ``--dist loadgroup``: group the items into units and order them by cost.

    The hook runs in each xdist worker (they collect; the controller only schedules), where
    xdist has set ``dist`` to ``"no"`` and kept the mode as ``loadgroup`` instead."""
    if not FULL:
        for item in items:
            covered_by = full_lane_reason(item.nodeid)
            if covered_by is not None:
                reason = f"full lane only ({LANE_ENV}=full); CI's lane has {covered_by}"
                item.add_marker(pytest.mark.skip(reason=reason))
    if not distributed_by_group(config):
        return
    units: dict[str, list[Any]] = {}
    for item in items:
        units.setdefault(work_unit(item), []).append(item)
    known = _known_durations()
    if not FULL:  # a skipped test costs nothing
        known = {k: (0.0 if full_lane_reason(k) else v) for k, v in known.items()}
    ordered = order_by_cost(units, known)
    items[:] = [item for unit in ordered for item in units[unit]]
    for unit in ordered:
        for item in units[unit]:
            item.add_marker(pytest.mark.xdist_group(unit))


def pytest_report_header(config: pytest.Config) -> str:
    """Say how the integration servers run: in containers or as local processes."""
    from integration.harness._process import PrerequisiteError
    from integration.harness.containers import USE_ENV, docker_available

    try:
        containers = docker_available()
    except PrerequisiteError as exc:
        return f"integration servers: {exc}"
    if containers:
        return "integration servers: containers (Docker engine + testcontainers)"
    return f"integration servers: local processes (no Docker engine, or {USE_ENV}=0)"
