"""The acknowledging-source protocol in both modes, as the Spark reader drives it (no
SparkSession: the reader's methods are called the way Spark calls them), with the broker
test double (SQLite) and a real snapshot store; and dict rows of a replayable source."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import LongType, StringType, StructField, StructType

from epochal.metrics import recording
from epochal.parts import registry
from epochal.parts.job_context import JobContext
from epochal.protocols.acking import (
    AckProtocol,
    MemoryAcks,
    batch_key,
    decode_batch,
    encode_batch,
    read_batch,
)
from epochal.spark.common import Part
from epochal.spark.sources import AcknowledgingReader, ReplayableReader
from epochal.state.store import SnapshotStore
from epochal.testing.broker import TestBroker, TestQueueSource
from epochal_sdk import Guarantee, Message, Options

SCHEMA = pa.schema([("id", pa.string()), ("body", pa.string())])
SPARK_SCHEMA = StructType([StructField("id", StringType()), StructField("body", StringType())])
WAIT = 5.0


class KilledError(Exception):
    """Stands for the process dying at a crash point."""


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker,plugins.dictrows")
    registry.plugin_manager.cache_clear()
    yield
    registry.plugin_manager.cache_clear()


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[TestBroker]:
    broker = TestBroker(str(tmp_path / "queue.sqlite"))
    yield broker
    broker.close()


def _source(broker: TestBroker) -> TestQueueSource:
    source = TestQueueSource(Options("testqueue", {"path": broker.path, "queue": "q"}))
    source.open(max_unacknowledged=100)
    return source


# -- the protocol, at-least-once ---------------------------------------------------------------
def test_at_least_once_acks_after_the_commit_with_a_fence_check_between_the_crash_points(
    queue: TestBroker,
) -> None:
    queue.send("q", [("m1", "a"), ("m2", "b")])
    seen: list[str] = []
    acks = MemoryAcks(
        _source(queue),
        SCHEMA,
        step=lambda point, seq: seen.append(f"{point}@{seq}"),
        fence=lambda doing: seen.append(f"fence: {doing}"),
    )
    assert acks.next_batch(0, 10, WAIT) == 1
    assert acks.batches(0, 1) == [1]
    assert read_batch(None, "src", 1, acks.payload(1)).to_pylist() == [
        {"id": "m1", "body": "a"},
        {"id": "m2", "body": "b"},
    ]
    assert queue.states("q") == {"delivered": 2}
    assert acks.commit(1) == 2
    assert seen == [
        "ack_source.after_receive@1",
        "ack_source.before_ack@1",
        "fence: acknowledging up to batch 1",
        "ack_source.after_ack@1",
    ]
    assert queue.states("q") == {"acked": 2}
    measured = acks.drain_measured()
    assert measured["records_in"] == 2 and measured["acked"] == 2 and measured["bytes_in"] > 0


def test_at_least_once_with_nothing_to_ack_checks_no_fence(queue: TestBroker) -> None:
    seen: list[str] = []
    acks = MemoryAcks(_source(queue), SCHEMA, step=lambda p, s: seen.append(p), fence=seen.append)
    assert acks.commit(3) == 0
    assert seen == ["ack_source.before_ack"]


def test_at_least_once_a_fenced_driver_acknowledges_nothing(queue: TestBroker) -> None:
    queue.send("q", [("m1", "a")])

    def fenced(doing: str) -> None:
        raise KilledError(doing)

    acks = MemoryAcks(_source(queue), SCHEMA, fence=fenced)
    acks.next_batch(0, 10, WAIT)
    with pytest.raises(KilledError):
        acks.commit(1)
    assert queue.states("q") == {"delivered": 1}


def test_after_a_restart_memory_holds_nothing_and_the_broker_redelivers(
    queue: TestBroker,
) -> None:
    queue.send("q", [("m1", "a")])
    MemoryAcks(_source(queue), SCHEMA).next_batch(0, 10, WAIT)
    again = MemoryAcks(_source(queue), SCHEMA)  # a new session: m1 is redelivered
    assert again.batches(0, 1) == []  # the replay of batch 1 reads nothing
    assert again.next_batch(1, 10, WAIT) == 2
    assert read_batch(None, "src", 2, again.payload(2)).column("id").to_pylist() == ["m1"]


# -- the protocol, exactly-once: what it measured -----------------------------------------------
def test_exactly_once_measures_records_bytes_drops_and_acks(
    queue: TestBroker, tmp_path: Path
) -> None:
    store = SnapshotStore(str(tmp_path / "store"))
    queue.send("q", [("m1", "a"), ("m2", "b")])
    first = AckProtocol(store, _source(queue), "src", SCHEMA)
    assert first.next_batch(0, 10, WAIT) == 1
    again = AckProtocol(store, _source(queue), "src", SCHEMA)  # restarted: m1, m2 redelivered
    queue.send("q", [("m3", "c")])
    assert again.next_batch(1, 10, WAIT) == 2
    assert read_batch(store, "src", 2).column("id").to_pylist() == ["m3"]
    assert again.commit(2) == 5  # batches 1 and 2, and the two dropped redeliveries
    assert queue.states("q") == {"acked": 3}
    measured = again.drain_measured()
    assert measured["records_in"] == 1 and measured["dedupe_dropped"] == 2
    assert measured["acked"] == 5 and measured["store_seconds_count"] == 1
    assert store.exists(batch_key("src", 2))
    assert again.drain_measured() == {}


def test_stored_rows_may_be_dicts_by_column_name() -> None:
    data = encode_batch(
        [Message("m1", {"body": "a", "id": "m1"}), Message("m2", ("m2", "b"))], SCHEMA
    )
    assert decode_batch(data).drop_columns(["__epochal_message_id"]).to_pylist() == [
        {"id": "m1", "body": "a"},
        {"id": "m2", "body": "b"},
    ]


# -- the reader, as Spark calls it ------------------------------------------------------------
def _part(connector: str, options: dict[str, str], job_dir: Path, guarantee: Guarantee) -> Part:
    context = JobContext(job="j", job_dir=str(job_dir), guarantee=guarantee)
    return Part(connector, options, f"{connector}-test", context, guarantee)


@pytest.mark.parametrize("guarantee", [Guarantee.AT_LEAST_ONCE, Guarantee.EXACTLY_ONCE])
def test_the_ack_reader_plans_reads_and_acknowledges_in_either_mode(
    plugins: None, queue: TestBroker, tmp_path: Path, guarantee: Guarantee
) -> None:
    queue.send("q", [(f"m{i}", f"b{i}") for i in range(5)])
    options = {"path": queue.path, "queue": "q", "receiveTimeoutMs": "2000"}
    reader = AcknowledgingReader(_part("testqueue", options, tmp_path, guarantee), SPARK_SCHEMA)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(3))
    assert end["seq"] == 1
    rows = [r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()]
    assert [r["id"] for r in rows] == ["m0", "m1", "m2"]
    assert queue.states("q") == {"delivered": 3, "ready": 2}
    reader.commit(end)
    assert queue.states("q") == {"acked": 3, "ready": 2}
    reader.stop()
    state = recording.collect(str(tmp_path), 0, None, job_created=1.0)
    totals = state["parts"]["source-testqueue-test"]["totals"]
    assert totals["records_in"] == 3 and totals["acked"] == 3


def test_without_admission_control_the_ack_reader_goes_on_from_its_last_batch(
    plugins: None, queue: TestBroker, tmp_path: Path
) -> None:
    """pyspark before 4.2 calls ``latestOffset()`` without a start or a limit: each batch
    starts where the last one this reader planned ended and holds ``maxRecordsPerBatch``
    messages at most."""
    queue.send("q", [(f"m{i}", f"b{i}") for i in range(5)])
    options = {"path": queue.path, "queue": "q", "receiveTimeoutMs": "2000"}
    options["maxRecordsPerBatch"] = "3"
    part = _part("testqueue", options, tmp_path, Guarantee.EXACTLY_ONCE)
    reader = AcknowledgingReader(part, SPARK_SCHEMA)
    start = reader.initialOffset()
    first = reader.latestOffset()
    assert first["seq"] == 1
    rows = [
        r for p in reader.partitions(start, first) for b in reader.read(p) for r in b.to_pylist()
    ]
    assert [r["id"] for r in rows] == ["m0", "m1", "m2"]
    second = reader.latestOffset()
    assert second["seq"] == 2
    rows = [
        r for p in reader.partitions(first, second) for b in reader.read(p) for r in b.to_pylist()
    ]
    assert [r["id"] for r in rows] == ["m3", "m4"]
    reader.stop()


def test_a_replayable_source_may_yield_dict_rows(plugins: None, tmp_path: Path) -> None:
    schema = StructType([StructField("label", StringType()), StructField("i", LongType())])
    part = _part("dictrows", {"size": "4"}, tmp_path, Guarantee.EXACTLY_ONCE)
    reader = ReplayableReader(part, schema)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = [row for p in reader.partitions(start, end) for row in reader.read(p)]
    assert rows == [("r0", 0), ("r1", 1), ("r2", 2), ("r3", 3)]
    state = recording.collect(str(tmp_path), 0, None, job_created=1.0)
    totals = state["parts"]["source-dictrows-test"]["totals"]
    assert totals["records_in"] == 4 and totals["connector.rows_made"] == 4
    assert totals["plan_seconds_count"] == 1 and totals["read_seconds_count"] == 1
    json.dumps(state)  # the state is plain JSON
