"""The testcontainers path: the harness's servers (Kafka, PostgreSQL, Artemis) as containers of
the images built on this machine (:mod:`integration.harness.images`), used when a Docker engine
answers and ``testcontainers`` is installed. ``EPOCHAL_USE_CONTAINERS=0`` forces local
processes, ``=1`` demands containers (an error says what is missing).

A container publishes its server's port on a free port of 127.0.0.1 (Kafka's on the same number
inside, so the address it advertises is the one clients use), so a server keeps its address
across a stop, a kill or a pause of its container, and the fault controls are those of a local
process: ``stop`` (SIGTERM, then SIGKILL after 30 s), ``kill`` (SIGKILL), ``start`` (the same
container again: its data kept), and ``pause``/``unpause`` (the cgroup freezer: a frozen
server, its connections open and silent). Containers carry the label :data:`OWNER_LABEL`
with the pid of the harness process that made them; a harness starting later removes those
of owners that are gone (no reaper container is used: its image would come from a registry).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epochal.base.processes import alive

from . import images
from ._process import (
    HarnessError,
    PrerequisiteError,
    ServerStartError,
    free_port,
    make_temp_dir,
    remove_temp_dir,
    wait_until,
)
from .server import Backend

USE_ENV = "EPOCHAL_USE_CONTAINERS"
OWNER_LABEL = "io.epochal.harness.owner"
"""The label of every container the harness starts: the pid of the process that owns it."""
HOST = "127.0.0.1"


@functools.cache
def docker_available() -> bool:
    """Whether to use containers: a Docker engine answers and testcontainers imports."""
    choice = os.environ.get(USE_ENV, "").strip().lower()
    if choice in ("0", "no", "false"):
        return False
    usable = _daemon_answers() and _testcontainers_importable()
    if choice in ("1", "yes", "true") and not usable:
        raise PrerequisiteError(
            f"{USE_ENV}=1 but no Docker engine answers `docker info` (set DOCKER_HOST, or "
            "run the suite with `make test`, which starts one) or the 'testcontainers' "
            "package is missing (pip install testcontainers)"
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


def _container(image: str) -> Any:
    """A testcontainers container of ``image``, labelled with its owner (not started)."""
    # testcontainers' reaper is a container of an image from a registry: the harness
    # removes its containers itself (ContainerBackend.close, and sweep() for a killed owner)
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.core.container import DockerContainer

    sweep()
    return DockerContainer(image).with_kwargs(labels={OWNER_LABEL: str(os.getpid())})


def sweep() -> int:
    """Remove the containers of harness processes that are gone (killed before their
    clean-up); how many."""
    try:
        import docker
    except ImportError:
        return 0
    client = docker.from_env()
    removed = 0
    for container in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        owner = int(container.labels.get(OWNER_LABEL, "0") or 0)
        if owner and not alive(owner):
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
    return removed


class ContainerBackend(Backend):
    """A server in a container: fault controls on the container, readiness by ``probe``."""

    supports_faults = True
    start_timeout = 120.0

    def __init__(
        self, name: str, container: Any, probe: Callable[[], Any], workdir: Path | None = None
    ) -> None:
        self.name = name
        self.container = container
        self.probe = probe
        self.workdir = workdir
        self._lock = threading.RLock()

    @property
    def _docker(self) -> Any:
        return self.container.get_wrapped_container()

    def _status(self) -> str:
        container = self._docker
        container.reload()
        return str(container.status)

    def start(self) -> None:
        """Start (or unpause) the container if needed and poll the probe until ready."""
        with self._lock:
            status = self._status()
            if status == "paused":
                self._docker.unpause()
            elif status != "running":
                self._docker.start()
            self.wait_ready()

    def wait_ready(self) -> None:
        """Poll the readiness probe; fail fast if the container exits."""

        def ready() -> bool:
            status = self._status()
            if status in ("exited", "dead"):
                raise ServerStartError(
                    f"{self.name}'s container {status} before it was ready:\n{self.log_tail(60)}"
                )
            try:
                return bool(self.probe())
            except Exception:
                return False

        try:
            wait_until(ready, self.start_timeout, f"{self.name} to become ready", interval=0.25)
        except TimeoutError as exc:
            raise ServerStartError(f"{exc}\n{self.log_tail(60)}") from exc

    def stop(self) -> None:
        """``docker stop``: SIGTERM, SIGKILL after 30 s; the container's data is kept."""
        with self._lock:
            if self._status() == "paused":
                self._docker.unpause()
            self._docker.stop(timeout=30)

    def kill(self) -> None:
        """``docker kill``: SIGKILL; the container's data is kept."""
        with self._lock:
            if self._status() in ("running", "paused"):
                self._docker.kill()
            self._docker.wait(timeout=60)

    def pause(self) -> None:
        """``docker pause``: every process of the server frozen (the cgroup freezer)."""
        with self._lock:
            self._docker.pause()

    def unpause(self) -> None:
        """``docker unpause``: the frozen server goes on where it was."""
        with self._lock:
            self._docker.unpause()

    def is_running(self) -> bool:
        """Whether the container runs (and is not frozen)."""
        return self._status() == "running"

    def log_tail(self, lines: int = 80) -> str:
        """The container's last log lines."""
        try:
            text = self._docker.logs(tail=lines).decode(errors="replace")
        except Exception as exc:
            return f"<container logs unavailable: {exc!r}>"
        return text

    def close(self) -> None:
        """Remove the container (and the configuration the harness wrote for it)."""
        with self._lock:
            with contextlib.suppress(Exception):
                self._docker.remove(force=True)
            if self.workdir is not None:
                remove_temp_dir(self.workdir)


def _publish(container: Any, inside: int, outside: int) -> None:
    """Publish the container's port ``inside`` on ``outside`` of 127.0.0.1 only (never on
    the machine's other addresses: the servers take the harness's test logins)."""
    container.ports[f"{inside}/tcp"] = (HOST, outside)


def _started(name: str, container: Any, probe: Callable[[], Any], workdir: Path | None) -> Any:
    """Start ``container`` and wait until ``probe`` says its server is ready."""
    try:
        container.start()
    except Exception as exc:
        if workdir is not None:
            remove_temp_dir(workdir)
        raise ServerStartError(f"the {name} container did not start: {exc}") from exc
    backend = ContainerBackend(name, container, probe, workdir)
    try:
        backend.wait_ready()
    except HarnessError:
        backend.close()
        raise
    return backend


def start_kafka_container() -> tuple[ContainerBackend, str]:
    """A single KRaft broker+controller in a container of the harness's Kafka image, with the
    local broker's settings (:func:`~integration.harness.kafka.broker_properties`); the
    backend and the bootstrap servers."""
    from .kafka import _LOG4J2, JVM_OPTS, NodeSpec, broker_properties, kafka_ready, new_cluster_id

    image = images.ensure("kafka")
    port = free_port()
    spec = NodeSpec(1, port, 9093, new_cluster_id())
    props = broker_properties(spec, Path("/var/lib/kafka/data"))
    props["listeners"] = f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://{HOST}:9093"
    props["advertised.listeners"] = f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:9093"
    workdir = make_temp_dir("epochal-kafka-container-")
    (workdir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (workdir / "log4j2.properties").write_text(_LOG4J2)
    jvm = [*JVM_OPTS, "-Xmx512m", "-Dlog4j2.configurationFile=/work/log4j2.properties"]
    container = (
        _container(image)
        .with_volume_mapping(str(workdir), "/work", "ro")
        .with_env("KAFKA_CLUSTER_ID", spec.cluster_id)
        .with_env("KAFKA_JVM_OPTIONS", " ".join(jvm))
    )
    _publish(container, port, port)
    bootstrap = f"{HOST}:{port}"
    backend = _started("kafka", container, lambda: kafka_ready(bootstrap), workdir)
    return backend, bootstrap


def start_postgres_container() -> tuple[ContainerBackend, str]:
    """A PostgreSQL server in a container of the harness's image, with the local server's
    settings (two-phase commit on); the backend and its superuser DSN."""
    from .postgres import MAX_PREPARED_TRANSACTIONS, PASSWORD, SUPERUSER, make_dsn, postgres_ready

    image = images.ensure("postgres")
    port = free_port()
    settings = {
        "max_prepared_transactions": str(MAX_PREPARED_TRANSACTIONS),
        "max_connections": "200",
        "shared_buffers": "64MB",
        "log_min_messages": "warning",
    }
    container = (
        _container(image)
        .with_env("POSTGRES_USER", SUPERUSER)
        .with_env("POSTGRES_PASSWORD", PASSWORD)
        .with_command([arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")])
    )
    _publish(container, 5432, port)
    dsn = make_dsn(HOST, port, SUPERUSER, PASSWORD, "postgres")
    return _started("postgres", container, lambda: postgres_ready(dsn), None), dsn


def start_artemis_container(user: str, password: str) -> tuple[ContainerBackend, dict[str, Any]]:
    """An Artemis broker in a container of the harness's image, created with the local
    broker's options and its STOMP acceptor (``/queue/`` and ``/topic/`` prefixes); the
    backend and the STOMP host and port."""
    from .jms import _ACCEPTORS, CREATE_OPTIONS, JAVA_ARGS, stomp_ready

    image = images.ensure("artemis")
    port = free_port()
    workdir = make_temp_dir("epochal-artemis-container-")
    (workdir / "acceptors.xml").write_text(
        _ACCEPTORS.format(host="0.0.0.0", core=61616, stomp=61613)
    )
    options = _without_login(CREATE_OPTIONS)
    options = [("0.0.0.0" if o == HOST else o) for o in options]
    container = (
        _container(image)
        .with_volume_mapping(str(workdir), "/work", "ro")
        .with_env("ARTEMIS_USER", user)
        .with_env("ARTEMIS_PASSWORD", password)
        .with_env("ARTEMIS_CREATE_OPTIONS", " ".join(options))
        .with_env("JAVA_ARGS", JAVA_ARGS)
    )
    _publish(container, 61613, port)
    backend = _started("jms", container, lambda: stomp_ready(HOST, port, user, password), workdir)
    return backend, {"host": HOST, "port": port}


def _without_login(options: list[str]) -> list[str]:
    """``artemis create`` options without ``--user``/``--password`` and their values (the
    container's entrypoint gives its own)."""
    out: list[str] = []
    skip = False
    for option in options:
        if skip:
            skip = False
            continue
        if option in ("--user", "--password"):
            skip = True
            continue
        out.append(option)
    return out
