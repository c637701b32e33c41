"""AckProtocol against the broker test double (SQLite) and a real snapshot store."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from epochal.protocols.acking import ID_COLUMN, AckProtocol, decode_batch
from epochal.state.store import SnapshotStore
from epochal.testing.broker import TestBroker, TestQueueSource
from epochal_sdk import Options

SCHEMA = pa.schema([("id", pa.string()), ("body", pa.string())])
SOURCE_ID = "testqueue-0123456789"
WAIT = 5.0  # seconds to wait for messages that are there (returns at once when they are)


class CrashError(Exception):
    """Stands for the driver dying at a protocol step."""


class Env:
    """A queue file, a producer/inspector connection, and the job's store."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = str(tmp_path / "queue.sqlite")
        self.broker = TestBroker(self.path)
        self.store = SnapshotStore(str(tmp_path / "job" / "store"))
        self.sources: list[TestQueueSource] = []

    def send(self, *ids: str) -> None:
        self.broker.send("q", [(i, f"body-{i}") for i in ids])

    def source(self, max_unacknowledged: int = 1000) -> TestQueueSource:
        """A new consumer: what the previous ones did not acknowledge is redelivered."""
        for old in self.sources:
            old.close()
        src = TestQueueSource(Options("testqueue", {"path": self.path, "queue": "q"}))
        src.open(max_unacknowledged=max_unacknowledged)
        self.sources.append(src)
        return src

    def protocol(self, src: TestQueueSource, **kwargs) -> AckProtocol:
        return AckProtocol(self.store, src, SOURCE_ID, SCHEMA, **kwargs)

    def states(self) -> dict[str, str]:
        rows = self.broker.conn.execute("SELECT id, state FROM messages WHERE queue = 'q'")
        return dict(rows.fetchall())

    def close(self) -> None:
        for src in self.sources:
            src.close()
        self.broker.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.close()


def rows(*ids: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": list(ids), "body": [f"body-{i}" for i in ids]}, schema=SCHEMA
    )


def test_next_batch_stores_before_returning(env: Env) -> None:
    env.send("m1", "m2", "m3")
    stored_at_step = []

    def step(point: str, seq: int) -> None:
        stored_at_step.append(
            (point, seq, env.store.exists(f"sources/{SOURCE_ID}/batches/{seq:012d}"))
        )

    proto = env.protocol(env.source(), step=step)
    assert proto.next_batch(0, 10, WAIT) == 1
    assert stored_at_step == [
        ("ack_source.after_receive", 1, False),  # received, not stored yet: nothing acked
        ("ack_source.after_store", 1, True),
    ]
    assert env.store.list(f"sources/{SOURCE_ID}/batches") == [proto.batch_key(1)]
    assert env.store.manifest(proto.batch_key(1)).count == 3
    stored = decode_batch(env.store.read(proto.batch_key(1)))
    assert stored.column(ID_COLUMN).to_pylist() == ["m1", "m2", "m3"]


def test_stored_batch_reads_back_identical(env: Env) -> None:
    env.send("a", "b")
    proto = env.protocol(env.source())
    seq = proto.next_batch(0, 10, WAIT)
    batch = proto.read(seq)
    assert batch.schema == SCHEMA
    assert batch.equals(rows("a", "b"))
    # a second read (a replay) gives the same rows
    assert env.protocol(env.source()).read(seq).equals(rows("a", "b"))


def test_nothing_new_returns_start(env: Env) -> None:
    proto = env.protocol(env.source())
    assert proto.next_batch(0, 10, 0.0) == 0
    assert env.store.list(f"sources/{SOURCE_ID}/batches") == []


def test_nothing_is_acked_until_commit(env: Env) -> None:
    env.send("m1", "m2", "m3", "m4", "m5")
    proto = env.protocol(env.source())
    assert proto.next_batch(0, 3, WAIT) == 1
    assert proto.next_batch(1, 3, WAIT) == 2
    assert env.broker.states("q") == {"delivered": 5}
    assert proto.commit(1) == 3
    assert env.states() == {
        "m1": "acked",
        "m2": "acked",
        "m3": "acked",
        "m4": "delivered",
        "m5": "delivered",
    }
    assert env.store.read_json(f"sources/{SOURCE_ID}/acked") == {"seq": 1}
    assert proto.commit(2) == 2
    assert env.broker.states("q") == {"acked": 5}
    assert proto.state.last_acked == 2


def test_a_crash_before_ack_acknowledges_nothing(env: Env) -> None:
    env.send("m1")

    def step(point: str, seq: int) -> None:
        if point == "ack_source.before_ack":
            raise CrashError

    proto = env.protocol(env.source(), step=step)
    proto.next_batch(0, 10, WAIT)
    with pytest.raises(CrashError):
        proto.commit(1)
    assert env.broker.states("q") == {"delivered": 1}
    assert not env.store.exists(f"sources/{SOURCE_ID}/acked")


def test_restart_restores_the_state(env: Env) -> None:
    env.send("a", "b", "c")
    proto = env.protocol(env.source())
    proto.next_batch(0, 2, WAIT)
    proto.next_batch(1, 2, WAIT)
    proto.commit(1)
    again = env.protocol(env.source())
    assert again.state.last_stored == 2
    assert again.state.last_acked == 1
    assert dict(again.state.window) == {"a": 1, "b": 1, "c": 2}
    assert again.stats.ids_held == 3
    assert again.stats.oldest_batch == 1


def test_stored_but_unplanned_batch_is_reused(env: Env) -> None:
    env.send("a", "b")
    env.protocol(env.source()).next_batch(0, 10, WAIT)  # stored, then the driver died
    env.send("c")
    proto = env.protocol(env.source())  # the restarted driver
    assert proto.next_batch(0, 10, WAIT) == 1  # the same batch, nothing received
    assert env.states() == {"a": "ready", "b": "ready", "c": "ready"}
    assert proto.read(1).equals(rows("a", "b"))
    assert env.store.list(f"sources/{SOURCE_ID}/batches") == [proto.batch_key(1)]


def test_redeliveries_of_acked_batches_are_dropped_and_acked_at_once(env: Env) -> None:
    env.send("a", "b")
    env.protocol(env.source()).next_batch(0, 10, WAIT)
    # restart: Spark replays batch 1 and commits it before the redeliveries arrive, so the
    # broker ignores those acks (the messages were delivered to the dead session)
    proto = env.protocol(env.source())
    proto.commit(1)
    assert env.broker.states("q") == {"ready": 2}
    env.send("c")
    assert proto.next_batch(1, 10, WAIT) == 2
    assert proto.read(2).equals(rows("c"))
    assert env.states() == {"a": "acked", "b": "acked", "c": "delivered"}
    assert proto.stats.duplicates_dropped == 2
    assert proto.stats.redeliveries_outside_window == 0


def test_redeliveries_of_unacked_batches_are_acked_with_their_batch(env: Env) -> None:
    env.send("a", "b", "c", "d")
    first = env.protocol(env.source())
    first.next_batch(0, 2, WAIT)
    first.next_batch(1, 2, WAIT)
    first.commit(1)  # a, b acked; batch 2 (c, d) stored and planned, not acked
    proto = env.protocol(env.source())  # restart: c, d are redelivered
    assert proto.next_batch(2, 10, WAIT) == 2  # only redeliveries: no new batch
    assert proto.stats.duplicates_dropped == 2
    assert proto.state.pending == {2: ["c", "d"]}
    assert env.states() == {"a": "acked", "b": "acked", "c": "delivered", "d": "delivered"}
    acked = proto.commit(2)
    assert acked == 4  # the batch's ids, and their redeliveries
    assert env.broker.states("q") == {"acked": 4}
    assert proto.state.pending == {}
    assert len(env.store.list(f"sources/{SOURCE_ID}/batches")) == 2


def test_a_redelivery_older_than_the_window_is_passed_on_and_logged(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.send("a", "b", "c", "d")
    first = env.protocol(env.source(), window_batches=1)
    first.next_batch(0, 2, WAIT)  # batch 1: a, b
    first.next_batch(1, 2, WAIT)  # batch 2: c, d
    proto = env.protocol(env.source(), window_batches=1)  # restart: all four redelivered
    proto.commit(2)  # acks go nowhere (old session); batch 1 leaves the window
    assert env.store.list(f"sources/{SOURCE_ID}/batches") == [proto.batch_key(2)]
    assert dict(proto.state.window) == {"c": 2, "d": 2}
    with caplog.at_level(logging.WARNING, logger="epochal.ack"):
        assert proto.next_batch(2, 10, WAIT) == 3
    assert proto.read(3).equals(rows("a", "b"))  # passed on, not dropped
    assert proto.stats.redeliveries_outside_window == 2
    assert proto.stats.duplicates_dropped == 2  # c and d
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "message a was redelivered but is not in the dedupe window" in warnings[0]
    assert SOURCE_ID in warnings[0]
    assert "dedupeWindowBatches" in warnings[0]
    assert env.states() == {"a": "delivered", "b": "delivered", "c": "acked", "d": "acked"}


def test_new_messages_are_not_warned_about(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.send("a")
    with caplog.at_level(logging.WARNING, logger="epochal.ack"):
        env.protocol(env.source()).next_batch(0, 10, WAIT)
    assert caplog.records == []


def test_window_is_trimmed_by_id_count(env: Env) -> None:
    env.send("a", "b", "c")
    proto = env.protocol(env.source(), window_ids=2)
    proto.next_batch(0, 10, WAIT)
    assert list(proto.state.window) == ["b", "c"]
    assert proto.stats.ids_held == 2


def test_old_batches_leave_the_store_with_the_window(env: Env) -> None:
    env.send(*[f"m{i}" for i in range(6)])
    proto = env.protocol(env.source(), window_batches=2)
    for seq in range(6):
        assert proto.next_batch(seq, 1, WAIT) == seq + 1
    proto.commit(5)
    kept = env.store.list(f"sources/{SOURCE_ID}/batches")
    assert kept == [proto.batch_key(4), proto.batch_key(5), proto.batch_key(6)]
    assert proto.stats.oldest_batch == 4
    assert proto.stats.ids_held == 3


def test_max_unacknowledged_is_respected(env: Env) -> None:
    env.send(*[f"m{i}" for i in range(5)])
    proto = env.protocol(env.source(max_unacknowledged=3))
    assert proto.next_batch(0, 10, WAIT) == 1
    assert proto.read(1).num_rows == 3
    assert proto.next_batch(1, 10, 0.0) == 1  # full: nothing more until an ack
    assert env.broker.states("q") == {"delivered": 3, "ready": 2}
    proto.commit(1)
    assert proto.next_batch(1, 10, WAIT) == 2
    assert proto.read(2).equals(rows("m3", "m4"))


def test_stats(env: Env) -> None:
    env.send("a", "b")
    proto = env.protocol(env.source(), window_batches=7, window_ids=50)
    proto.next_batch(0, 10, WAIT)
    assert proto.stats.as_dict() == {
        "window_batches": 7,
        "window_ids": 50,
        "ids_held": 2,
        "oldest_batch": 1,
        "duplicates_dropped": 0,
        "redeliveries_outside_window": 0,
    }
