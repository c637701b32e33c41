"""pytest plugin: server fixtures, clean per-test resources, and server logs in failure reports.

``integration/conftest.py`` loads it for everything under ``integration/``; elsewhere use
``-p integration.harness.plugin`` or ``pytest_plugins = ["integration.harness.plugin"]`` in
the rootdir ``conftest.py``.

Session fixtures: ``kafka_server``, ``postgres_server``, ``jms_server`` (and
``kafka_cluster``, three nodes, and ``hdfs_server``, only started when a test uses them).
Per-test fixtures: ``kafka_topic``, ``postgres_db``, ``jms_queue``.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from ._process import HarnessError, PrerequisiteError, shutting_down
from .jms import JmsQueue, JmsServer, new_queue, start_jms
from .kafka import KafkaCluster, KafkaServer, start_kafka, start_kafka_cluster
from .postgres import PostgresServer, start_postgres
from .s3 import S3Bucket, S3Server, new_bucket, start_s3
from .server import Server
from .spark_cluster import SparkCluster, start_spark_cluster

S = TypeVar("S", bound=Server)

#: Servers started in this session, by fixture name (for log sections and restore).
STARTED: dict[str, Server] = {}
LOG_LINES = 60


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers used by integration tests."""
    config.addinivalue_line("markers", "integration: needs real servers (Kafka, PostgreSQL, JMS)")
    config.addinivalue_line(
        "markers", "kafka_topic(partitions=1, config=None): options for the kafka_topic fixture"
    )


def _provide(fixture: str, factory: Callable[[], S]) -> Iterator[S]:
    """Start a server, turn harness errors into one clear failure, close it at the end."""
    problem = ""
    try:
        server = factory()
    except PrerequisiteError as exc:
        problem = f"{fixture}: missing prerequisite: {exc}"
    except (HarnessError, TimeoutError) as exc:
        problem = f"{fixture}: server could not be started: {exc}"
    if problem:  # outside the except block: one clear message, no exception chain
        pytest.fail(problem, pytrace=False)
    STARTED[fixture] = server
    try:
        yield server
    finally:
        STARTED.pop(fixture, None)
        server.backend.close()


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[KafkaServer]:
    """A Kafka broker (KRaft, transactions enabled) for the whole session."""
    yield from _provide("kafka_server", start_kafka)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """A local 3-node Kafka cluster (RF 3, min ISR 2); started only when a test asks."""
    yield from _provide("kafka_cluster", start_kafka_cluster)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server (prepared transactions enabled) for the whole session."""
    yield from _provide("postgres_server", start_postgres)


@pytest.fixture(scope="session")
def jms_server() -> Iterator[JmsServer]:
    """A STOMP 1.2 broker (ActiveMQ Artemis) for the whole session."""
    yield from _provide("jms_server", start_jms)


@pytest.fixture(autouse=True)
def _restore_servers() -> Iterator[None]:
    """After each test, start again any harness server the test left stopped or killed."""
    yield
    for server in list(STARTED.values()):
        with contextlib.suppress(HarnessError):
            server.ensure_running()


def _usable(server: Server) -> bool:
    """Restart a server a test left stopped; ``False`` if it cannot be (e.g. interrupted)."""
    with contextlib.suppress(HarnessError):
        server.ensure_running()
    return server.running and not shutting_down()


def _slug(request: pytest.FixtureRequest, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:limit].lower() or "t"


@pytest.fixture
def kafka_topic(kafka_server: KafkaServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh topic (``@pytest.mark.kafka_topic(partitions=N, config={...})``), deleted after."""
    marker = request.node.get_closest_marker("kafka_topic")
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    name = f"it-{_slug(request)}-{uuid.uuid4().hex[:10]}"
    kafka_server.create_topic(
        name, partitions=int(options.get("partitions", 1)), config=options.get("config")
    )
    yield name
    if _usable(kafka_server):
        kafka_server.delete_topic(name, timeout=10)


@dataclass(frozen=True)
class PostgresDatabase:
    """A database created for one test."""

    name: str
    dsn: str
    server: PostgresServer

    def connect(self, **kwargs: Any) -> Any:
        """A new psycopg connection (autocommit unless given) to this database."""
        return self.server.connect(self.name, **kwargs)


@pytest.fixture
def postgres_db(
    postgres_server: PostgresServer, request: pytest.FixtureRequest
) -> Iterator[PostgresDatabase]:
    """A fresh database, dropped (with its prepared transactions) after the test."""
    name = f"it_{_slug(request, 30).replace('-', '_')}_{uuid.uuid4().hex[:10]}"
    dsn = postgres_server.create_database(name)
    yield PostgresDatabase(name=name, dsn=dsn, server=postgres_server)
    if _usable(postgres_server):
        postgres_server.drop_database(name)


@pytest.fixture
def jms_queue(jms_server: JmsServer, request: pytest.FixtureRequest) -> JmsQueue:
    """A unique queue (name + STOMP destination); the broker creates it on first use."""
    return new_queue(jms_server, _slug(request, 30))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the tail of the logs of the servers a failing test used to its report."""
    report = yield
    if report.failed:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, server in list(STARTED.items()):
            title = f"{fixture} log (last {LOG_LINES} lines)"
            if fixture in used and all(name != title for name, _ in report.sections):
                report.sections.append((title, server.log_tail(LOG_LINES)))
    return report


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """An S3-compatible object store (SeaweedFS, data on disk) for the whole session."""
    yield from _provide("s3_server", start_s3)


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> Iterator[S3Bucket]:
    """A fresh bucket ``it-<test>-<random>``; emptied and deleted after the test."""
    bucket = new_bucket(s3_server, _slug(request, 30))
    yield bucket
    if _usable(s3_server):
        s3_server.delete_bucket(bucket.name)


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A Spark standalone cluster (a master, two 1-core workers); started only when asked."""
    yield from _provide("spark_cluster", start_spark_cluster)


@pytest.fixture(scope="session")
def hdfs_server() -> Iterator[Any]:
    """A NameNode and a DataNode (local JVMs), shared by the session's tests."""
    from .hdfs import start_hdfs

    yield from _provide("hdfs_server", start_hdfs)


@pytest.fixture(scope="session")
def yarn_cluster() -> Iterator[Any]:
    """A YARN cluster (``YarnCluster``: a ResourceManager, two NodeManagers) from Maven
    Central's Hadoop jars; started only when a test asks."""
    from .yarn import start_yarn_cluster

    yield from _provide("yarn_cluster", start_yarn_cluster)


@pytest.fixture(scope="session")
def spark_connect_server() -> Iterator[Any]:
    """A Spark Connect server (``SparkConnectServer``: ``url``, ``session()``) run from the
    pyspark package, with epochal's formats registered on it; started only when asked."""
    from .spark_connect import start_spark_connect

    yield from _provide("spark_connect_server", start_spark_connect)
