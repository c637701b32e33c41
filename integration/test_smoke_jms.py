"""Smoke tests: the STOMP broker is real; ack, transactions, redelivery and dedup work."""

from __future__ import annotations

import contextlib
import queue
import socket
import uuid
from typing import Any

import pytest

from integration.harness.jms import JmsQueue, JmsServer, StompCollector, send_confirmed

pytestmark = pytest.mark.integration

DEADLINE = 30.0
QUIET_WINDOW = 1.0  # after a later positive control arrived, nothing else may follow


def _subscribe(server: JmsServer, destination: str) -> tuple[Any, StompCollector]:
    conn, collector = server.connect()
    conn.subscribe(destination, id=uuid.uuid4().hex, ack="client-individual")
    return conn, collector


def _bodies(frames: list[Any]) -> list[str]:
    return [frame.body for frame in frames]


def _assert_nothing_more(collector: StompCollector) -> None:
    with pytest.raises(queue.Empty):
        extra = collector.receive(timeout=QUIET_WINDOW)
        pytest.fail(f"unexpected extra message {extra.body!r}")


def _drop(conn: Any) -> None:
    """Cut the TCP connection without a DISCONNECT frame (a crashed client)."""
    sock = conn.transport.socket
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def test_unacknowledged_message_is_redelivered_after_connection_drop(
    jms_server: JmsServer, jms_queue: JmsQueue
) -> None:
    """client-individual: a message not ACKed before the connection drops comes back."""
    producer, producer_events = jms_server.connect()
    send_confirmed(producer, producer_events, jms_queue.destination, "m1")

    first, first_events = _subscribe(jms_server, jms_queue.destination)
    assert first_events.receive(DEADLINE).body == "m1"
    _drop(first)

    second, second_events = _subscribe(jms_server, jms_queue.destination)
    redelivered = second_events.receive(DEADLINE)
    assert redelivered.body == "m1"
    second.ack(redelivered.headers["ack"])
    send_confirmed(producer, producer_events, jms_queue.destination, "marker")
    assert second_events.receive(DEADLINE).body == "marker"
    for conn in (producer, second):
        conn.disconnect()


def test_aborted_transaction_delivers_nothing(jms_server: JmsServer, jms_queue: JmsQueue) -> None:
    """SEND inside an aborted STOMP transaction is discarded; a committed one is delivered."""
    producer, producer_events = jms_server.connect()
    aborted = producer.begin()
    producer.send(jms_queue.destination, body="aborted", transaction=aborted)
    producer.abort(aborted)
    committed = producer.begin()
    producer.send(jms_queue.destination, body="committed", transaction=committed)
    producer.commit(committed)
    send_confirmed(producer, producer_events, jms_queue.destination, "marker")

    consumer, events = _subscribe(jms_server, jms_queue.destination)
    assert _bodies(events.receive_n(2, DEADLINE)) == ["committed", "marker"]
    _assert_nothing_more(events)
    for conn in (producer, consumer):
        conn.disconnect()


def test_duplicate_id_header_drops_the_second_message(
    jms_server: JmsServer, jms_queue: JmsQueue
) -> None:
    """Artemis duplicate detection: a second SEND with the same ``_AMQ_DUPL_ID`` is dropped."""
    if not jms_server.is_artemis:
        pytest.skip(f"duplicate detection is Artemis-specific (broker: {jms_server.server_header})")
    producer, producer_events = jms_server.connect()
    dup = {"_AMQ_DUPL_ID": f"dup-{uuid.uuid4().hex}"}
    send_confirmed(producer, producer_events, jms_queue.destination, "first", dup)
    send_confirmed(producer, producer_events, jms_queue.destination, "second", dup)
    send_confirmed(producer, producer_events, jms_queue.destination, "marker")

    consumer, events = _subscribe(jms_server, jms_queue.destination)
    assert _bodies(events.receive_n(2, DEADLINE)) == ["first", "marker"]
    _assert_nothing_more(events)
    for conn in (producer, consumer):
        conn.disconnect()


def test_persistent_message_survives_kill_and_restart(
    jms_server: JmsServer, jms_queue: JmsQueue
) -> None:
    """kill -9 of the broker keeps a persistent message that the broker confirmed."""
    jms_server.require_faults()
    producer, producer_events = jms_server.connect()
    send_confirmed(
        producer, producer_events, jms_queue.destination, "durable", {"persistent": "true"}
    )
    producer.disconnect()

    jms_server.kill()
    assert not jms_server.running
    jms_server.start()

    consumer, events = _subscribe(jms_server, jms_queue.destination)
    message = events.receive(DEADLINE)
    assert message.body == "durable"
    consumer.ack(message.headers["ack"])
    consumer.disconnect()
