"""Integration-test harness: real Kafka, PostgreSQL and STOMP (Artemis) servers for tests.

``start_kafka``/``start_postgres``/``start_jms`` return handles with connection info and
fault controls; :mod:`integration.harness.plugin` wraps them in pytest fixtures. See
``docs/contributing/testing.md``.
"""

from ._process import HarnessError, PrerequisiteError, ServerStartError, cleanup_all, wait_until
from .cache import cache_dir, prefetch
from .jms import JmsQueue, JmsServer, StompCollector, start_jms
from .kafka import KafkaCluster, KafkaServer, start_kafka, start_kafka_cluster
from .postgres import PostgresServer, start_postgres
from .server import FaultControlUnsupportedError, Server

__all__ = [
    "FaultControlUnsupportedError",
    "HarnessError",
    "JmsQueue",
    "JmsServer",
    "KafkaCluster",
    "KafkaServer",
    "PostgresServer",
    "PrerequisiteError",
    "Server",
    "ServerStartError",
    "StompCollector",
    "cache_dir",
    "cleanup_all",
    "prefetch",
    "start_jms",
    "start_kafka",
    "start_kafka_cluster",
    "start_postgres",
    "wait_until",
]
