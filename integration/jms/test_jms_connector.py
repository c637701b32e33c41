"""The JMS connector's source and sink against a real broker (Artemis), without Spark: IDs,
redelivery, acknowledgement, flow control, duplicate detection, errors."""

from __future__ import annotations

import contextlib
import socket
import uuid
from typing import Any

import pytest
from epochal_jms import JmsSink, JmsSource
from epochal_jms.testing import broker_config, browse, browse_until, send, url_of

from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Guarantee,
    Options,
    PoisonRecordError,
    RestartableError,
    SchemaMismatchError,
)
from epochal_sdk.schema import Field
from integration.harness.jms import JmsQueue, JmsServer

pytestmark = pytest.mark.integration

DEADLINE = 30.0


@pytest.fixture
def config(jms_server: JmsServer) -> Any:
    return broker_config(jms_server.host, jms_server.port, jms_server.user, jms_server.password)


def source(config: Any, destination: str, **extra: str) -> JmsSource:
    options = {"url": url_of(config), "destination": destination, "heartbeatMs": "0", **extra}
    return JmsSource(Options("jms", options))


def receive_n(src: JmsSource, count: int) -> list[Any]:
    """Receive until ``count`` messages arrived (deadline, no sleeps)."""
    out: list[Any] = []
    for _ in range(200):
        out += src.receive(count - len(out), 0.3)
        if len(out) >= count:
            return out
    raise AssertionError(f"received {len(out)} of {count} messages")


def _drop(src: JmsSource) -> None:
    """Cut the TCP connection without DISCONNECT (a crashed driver)."""
    assert src.client is not None
    sock = src.client.conn.transport.socket
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    src.client = None


def test_ids_are_stable_across_redelivery_and_flagged(config: Any, jms_queue: JmsQueue) -> None:
    """Artemis' STOMP message-id changes with the consumer; the connector's ID does not, and
    a redelivered message says so."""
    send(config, jms_queue.destination, ["a", "b", "c"])
    first = source(config, jms_queue.destination)
    first.open(max_unacknowledged=100)
    got = receive_n(first, 3)
    assert [m.row[1] for m in got] == ["a", "b", "c"]
    assert not any(m.redelivered for m in got)
    raw_first = [m.headers["message-id"] for m in got]
    _drop(first)

    second = source(config, jms_queue.destination)
    second.open(max_unacknowledged=100)
    again = receive_n(second, 3)
    assert [m.id for m in again] == [m.id for m in got]
    assert [m.headers["message-id"] for m in again] != raw_first  # Artemis: consumer-scoped
    assert all(m.redelivered for m in again)
    assert all(m.row[5] for m in again)
    second.acknowledge([m.id for m in again])
    second.close()  # browse after close: a live consumer would take the marker
    assert browse(config, jms_queue.destination) == []


def test_acknowledge_ignores_unknown_and_repeated_ids(config: Any, jms_queue: JmsQueue) -> None:
    send(config, jms_queue.destination, ["x", "y"])
    src = source(config, jms_queue.destination)
    src.open(max_unacknowledged=100)
    got = receive_n(src, 2)
    src.acknowledge(["no-such-id", got[0].id])
    src.acknowledge([got[0].id, "older-session-id"])  # again: nothing happens
    src.close()  # y was not acknowledged: it goes back, x is gone
    back = browse_until(config, jms_queue.destination, lambda frames: bool(frames))
    assert [f.body for f in back] == [b"y"]


def test_schema_columns(config: Any, jms_queue: JmsQueue) -> None:
    send(config, jms_queue.destination, ["hello"], {"app": "v1"})
    src = source(config, jms_queue.destination)
    assert "headers map<string,string>" in src.schema()
    src.open(max_unacknowledged=10)
    (message,) = receive_n(src, 1)
    id_, body, destination, headers, timestamp, redelivered = message.row
    assert (body, destination, redelivered) == ("hello", jms_queue.destination, False)
    assert headers["app"] == "v1" and "ack" not in headers
    assert timestamp is not None and timestamp.tzinfo is None  # UTC wall-clock
    src.acknowledge([id_])
    src.close()


def test_unacknowledged_messages_never_exceed_the_bound(config: Any, jms_queue: JmsQueue) -> None:
    """The consumer window keeps the broker from dispatching more than max_unacknowledged
    (smallest possible messages: empty bodies); acknowledging lets more through."""
    bound = 20
    send(config, jms_queue.destination, [""] * (bound * 3))
    src = source(config, jms_queue.destination)
    src.open(max_unacknowledged=bound)
    held = receive_n(src, 1)
    held += src.receive(bound * 3, 2.0)  # everything the broker dispatches within 2 s
    assert src.client is not None
    held_total = len(held) + src.client.messages.qsize()
    assert 0 < held_total <= bound
    src.acknowledge([m.id for m in held])
    more = receive_n(src, 1)
    assert more[0].id not in {m.id for m in held}
    src.close()


def test_id_header_option_and_missing_id(config: Any, jms_queue: JmsQueue) -> None:
    send(config, jms_queue.destination, ["with"], {"order-id": "o-1"})
    send(config, jms_queue.destination, ["without"])
    src = source(config, jms_queue.destination, idHeader="order-id")
    src.open(max_unacknowledged=10)
    (first,) = src.receive(1, DEADLINE)
    assert first.id == "o-1"
    src.acknowledge([first.id])
    with pytest.raises(PoisonRecordError, match="idHeader"):
        src.receive(1, DEADLINE)
    src.close()


def test_durable_topic_subscription_keeps_messages_while_away(
    config: Any, jms_server: JmsServer
) -> None:
    topic = f"/topic/it-durable-{uuid.uuid4().hex[:8]}"
    name = f"sub-{uuid.uuid4().hex[:6]}"
    first = source(config, topic, durableSubscription=name)
    first.check()
    first.open(max_unacknowledged=10)
    first.close()  # the subscription exists now; nothing is connected
    send(config, topic, ["while away"])
    second = source(config, topic, durableSubscription=name)
    second.open(max_unacknowledged=10)
    (message,) = receive_n(second, 1)
    assert message.row[1] == "while away"
    second.acknowledge([message.id])
    second.close()


def test_durable_subscription_on_a_queue_is_a_config_error(config: Any) -> None:
    with pytest.raises(ConfigError, match="topic"):
        source(config, "/queue/q", durableSubscription="s").check()


def test_unreachable_broker_and_bad_login_are_clear_errors(config: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"stomp://u:p@127.0.0.1:{port}"
    with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
        JmsSource(Options("jms", {"url": url, "destination": "q", "connectTimeoutMs": "0"})).check()
    bad = f"stomp://{config.user}:wrong@{config.host}:{config.port}"
    with pytest.raises(ConfigError, match="cannot connect"):
        JmsSource(Options("jms", {"url": bad, "destination": "q"})).check()
    with pytest.raises(ConfigError, match="url"):
        JmsSource(Options("jms", {"url": "http://x", "destination": "q"}))


def _task(batch: int, partition: int = 0, attempt: int = 0, run: int = 0) -> ConnectorContext:
    schema = (Field("key", "string"), Field("value", "string"))
    return ConnectorContext("job-x", "jms-sink", batch, partition, attempt, schema, run)


def _write(sink: JmsSink, task: ConnectorContext, ids: list[int]) -> None:
    import pyarrow as pa

    writer = sink.open(task)
    keys = [str(i) for i in ids]
    writer.write(pa.record_batch({"key": keys, "value": keys}))
    writer.flush()
    writer.close()


def test_sink_replayed_task_is_dropped_by_the_broker(config: Any, jms_queue: JmsQueue) -> None:
    """The same (job, batch, partition) written again by another run and attempt: the broker
    drops the duplicates, also when the first attempt was only partly sent."""
    sink = JmsSink(Options("jms", {"url": url_of(config), "destination": jms_queue.destination}))
    assert sink.max_guarantee() == Guarantee.EXACTLY_ONCE
    sink.check((Field("key", "string"), Field("value", "string")))
    _write(sink, _task(7), [1, 2, 3])
    _write(sink, _task(7, attempt=1, run=1), [1, 2, 3])  # full replay: transaction refused
    _write(sink, _task(8), [4])  # a partial first attempt of batch 8 ...
    _write(sink, _task(8, run=2), [4, 5])  # ... completed by the replay
    frames = browse(config, jms_queue.destination)
    assert [(f.headers["key"], f.body) for f in frames] == [
        ("1", b"1"),
        ("2", b"2"),
        ("3", b"3"),
        ("4", b"4"),
        ("5", b"5"),
    ]
    assert frames[0].headers["_AMQ_DUPL_ID"] == "job-x.jms-sink.7.0.0"
    assert frames[0].headers["persistent"] == "true"


def test_sink_destination_and_headers_per_record(config: Any, jms_server: JmsServer) -> None:
    import pyarrow as pa

    a, b = (f"/queue/it-dest-{uuid.uuid4().hex[:8]}" for _ in range(2))
    options = {
        "url": url_of(config),
        "destinationColumn": "to",
        "bodyColumn": "payload",
        "headersColumn": "props",
        "headerColumns": "kind",
    }
    sink = JmsSink(Options("jms", options))
    schema = (
        Field("to", "string"),
        Field("payload", "binary"),
        Field("props", "map<string,string>"),
        Field("kind", "string"),
    )
    sink.check(schema)
    batch = pa.record_batch(
        {
            "to": [a, b],
            "payload": [b"\x00\x01", b"two"],
            "props": pa.array([[("p", "1")], []], type=pa.map_(pa.string(), pa.string())),
            "kind": ["k1", "k2"],
        }
    )
    writer = sink.open(_task(1))
    writer.write(batch)
    writer.flush()
    (first,) = browse(config, a)
    (second,) = browse(config, b)
    assert (first.body, first.headers["p"], first.headers["kind"]) == (b"\x00\x01", "1", "k1")
    assert (second.body, second.headers["kind"]) == (b"two", "k2")


def test_sink_schema_errors(config: Any) -> None:
    sink = JmsSink(Options("jms", {"url": url_of(config), "destination": "q"}))
    with pytest.raises(SchemaMismatchError, match="bodyColumn"):
        sink.check((Field("key", "string"),))
    with pytest.raises(SchemaMismatchError, match="string or binary"):
        sink.check((Field("value", "bigint"),))
    with pytest.raises(SchemaMismatchError, match="reserves"):
        sink.check((Field("value", "string"), Field("destination", "string")))


def test_non_artemis_id_header_is_at_least_once(config: Any) -> None:
    options = {"url": url_of(config), "destination": "q", "idHeader": "my-id"}
    assert JmsSink(Options("jms", options)).max_guarantee() == Guarantee.AT_LEAST_ONCE


def test_connection_loss_after_start_is_restartable(
    config: Any, jms_server: JmsServer, jms_queue: JmsQueue
) -> None:
    """The broker goes away under an open source: receive and acknowledge raise
    RestartableError (the supervisor restarts the job); nothing is lost."""
    jms_server.require_faults()
    send(config, jms_queue.destination, ["before"])
    src = source(config, jms_queue.destination)
    src.open(max_unacknowledged=10)
    (message,) = receive_n(src, 1)
    jms_server.kill()
    with pytest.raises(RestartableError):
        for _ in range(100):  # the listener sees the closed socket within a few receives
            src.receive(1, 0.3)
            src.acknowledge([message.id])
    src.close()
    jms_server.start()
    again = source(config, jms_queue.destination)
    again.open(max_unacknowledged=10)
    (redelivered,) = receive_n(again, 1)
    assert redelivered.id == message.id and redelivered.row[1] == "before"
    again.acknowledge([redelivered.id])
    again.close()
