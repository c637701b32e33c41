"""The JMS connector under epochal's conformance kit, and broker helpers for tests.

:class:`JmsQueueUnderTest` is a queue as the source under test, :class:`JmsSinkUnderTest` a
queue as the sink under test. Both read the broker independently of the connector: with a
fresh STOMP consumer that takes everything up to a marker message it sent itself, and
acknowledges only the marker (so the messages stay on the queue).
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from epochal.testing import SinkUnderTest, SourceUnderTest
from epochal_jms.client import BrokerConfig, StompClient

MARKER_HEADER = "epochal-test-marker"


def broker_config(host: str, port: int, user: str, password: str) -> BrokerConfig:
    """A broker config for tests (no heartbeats)."""
    return BrokerConfig(host, port, user, password, heartbeat_ms=0, connect_timeout_ms=0)


def url_of(config: BrokerConfig) -> str:
    """The ``url`` option for a broker config."""
    return f"stomp://{config.user}:{config.password}@{config.host}:{config.port}"


def send(
    config: BrokerConfig, destination: str, bodies: Sequence[str], headers: Any = None
) -> None:
    """Send persistent messages and wait until the broker confirmed the last one."""
    client = StompClient(config).connect()
    try:
        receipt = client.receipt()
        for n, body in enumerate(bodies):
            extra = {"receipt": receipt} if n == len(bodies) - 1 else {}
            more = headers(n) if callable(headers) else (headers or {})
            client.conn.send(destination, body, headers={"persistent": "true", **more, **extra})
        if bodies:
            client.wait_receipt(receipt, f"sending to {destination}")
    finally:
        client.close()


def browse(config: BrokerConfig, destination: str, timeout: float = 120.0) -> list[Any]:
    """Every message on a queue now, in order, left on the queue: send a marker, consume up
    to it without acknowledging anything but the marker, disconnect."""
    marker = uuid.uuid4().hex
    send(config, destination, [""], {MARKER_HEADER: marker})
    client = StompClient(config).connect()
    frames: list[Any] = []
    try:
        client.conn.subscribe(  # no flow control: nothing is acknowledged until the marker
            destination,
            id="browse",
            ack="client-individual",
            headers={"consumer-window-size": "-1"},
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = client.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"the marker sent to {destination} did not come back within {timeout} s "
                    f"({len(frames)} other messages came; is another consumer attached?)"
                ) from None
            found = frame.headers.get(MARKER_HEADER)
            if found == marker:
                receipt = client.receipt()
                client.conn.ack(frame.headers["ack"], receipt=receipt)
                client.wait_receipt(receipt, "acknowledging the marker")
                return frames
            if found is None:
                frames.append(frame)
            else:  # an older marker left behind by an interrupted browse
                client.conn.ack(frame.headers["ack"])
    finally:
        client.close()


def browse_until(
    config: BrokerConfig,
    destination: str,
    settled: Callable[[list[Any]], bool],
    timeout: float = 30.0,
) -> list[Any]:
    """Browse again until ``settled`` holds for what is on the queue, or ``timeout`` s passed;
    the last browse either way. For messages a session that just closed held: Artemis confirms
    the DISCONNECT before it has put that session's unacknowledged messages back."""
    deadline = time.monotonic() + timeout
    while True:
        frames = browse(config, destination)
        if settled(frames) or time.monotonic() >= deadline:
            return frames


class JmsQueueUnderTest(SourceUnderTest):
    """A queue as the source: bodies are the record IDs; the broker's message IDs are the
    message IDs."""

    connector = "jms"
    id_expr = "CAST(body AS BIGINT)"

    def __init__(self, config: BrokerConfig, destination: str, **options: str) -> None:
        self.config, self.destination, self.extra = config, destination, options

    def options(self) -> dict[str, str]:
        return {
            "url": url_of(self.config),
            "destination": self.destination,
            "receiveTimeoutMs": "300",
            **self.extra,
        }

    def produce(self, ids: Sequence[int]) -> None:
        send(self.config, self.destination, [str(i) for i in ids])

    def unsettled(self) -> list[str]:
        left = browse(self.config, self.destination)
        return [f"message {f.headers.get('message-id')} body {f.body!r}" for f in left[:10]] + (
            [f"... {len(left)} in all"] if len(left) > 10 else []
        )


class JmsSinkUnderTest(SinkUnderTest):
    """A queue as the sink: ``key`` goes in a header, ``value`` is the body."""

    connector = "jms"

    def __init__(self, config: BrokerConfig, destination: str) -> None:
        self.config, self.destination = config, destination

    def options(self, mode: str) -> dict[str, str]:
        return {
            "url": url_of(self.config),
            "destination": self.destination,
            "bodyColumn": "value",
        }

    def committed(self, mode: str) -> list[tuple[str, str]]:
        frames = browse(self.config, self.destination)
        return [(f.headers.get("key", ""), (f.body or b"").decode()) for f in frames]
