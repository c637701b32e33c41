"""The testcontainers path: used when a Docker engine answers and ``testcontainers`` is installed.

Kept small on purpose: the containers provide the same connection info as the local
servers; fault controls (stop/kill/start) are not offered for containers, because a
restarted container gets new host ports. ``testcontainers`` is imported lazily.
``EPOCHAL_USE_CONTAINERS=0`` forces local processes, ``=1`` demands containers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from typing import Any

from ._process import PrerequisiteError
from .server import Backend, FaultControlUnsupportedError

KAFKA_IMAGE = os.environ.get("EPOCHAL_KAFKA_IMAGE", "confluentinc/cp-kafka:7.9.0")
POSTGRES_IMAGE = os.environ.get("EPOCHAL_POSTGRES_IMAGE", "postgres:15")
ARTEMIS_IMAGE = os.environ.get("EPOCHAL_ARTEMIS_IMAGE", "apache/activemq-artemis:2.40.0")


@functools.cache
def docker_available() -> bool:
    """Whether to use containers: a Docker daemon answers and testcontainers imports."""
    choice = os.environ.get("EPOCHAL_USE_CONTAINERS", "").strip().lower()
    if choice in ("0", "no", "false"):
        return False
    usable = _daemon_answers() and _testcontainers_importable()
    if choice in ("1", "yes", "true") and not usable:
        raise PrerequisiteError(
            "EPOCHAL_USE_CONTAINERS=1 but no Docker daemon answers `docker info` or the "
            "'testcontainers' package is missing (pip install testcontainers)"
        )
    return usable


def _daemon_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _testcontainers_importable() -> bool:
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        return False
    return True


class ContainerBackend(Backend):
    """A running testcontainers container; removed at :meth:`close`."""

    supports_faults = False

    def __init__(self, name: str, container: Any) -> None:
        self.name = name
        self.container = container

    def start(self) -> None:
        """Containers are started when created."""

    def stop(self) -> None:
        """Not offered for containers (new host ports after a restart)."""
        raise FaultControlUnsupportedError(f"{self.name}: no fault controls for containers")

    def kill(self) -> None:
        """Not offered for containers (new host ports after a restart)."""
        raise FaultControlUnsupportedError(f"{self.name}: no fault controls for containers")

    def is_running(self) -> bool:
        """Assumed running while the session lasts."""
        return True

    def log_tail(self, lines: int = 80) -> str:
        """The container's last log lines."""
        try:
            stdout, stderr = self.container.get_logs()
        except Exception as exc:
            return f"<container logs unavailable: {exc!r}>"
        text = (stdout or b"").decode(errors="replace") + (stderr or b"").decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Stop and remove the container."""
        with contextlib.suppress(Exception):
            self.container.stop()


def start_kafka_container() -> tuple[ContainerBackend, str]:
    """A single-node KRaft Kafka container; returns the backend and bootstrap servers."""
    from testcontainers.kafka import KafkaContainer

    container = KafkaContainer(KAFKA_IMAGE).with_kraft()
    for key, value in {
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }.items():
        container = container.with_env(key, value)
    container.start()
    return ContainerBackend("kafka", container), container.get_bootstrap_server()


def start_postgres_container() -> tuple[ContainerBackend, str]:
    """A PostgreSQL container with prepared transactions enabled; returns backend and DSN."""
    from testcontainers.postgres import PostgresContainer

    from .postgres import MAX_PREPARED_TRANSACTIONS

    container = PostgresContainer(
        POSTGRES_IMAGE, username="epochal", password="epochal", dbname="postgres"
    ).with_command(f"postgres -c max_prepared_transactions={MAX_PREPARED_TRANSACTIONS}")
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(5432)
    return ContainerBackend("postgres", container), (
        f"postgresql://epochal:epochal@{host}:{port}/postgres"
    )


def start_artemis_container(user: str, password: str) -> tuple[ContainerBackend, dict[str, Any]]:
    """An Artemis container whose STOMP acceptor maps ``/queue/`` and ``/topic/`` prefixes."""
    from testcontainers.core.container import DockerContainer

    prefixes = " ".join(
        f"-Dbrokerconfig.acceptorConfigurations.stomp.params.{key}={value}"
        for key, value in (("anycastPrefix", "/queue/"), ("multicastPrefix", "/topic/"))
    )
    container = (
        DockerContainer(ARTEMIS_IMAGE)
        .with_env("ARTEMIS_USER", user)
        .with_env("ARTEMIS_PASSWORD", password)
        .with_env("JAVA_ARGS_APPEND", prefixes)
        .with_exposed_ports(61613)
    )
    container.start()
    info = {
        "host": container.get_container_host_ip(),
        "port": int(container.get_exposed_port(61613)),
    }
    return ContainerBackend("jms", container), info
