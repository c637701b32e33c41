"""Apache Kafka for integration tests: a single KRaft broker+controller run with ``java -cp``.

The broker's jars come from Maven Central (see :mod:`integration.harness.cache`); the
storage is formatted once with ``kafka.tools.StorageTool format --standalone`` and survives
stop/kill/start. Transactions work on the single node (transaction state log RF 1, min ISR 1).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochal.startup.classdata import SHORT_LIVED_JVM

from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    PrerequisiteError,
    free_port,
    make_temp_dir,
    port_open,
    run_checked,
    wait_until,
)
from .cache import kafka_classpath, kafka_version, require_java
from .server import Backend, ExternalBackend, LocalBackend, Server

READY_TOPIC = "__epochal_ready"
JVM_OPTS = [
    "-Xms128m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]
QUIET = {"log_level": 0}

_LOG4J2 = """status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def _confluent() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as exc:
        raise PrerequisiteError(
            "the Kafka fixtures need the 'confluent-kafka' package: pip install confluent-kafka"
        ) from exc
    return confluent_kafka


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class NodeSpec:
    """Where one combined broker+controller node listens and which quorum it belongs to.

    ``voters`` is ``None`` for a standalone node (formatted with ``--standalone``), else the
    static ``controller.quorum.voters`` of a cluster, e.g. ``1@127.0.0.1:9093,2@...``.
    """

    node_id: int
    broker_port: int
    controller_port: int
    cluster_id: str
    voters: str | None = None
    replication: int = 1

    @property
    def quorum(self) -> dict[str, str]:
        """The quorum settings of this node."""
        if self.voters is None:
            return {"controller.quorum.bootstrap.servers": f"{HOST}:{self.controller_port}"}
        return {"controller.quorum.voters": self.voters}


def broker_properties(spec: NodeSpec, log_dir: Path) -> dict[str, str]:
    """The ``server.properties`` of a combined broker+controller node on loopback."""
    broker_port, controller_port = spec.broker_port, spec.controller_port
    rf, min_isr = str(spec.replication), str(min(2, spec.replication))
    return {
        "process.roles": "broker,controller",
        "node.id": str(spec.node_id),
        **spec.quorum,
        "listeners": f"PLAINTEXT://{HOST}:{broker_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker_port},"
        f"CONTROLLER://{HOST}:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        # A restarted (killed) node re-registers only once its old session expired.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
    }


def kafka_ready(bootstrap: str, timeout: float = 5.0) -> bool:
    """One readiness probe: metadata lists a broker and a produce with acks=all succeeds."""
    ck = _confluent()
    admin = ck.admin.AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    metadata = admin.list_topics(timeout=timeout)
    if not metadata.brokers:
        return False
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": int(timeout * 1000),
            **QUIET,
        }
    )
    outcome: list[Any] = []
    producer.produce(READY_TOPIC, b"ping", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(timeout)
    return bool(outcome) and outcome[0] is None


def _format_args(spec: NodeSpec, config: Path) -> list[str]:
    """``StorageTool`` arguments formatting a KRaft node's storage."""
    standalone = ["--standalone"] if spec.voters is None else []
    return ["format", *standalone, "--cluster-id", spec.cluster_id, "--config", str(config)]


def standalone_spec() -> NodeSpec:
    """A single node on free ports with a new cluster id."""
    return NodeSpec(1, free_port(), free_port(), new_cluster_id())


class LocalKafka(LocalBackend):
    """A Kafka broker+controller JVM in a temporary directory (``jvm_options``: added to the
    harness's own, e.g. the short-lived JVM settings of a test's cluster)."""

    start_timeout = 120.0

    def __init__(
        self,
        name: str = "kafka",
        spec: NodeSpec | None = None,
        heap: str = "512m",
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        java = require_java()
        libs = kafka_classpath()
        spec = spec or standalone_spec()
        workdir = make_temp_dir("epochal-kafka-")
        self.spec = spec
        self.broker_port = spec.broker_port
        self.controller_port = spec.controller_port
        config = workdir / "server.properties"
        props = broker_properties(spec, workdir / "data")
        config.write_text("".join(f"{key}={value}\n" for key, value in props.items()))
        (workdir / "log4j2.properties").write_text(_LOG4J2)
        log4j = f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}"
        base = [java, *JVM_OPTS, *jvm_options, f"-Xmx{heap}", log4j, "-cp", f"{libs}/*"]
        run_checked(  # a tool that runs for seconds: the short-lived JVM settings
            [*base, *SHORT_LIVED_JVM, "kafka.tools.StorageTool", *_format_args(spec, config)],
            f"formatting Kafka {kafka_version()} storage",
            timeout=120,
        )
        process = ManagedProcess(
            name=name,
            argv=[*base, "kafka.Kafka", str(config)],
            log_path=workdir / "server.log",
            cwd=workdir,
            stop_signal=signal.SIGTERM,
            stop_timeout=60,
        )
        super().__init__(name, workdir, process)

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the PLAINTEXT listener."""
        return f"{HOST}:{self.broker_port}"

    def probe(self) -> bool:
        """Port open, broker in metadata, and a produce succeeds."""
        return port_open(HOST, self.broker_port) and kafka_ready(self.bootstrap_servers, 3.0)


@dataclass
class KafkaServer(Server):
    """Connection info and controls of the Kafka broker provided by ``kafka_server``."""

    bootstrap_servers: str = ""
    version: str = ""
    _admin: Any = field(default=None, repr=False, compare=False)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A confluent-kafka client config with ``bootstrap.servers`` set."""
        return {"bootstrap.servers": self.bootstrap_servers, **overrides}

    def admin(self) -> Any:
        """A (shared) confluent-kafka ``AdminClient`` for this broker."""
        if self._admin is None:
            ck = _confluent()
            self._admin = ck.admin.AdminClient(self.client_config())
        return self._admin

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Create a topic and wait until every partition has a leader; return its name."""
        ck = _confluent()
        new = ck.admin.NewTopic(name, partitions, replication_factor, config=dict(config or {}))
        futures = self.admin().create_topics([new], operation_timeout=timeout)
        futures[name].result(timeout)
        self._wait_for_leaders(name, partitions, timeout)
        return name

    def add_partitions(self, name: str, total: int, timeout: float = 30.0) -> None:
        """Grow topic ``name`` to ``total`` partitions and wait until each has a leader."""
        ck = _confluent()
        futures = self.admin().create_partitions(
            [ck.admin.NewPartitions(name, total)], operation_timeout=timeout
        )
        futures[name].result(timeout)
        self._wait_for_leaders(name, total, timeout)

    def _wait_for_leaders(self, name: str, partitions: int, timeout: float) -> None:
        def has_leaders() -> bool:
            topic = self.admin().list_topics(name, timeout=5).topics.get(name)
            return (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            )

        wait_until(has_leaders, timeout, f"topic {name} to have {partitions} partition leaders")

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        """Delete a topic (errors are ignored: used for best-effort clean-up)."""
        with contextlib.suppress(Exception):
            self.admin().delete_topics([name], operation_timeout=timeout)[name].result(timeout)


def start_kafka() -> KafkaServer:
    """Provide Kafka: ``$EPOCHAL_KAFKA_BOOTSTRAP``, else a container, else a local broker."""
    external = os.environ.get("EPOCHAL_KAFKA_BOOTSTRAP")
    if external:
        wait_until(
            lambda: kafka_ready(external), 60, f"Kafka at {external} (EPOCHAL_KAFKA_BOOTSTRAP)"
        )
        backend = ExternalBackend("kafka", f"EPOCHAL_KAFKA_BOOTSTRAP={external}")
        return KafkaServer(backend, bootstrap_servers=external, version="external")
    from .containers import docker_available, start_kafka_container

    if docker_available():
        container_backend, bootstrap = start_kafka_container()
        wait_until(lambda: kafka_ready(bootstrap), 120, "Kafka container")
        return KafkaServer(container_backend, bootstrap_servers=bootstrap, version="container")
    local = LocalKafka()
    try:
        local.start()
    except HarnessError:
        local.close()
        raise
    return KafkaServer(local, bootstrap_servers=local.bootstrap_servers, version=kafka_version())


class ClusterBackend(Backend):
    """Several :class:`LocalKafka` nodes handled as one (start all, then await all)."""

    supports_faults = True

    def __init__(self, name: str, nodes: list[LocalKafka]) -> None:
        self.name = name
        self.nodes = nodes

    def start(self) -> None:
        """Start every stopped node, then wait until each is ready (they need a quorum)."""
        for node in self.nodes:
            if not node.process.running:
                node.process.start()
        for node in self.nodes:
            node.wait_ready()

    def stop(self) -> None:
        """Stop every node gracefully."""
        for node in self.nodes:
            node.stop()

    def kill(self) -> None:
        """SIGKILL every node."""
        for node in self.nodes:
            node.kill()

    def is_running(self) -> bool:
        """Whether every node is alive."""
        return all(node.is_running() for node in self.nodes)

    def log_tail(self, lines: int = 80) -> str:
        """The tails of all nodes' logs."""
        per_node = max(10, lines // len(self.nodes))
        return "\n".join(f"--- {n.name}\n{n.log_tail(per_node)}" for n in self.nodes)

    def close(self) -> None:
        """Stop all nodes and remove their directories."""
        for node in self.nodes:
            with contextlib.suppress(HarnessError):
                node.close()


@dataclass
class KafkaCluster(KafkaServer):
    """A multi-node Kafka cluster (``kafka_cluster``): cluster-wide and per-node controls.

    ``stop``/``kill``/``start`` act on all nodes; ``nodes[i]`` are :class:`KafkaServer`
    handles of single nodes (their ``bootstrap_servers`` is that node only).
    """

    nodes: list[KafkaServer] = field(default_factory=list)

    def node_by_id(self, node_id: int) -> KafkaServer:
        """The node handle with Kafka ``node.id`` ``node_id`` (1-based)."""
        return self.nodes[node_id - 1]

    def ensure_running(self) -> None:
        """Start any node a test left stopped."""
        for node in self.nodes:
            node.ensure_running()


def start_kafka_cluster(size: int = 3) -> KafkaCluster:
    """A local cluster of ``size`` combined broker+controller nodes (static quorum, RF 3)."""
    cluster_id = new_cluster_id()
    ports = [(free_port(), free_port()) for _ in range(size)]
    voters = ",".join(f"{i + 1}@{HOST}:{controller}" for i, (_, controller) in enumerate(ports))
    replication = min(3, size)
    locals_: list[LocalKafka] = []
    try:
        for i, (broker, controller) in enumerate(ports):
            spec = NodeSpec(i + 1, broker, controller, cluster_id, voters, replication)
            # a test's cluster lives for a minute: the short-lived JVM settings
            locals_.append(LocalKafka(f"kafka-{i + 1}", spec, "384m", SHORT_LIVED_JVM))
        backend = ClusterBackend("kafka-cluster", locals_)
        backend.start()
    except HarnessError:
        for node in locals_:
            node.close()
        raise
    nodes = [
        KafkaServer(node, bootstrap_servers=node.bootstrap_servers, version=kafka_version())
        for node in locals_
    ]
    bootstrap = ",".join(node.bootstrap_servers for node in locals_)
    return KafkaCluster(backend, bootstrap_servers=bootstrap, version=kafka_version(), nodes=nodes)
