"""A test double of a message broker, for the acknowledging-source protocol.

A queue in a SQLite file that behaves like a JMS queue with client-individual acknowledgement:
messages delivered and not acknowledged are redelivered (flagged) when a new consumer session
opens (the old connection is gone), acknowledgements of messages delivered to another session
are ignored, and a consumer never holds more than ``max_unacknowledged`` messages. It is a
connector (``testqueue``) so that crash tests can run the protocol on Spark; load it with
``EPOCHAL_PLUGINS=epochal.testing.broker``. The JMS connector is tested against a real broker.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Sequence

from epochal_sdk import AcknowledgingSource, Connector, Message, Options
from epochal_sdk.hookspecs import hookimpl

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages (queue TEXT NOT NULL, id TEXT NOT NULL, body TEXT,"
    " seq INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'ready', session TEXT,"
    " deliveries INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (queue, id))"
)


class TestBroker:
    """The queue file, as a producer, a consumer session and an inspector use it."""

    __test__ = False  # not a pytest test class

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, timeout=60, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(_SCHEMA)

    def send(self, queue: str, messages: Sequence[tuple[str, str]]) -> None:
        """Enqueue (id, body) pairs in order."""
        with self._tx():
            start = self.conn.execute(
                "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE queue = ?", (queue,)
            ).fetchone()[0]
            self.conn.executemany(
                "INSERT INTO messages (queue, id, body, seq) VALUES (?, ?, ?, ?)",
                [(queue, i, b, start + n) for n, (i, b) in enumerate(messages)],
            )

    def open_session(self, queue: str) -> str:
        """A new consumer session: what older sessions did not acknowledge becomes ready."""
        with self._tx():
            self.conn.execute(
                "UPDATE messages SET state = 'ready', session = NULL "
                "WHERE queue = ? AND state = 'delivered'",
                (queue,),
            )
        return uuid.uuid4().hex

    def deliver(self, queue: str, session: str, limit: int) -> list[tuple[str, str, bool]]:
        """Up to ``limit`` ready messages for ``session``: (id, body, redelivered)."""
        with self._tx():
            rows = self.conn.execute(
                "SELECT id, body, deliveries FROM messages WHERE queue = ? AND state = 'ready' "
                "ORDER BY seq LIMIT ?",
                (queue, limit),
            ).fetchall()
            self.conn.executemany(
                "UPDATE messages SET state = 'delivered', session = ?, deliveries = deliveries + 1"
                " WHERE queue = ? AND id = ?",
                [(session, queue, r[0]) for r in rows],
            )
        return [(r[0], r[1], r[2] > 0) for r in rows]

    def unacknowledged(self, queue: str, session: str) -> int:
        """Messages delivered to ``session`` and not acknowledged."""
        return self.conn.execute(
            "SELECT COUNT(*) FROM messages WHERE queue = ? AND session = ? AND state = 'delivered'",
            (queue, session),
        ).fetchone()[0]

    def ack(self, queue: str, session: str, ids: Sequence[str]) -> None:
        """Acknowledge messages delivered to ``session`` (others are ignored, as brokers do)."""
        with self._tx():
            self.conn.executemany(
                "UPDATE messages SET state = 'acked' WHERE queue = ? AND id = ? AND session = ? "
                "AND state = 'delivered'",
                [(queue, i, session) for i in ids],
            )

    def states(self, queue: str) -> dict[str, int]:
        """How many messages are in each state."""
        rows = self.conn.execute(
            "SELECT state, COUNT(*) FROM messages WHERE queue = ? GROUP BY state", (queue,)
        ).fetchall()
        return dict(rows)

    def _tx(self) -> _Tx:
        return _Tx(self.conn)

    def close(self) -> None:
        self.conn.close()


class _Tx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


class TestQueueSource(AcknowledgingSource):
    """An acknowledging source over :class:`TestBroker`. Options: ``path``, ``queue``."""

    __test__ = False

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.path = options.required("path")
        self.queue = options.required("queue")
        self.broker: TestBroker | None = None
        self.session = ""
        self.capacity = 0

    def schema(self) -> str:
        return "id string, body string"

    def open(self, max_unacknowledged: int) -> None:
        self.broker = TestBroker(self.path)
        self.session = self.broker.open_session(self.queue)
        self.capacity = max_unacknowledged

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        assert self.broker is not None, "open() first"
        deadline = time.monotonic() + timeout
        while True:
            room = self.capacity - self.broker.unacknowledged(self.queue, self.session)
            got = self.broker.deliver(self.queue, self.session, max(0, min(max_messages, room)))
            if got or time.monotonic() >= deadline:
                return [Message(i, (i, b), redelivered=r) for i, b, r in got]
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def acknowledge(self, ids: Sequence[str]) -> None:
        assert self.broker is not None, "open() first"
        self.broker.ack(self.queue, self.session, ids)

    def close(self) -> None:
        if self.broker is not None:
            self.broker.close()
            self.broker = None


class TestQueueConnector(Connector):
    """The test double broker as a connector."""

    __test__ = False
    name = "testqueue"
    description = "Test double of a message broker (SQLite file) for the ack protocol"
    source_class = TestQueueSource


@hookimpl
def register_connectors(register) -> None:
    """Register the test double."""
    register(TestQueueConnector)
