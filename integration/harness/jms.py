"""A JMS broker speaking STOMP 1.2 for integration tests: Apache ActiveMQ Artemis.

The Artemis distribution comes from Maven Central (see :mod:`integration.harness.cache`);
a broker instance is created with ``artemis create`` in a temporary directory, its acceptors
are rewritten to loopback and free ports (a CORE acceptor and a STOMP acceptor mapping
``/queue/`` to anycast and ``/topic/`` to multicast), and ``bin/artemis run`` starts it.
The journal lives in the instance directory and survives stop/kill/start.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

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
from .cache import artemis_home, artemis_version, require_java
from .server import ExternalBackend, LocalBackend, Server

USER = "epochal"
PASSWORD = "epochal"
QUEUE_PREFIX = "/queue/"
JAVA_ARGS = (
    "-Xms64m -Xmx512m -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Dlog4j2.disableJmx=true "
    "--add-opens java.base/jdk.internal.misc=ALL-UNNAMED"
)
#: ``artemis create`` options: login required, loopback, no web console, NIO journal
#: without fsync (a killed JVM loses nothing: the OS keeps the page cache), small heap.
CREATE_OPTIONS = [
    "--silent",
    "--force",
    "--user",
    USER,
    "--password",
    PASSWORD,
    "--require-login",
    "--host",
    HOST,
    "--no-web",
    "--no-autotune",
    "--nio",
    "--no-fsync",
    "--java-memory",
    "512M",
    "--no-amqp-acceptor",
    "--no-hornetq-acceptor",
    "--no-mqtt-acceptor",
]
_ACCEPTORS = """<acceptors>
         <acceptor name="artemis">tcp://{host}:{core}?protocols=CORE;useEpoll=true</acceptor>
         <acceptor name="stomp">tcp://{host}:{stomp}?protocols=STOMP;useEpoll=true;anycastPrefix=/queue/;multicastPrefix=/topic/</acceptor>
      </acceptors>"""


def _stomp() -> Any:
    try:
        import stomp
    except ImportError as exc:
        raise PrerequisiteError("the JMS fixtures need stomp.py: pip install stomp.py") from exc
    return stomp


class StompCollector:
    """A stomp.py listener that queues MESSAGE frames (and errors) for a test to take."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.errors: list[Any] = []
        self.connected_headers: dict[str, str] = {}
        self.receipts: set[str] = set()
        self.disconnected = False

    def on_connected(self, frame: Any) -> None:
        """Remember the CONNECTED frame's headers (e.g. ``server``)."""
        self.connected_headers = dict(frame.headers)

    def on_message(self, frame: Any) -> None:
        """Queue a MESSAGE frame."""
        self.messages.put(frame)

    def on_error(self, frame: Any) -> None:
        """Remember an ERROR frame."""
        self.errors.append(frame)

    def on_receipt(self, frame: Any) -> None:
        """Remember a RECEIPT frame's ``receipt-id``."""
        self.receipts.add(frame.headers.get("receipt-id", ""))

    def on_disconnected(self) -> None:
        """Note that the connection is gone."""
        self.disconnected = True

    def receive(self, timeout: float = 10.0) -> Any:
        """The next MESSAGE frame; raises ``queue.Empty`` after ``timeout`` seconds."""
        return self.messages.get(timeout=timeout)

    def receive_n(self, count: int, timeout: float = 10.0) -> list[Any]:
        """Exactly ``count`` frames, waiting at most ``timeout`` seconds in total."""
        frames: list[Any] = []
        wait_until(
            lambda: _drain_into(self.messages, frames, count) >= count,
            timeout,
            f"{count} STOMP messages (got {len(frames)})",
            interval=0.05,
        )
        return frames


def send_confirmed(
    conn: Any,
    collector: StompCollector,
    destination: str,
    body: str,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> None:
    """SEND with a ``receipt`` header and wait until the broker confirms it."""
    receipt = uuid.uuid4().hex
    conn.send(destination, body=body, headers={**(headers or {}), "receipt": receipt})
    wait_until(lambda: receipt in collector.receipts, timeout, f"receipt for SEND to {destination}")


def _drain_into(source: queue.Queue[Any], sink: list[Any], limit: int) -> int:
    while len(sink) < limit:
        try:
            sink.append(source.get_nowait())
        except queue.Empty:
            break
    return len(sink)


def stomp_connect(
    host: str, port: int, user: str, password: str, client_id: str | None = None
) -> tuple[Any, StompCollector]:
    """Open a STOMP 1.2 connection and return it with its :class:`StompCollector`."""
    stomp = _stomp()
    conn = stomp.Connection12([(host, port)], heartbeats=(0, 0), reconnect_attempts_max=1)
    collector = StompCollector()
    conn.set_listener("collector", collector)
    headers = {"client-id": client_id} if client_id else {}
    conn.connect(user, password, wait=True, headers=headers)
    return conn, collector


def stomp_ready(
    host: str, port: int, user: str, password: str, timeout: float = 10.0
) -> dict[str, str]:
    """One readiness probe: a STOMP CONNECT succeeds within ``timeout`` seconds; returns the
    CONNECTED headers. stomp.py waits for CONNECTED without a limit, and a frozen broker's
    kernel still accepts the connection, so the probe runs in a thread it stops waiting for."""
    answer: queue.Queue[dict[str, str] | BaseException] = queue.Queue(maxsize=1)

    def probe() -> None:
        try:
            conn, collector = stomp_connect(host, port, user, password)
            try:
                answer.put(collector.connected_headers or {"server": "unknown"})
            finally:
                conn.disconnect()
        except BaseException as exc:  # handed to the caller's thread
            answer.put(exc)

    threading.Thread(target=probe, name="stomp-ready-probe", daemon=True).start()
    try:
        result = answer.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"no STOMP CONNECTED from {host}:{port} within {timeout:g} s") from None
    if isinstance(result, BaseException):
        raise result
    return result


class LocalArtemis(LocalBackend):
    """An Artemis broker instance (``artemis create``) run from a temporary directory."""

    start_timeout = 90.0

    def __init__(self, name: str = "jms") -> None:
        java = require_java()
        home = artemis_home()
        workdir = make_temp_dir("epochal-artemis-")
        instance = workdir / "instance"
        env = {**os.environ, "JAVA_HOME": os.path.dirname(os.path.dirname(os.path.realpath(java)))}
        env["JAVA_ARGS"] = JAVA_ARGS
        run_checked(
            [str(home / "bin" / "artemis"), "create", str(instance), *CREATE_OPTIONS],
            f"creating an Artemis {artemis_version()} broker instance",
            timeout=120,
            env=env,
        )
        self.core_port = free_port()
        self.stomp_port = free_port()
        broker_xml = instance / "etc" / "broker.xml"
        text = broker_xml.read_text()
        acceptors = _ACCEPTORS.format(host=HOST, core=self.core_port, stomp=self.stomp_port)
        text, count = re.subn(r"<acceptors>.*?</acceptors>", acceptors, text, flags=re.S)
        if count != 1:
            raise HarnessError(f"could not find the <acceptors> block in {broker_xml}")
        broker_xml.write_text(text)
        process = ManagedProcess(
            name=name,
            argv=[str(instance / "bin" / "artemis"), "run"],
            log_path=workdir / "server.log",
            env=env,
            cwd=instance,
            stop_signal=signal.SIGTERM,
            stop_timeout=30,
        )
        super().__init__(name, workdir, process)
        self.server_header = ""

    def probe(self) -> bool:
        """Port open and a STOMP CONNECT succeeds."""
        if not port_open(HOST, self.stomp_port):
            return False
        self.server_header = stomp_ready(HOST, self.stomp_port, USER, PASSWORD).get("server", "")
        return True


@dataclass
class JmsServer(Server):
    """Connection info and controls of the STOMP broker provided by ``jms_server``."""

    host: str = HOST
    port: int = 0
    user: str = USER
    password: str = PASSWORD
    queue_prefix: str = QUEUE_PREFIX
    server_header: str = ""

    @property
    def url(self) -> str:
        """``stomp://user:password@host:port``."""
        return f"stomp://{self.user}:{self.password}@{self.host}:{self.port}"

    @property
    def is_artemis(self) -> bool:
        """Whether the broker is ActiveMQ Artemis (per the STOMP ``server`` header)."""
        return "artemis" in self.server_header.lower()

    def destination(self, queue_name: str) -> str:
        """The STOMP destination of an anycast queue ``queue_name``."""
        return f"{self.queue_prefix}{queue_name}"

    def connect(self, client_id: str | None = None) -> tuple[Any, StompCollector]:
        """A new STOMP 1.2 connection and its message collector."""
        return stomp_connect(self.host, self.port, self.user, self.password, client_id)


@dataclass(frozen=True)
class JmsQueue:
    """A unique queue for one test: its name and STOMP destination."""

    name: str
    destination: str

    def __str__(self) -> str:
        return self.destination


def new_queue(server: JmsServer, hint: str = "q") -> JmsQueue:
    """A fresh, unique queue name on ``server`` (created by the broker on first use)."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", hint)[:40].strip("-") or "q"
    name = f"it-{safe}-{uuid.uuid4().hex[:10]}"
    return JmsQueue(name=name, destination=server.destination(name))


def parse_stomp_url(url: str) -> dict[str, Any]:
    """Parse ``stomp://user:pass@host:port[?queue_prefix=/queue/]``."""
    parts = urlsplit(url)
    if parts.scheme not in ("stomp", "tcp", "") or not parts.hostname:
        raise HarnessError(f"EPOCHAL_STOMP_URL must look like stomp://user:pass@host:port: {url}")
    query = parse_qs(parts.query)
    return {
        "host": parts.hostname,
        "port": parts.port or 61613,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "queue_prefix": query.get("queue_prefix", [QUEUE_PREFIX])[0],
    }


def start_jms() -> JmsServer:
    """Provide the broker: ``$EPOCHAL_STOMP_URL``, else a container, else local Artemis."""
    external = os.environ.get("EPOCHAL_STOMP_URL")
    if external:
        info = parse_stomp_url(external)
        headers = wait_until(
            lambda: stomp_ready(info["host"], info["port"], info["user"], info["password"]),
            60,
            "STOMP broker at EPOCHAL_STOMP_URL",
        )
        backend = ExternalBackend("jms", "EPOCHAL_STOMP_URL")
        return JmsServer(backend, server_header=headers.get("server", ""), **info)
    from .containers import docker_available, start_artemis_container

    if docker_available():
        container_backend, info = start_artemis_container(USER, PASSWORD)
        headers = wait_until(
            lambda: stomp_ready(info["host"], info["port"], USER, PASSWORD),
            120,
            "Artemis container",
        )
        return JmsServer(
            container_backend,
            server_header=headers.get("server", ""),
            user=USER,
            password=PASSWORD,
            **info,
        )
    local = LocalArtemis()
    try:
        local.start()
    except HarnessError:
        local.close()
        raise
    return JmsServer(local, port=local.stomp_port, server_header=local.server_header)
