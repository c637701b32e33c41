"""The Kafka source and sink against the real broker, without Spark: exact range reads under
read_committed, starting positions, data loss, the transactional protocol (markers, replays,
fencing of lingering transactions, producers kept per worker and replaced when fenced) and
the errors users see."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from epochal_kafka import KafkaSink, KafkaSource
from epochal_kafka.marker import Marker, last_written, read_marker, superseded
from epochal_kafka.producers import PooledProducer, ProducerPool
from epochal_kafka.source import DataLossError, partition_id
from epochal_kafka.testing import produce_ids, read_to_end, unstable_partitions

from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Guarantee,
    Options,
    RecoveryScope,
    RestartableError,
    SchemaMismatchError,
    Split,
)
from epochal_sdk.schema import Field
from integration.harness._process import wait_until
from integration.harness.kafka import KafkaServer

pytestmark = [pytest.mark.integration]

SCHEMA = (Field("key", "string"), Field("value", "string"))


def _source(server: KafkaServer, **options: str) -> KafkaSource:
    return KafkaSource(
        Options("kafka", {"kafka.bootstrap.servers": server.bootstrap_servers, **options})
    )


def _sink(server: KafkaServer, **options: str) -> KafkaSink:
    return KafkaSink(
        Options("kafka", {"kafka.bootstrap.servers": server.bootstrap_servers, **options})
    )


def _values(source: KafkaSource, split: Split) -> list[str]:
    return [v.decode() for b in source.read(split) for v in b.column("value").to_pylist()]


def _task(job: str, batch: int, partition: int = 0, attempt: int = 0) -> ConnectorContext:
    return ConnectorContext(job, "kafka-test", batch, partition, attempt, SCHEMA, run=1)


def _batch(ids: list[int]) -> Any:
    import pyarrow as pa

    text = [str(i) for i in ids]
    return pa.RecordBatch.from_pydict({"key": text, "value": text})


def test_ranges_are_read_exactly_and_skip_aborted_records(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """A range re-reads the same records every time; aborted records and markers are skipped
    (fewer records than end - start) and a read always terminates."""
    topic = make_topic(2)
    produce_ids(kafka_server.bootstrap_servers, topic, list(range(300)), 2)
    source = _source(kafka_server, subscribe=topic)
    source.check()
    parts = source.partitions()
    assert parts == [partition_id(topic, 0), partition_id(topic, 1)]
    start = source.initial_offsets(parts)
    end = source.latest_offsets(parts)
    seen = []
    for split in source.splits(start, end):
        first = _values(source, split)
        assert first == _values(source, split)  # a replay reads the same records
        assert len(first) < split.end - split.start  # aborted records + markers skipped
        seen += first
    assert sorted(map(int, seen)) == list(range(300))
    # limit() never exceeds the read limit, and a range that holds only skipped offsets ends
    limited = source.limit(start, end, 7)
    assert sum(limited[p] - start[p] for p in parts) <= 7
    middle = Split(parts[0], end[parts[0]] - 1, end[parts[0]])  # the last COMMIT marker
    assert _values(source, middle) == []


def test_starting_positions_and_split_of_large_ranges(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """latest, JSON offsets, a timestamp and minPartitions."""
    topic = make_topic(1)
    produce_ids(kafka_server.bootstrap_servers, topic, list(range(100)), 1, aborted=False)
    pid = partition_id(topic, 0)
    latest = _source(kafka_server, subscribe=topic, startingOffsets="latest")
    assert latest.initial_offsets([pid]) == latest.latest_offsets([pid])
    exact = _source(kafka_server, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 40}}}}')
    assert exact.initial_offsets([pid]) == {pid: 40}
    future = _source(kafka_server, subscribe=topic, startingTimestamp=str(2**41))
    assert future.initial_offsets([pid]) == future.latest_offsets([pid])
    past = _source(kafka_server, subscribe=topic, startingTimestamp="0")
    assert past.initial_offsets([pid]) == {pid: 0}
    split = _source(kafka_server, subscribe=topic, minPartitions="4")
    splits = split.splits({pid: 0}, split.latest_offsets([pid]))
    assert len(splits) == 4
    assert sorted(int(v) for s in splits for v in _values(split, s)) == list(range(100))


def test_pattern_subscription_and_new_partitions_start_at_earliest(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """A topic that matches the pattern later is picked up from its earliest offset even when
    the job started at latest."""
    prefix = f"it-pat-{uuid.uuid4().hex[:8]}"
    first = f"{prefix}-a"
    kafka_server.create_topic(first)
    try:
        source = _source(kafka_server, subscribePattern=f"{prefix}-.*", startingOffsets="latest")
        source.check()
        assert source.partitions() == [partition_id(first, 0)]
        second = f"{prefix}-b"
        kafka_server.create_topic(second)
        produce_ids(kafka_server.bootstrap_servers, second, [1, 2, 3], 1, aborted=False)
        new = partition_id(second, 0)
        assert new in source.partitions()
        assert source.initial_offsets([new]) == {new: 0}
    finally:
        kafka_server.delete_topic(first)
        kafka_server.delete_topic(f"{prefix}-b")


def test_data_loss_fails_clearly_or_is_skipped_and_counted(
    kafka_server: KafkaServer, make_topic: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets deleted under the job: a clear error by default; failOnDataLoss=false skips
    them and logs how many."""
    topic = make_topic(1)
    produce_ids(kafka_server.bootstrap_servers, topic, list(range(20)), 1, aborted=False)
    tp = TopicPartition(topic, 0, 10)
    kafka_server.admin().delete_records([tp])[tp].result(30)
    pid = partition_id(topic, 0)
    strict = _source(kafka_server, subscribe=topic)
    end = strict.latest_offsets([pid])
    with pytest.raises(DataLossError, match=r"failOnDataLoss"):
        _values(strict, Split(pid, 0, end[pid]))
    lenient = _source(kafka_server, subscribe=topic, failOnDataLoss="false")
    with caplog.at_level("WARNING", logger="epochal.kafka.source"):
        values = _values(lenient, Split(pid, 0, end[pid]))
    assert [int(v) for v in values] == list(range(10, 20))
    assert "skipping 10 lost record(s)" in caplog.text

    # one task reading two partitions together, one of them with deleted records
    both = make_topic(2)
    produce_ids(kafka_server.bootstrap_servers, both, list(range(40)), 2, aborted=False)
    tp = TopicPartition(both, 1, 6)
    kafka_server.admin().delete_records([tp])[tp].result(30)
    pids = [partition_id(both, 0), partition_id(both, 1)]
    lenient = _source(kafka_server, subscribe=both, failOnDataLoss="false")
    ends = lenient.latest_offsets(pids)
    splits = [Split(p, 0, ends[p]) for p in pids]
    read = [int(v) for b in lenient.read_splits(splits) for v in b.column("value").to_pylist()]
    assert sorted(read) == [i for i in range(40) if i % 2 == 0 or i >= 12]
    with pytest.raises(DataLossError, match=r"failOnDataLoss"):
        list(_source(kafka_server, subscribe=both).read_splits(splits))


def test_bad_options_and_missing_topics_give_clear_errors(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """Missing bootstrap, missing topic, both subscribe options, a bad schema."""
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap\.servers"):
        KafkaSource(Options("kafka", {"subscribe": "x"}))
    with pytest.raises(ConfigError, match="exactly one"):
        _source(kafka_server)
    with pytest.raises(ConfigError, match="do not exist"):
        _source(kafka_server, subscribe=f"missing-{uuid.uuid4().hex}").check()
    with pytest.raises(ConfigError, match="no broker"):
        KafkaSource(
            Options(
                "kafka",
                {
                    "kafka.bootstrap.servers": "127.0.0.1:1",
                    "subscribe": "x",
                    "metadataTimeoutMs": "2000",
                },
            )
        ).check()
    topic = make_topic(1)
    with pytest.raises(SchemaMismatchError, match="'value'"):
        _sink(kafka_server, topic=topic).check((Field("key", "string"),))
    with pytest.raises(SchemaMismatchError, match="'extra'"):
        _sink(kafka_server, topic=topic).check((*SCHEMA, Field("extra", "int")))
    with pytest.raises(ConfigError, match="does not exist"):
        _sink(kafka_server, topic=f"missing-{uuid.uuid4().hex}").check(SCHEMA)
    with pytest.raises(ConfigError, match=r"transaction.max.timeout.ms = 900000"):
        _sink(kafka_server, topic=topic, transactionTimeoutMs="3600000").check(SCHEMA)
    assert _sink(kafka_server, topic=topic, mode="idempotent").max_guarantee() == (
        Guarantee.AT_LEAST_ONCE
    )


def test_transaction_marker_makes_a_replay_write_nothing(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """A batch committed by a task is not written again by a replay (a new attempt or run);
    the next batch is written; a new query (another query id) is not confused by old markers."""
    topic = make_topic(1)
    sink = _sink(kafka_server, topic=topic)
    sink.check(SCHEMA)
    job = f"j{uuid.uuid4().hex[:8]}"
    for attempt in (0, 1):  # attempt 1 replays batch 5 after attempt 0 committed it
        txn = sink.begin(_task(job, 5, attempt=attempt))
        txn.write(_batch([1, 2, 3]))
        data = txn.prepare()
        txn.close()
        assert data["skipped"] is (attempt == 1)
    txn = sink.begin(_task(job, 6))
    txn.write(_batch([4]))
    txn.prepare()
    txn.close()
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["1", "2", "3", "4"]


def test_recovery_fences_a_lingering_transaction_at_once(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """A task killed inside its transaction leaves it open; the runtime's recovery call
    (in_doubt with the job's prefix) aborts it, so read_committed readers go on at once
    instead of waiting for transaction.timeout.ms (10 minutes here)."""
    topic = make_topic(1)
    sink = _sink(kafka_server, topic=topic)
    sink.check(SCHEMA)
    job = f"j{uuid.uuid4().hex[:8]}"
    done = sink.begin(_task(job, 0, partition=0))
    done.write(_batch([1]))
    done.prepare()
    done.close()
    zombie = sink.begin(_task(job, 1, partition=0))
    zombie.write(_batch([2]))
    assert zombie.producer is not None
    zombie.producer.flush(30)  # the record is in the log, the transaction open: a "killed" task
    other = sink.begin(_task(job, 1, partition=1))
    other.write(_batch([3]))
    assert other.producer is not None
    other.producer.flush(30)
    assert unstable_partitions(kafka_server.bootstrap_servers, topic)
    prefix = _task(job, 0).transaction_prefix
    assert sink.in_doubt(RecoveryScope(prefix, "batch", 1)) == []  # per-batch: fences nothing
    assert unstable_partitions(kafka_server.bootstrap_servers, topic)
    assert sink.in_doubt(RecoveryScope(prefix)) == []  # recovery: fences every id
    assert unstable_partitions(kafka_server.bootstrap_servers, topic) == []
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["1"]
    zombie.producer = other.producer = None


def _commit(sink: KafkaSink, task: ConnectorContext, ids: list[int]) -> dict[str, Any]:
    """One task's whole transaction: begin, write, prepare, close."""
    txn = sink.begin(task)
    try:
        if ids:
            txn.write(_batch(ids))
        return txn.prepare()
    finally:
        txn.close()


def _worker(server: KafkaServer, topic: str) -> KafkaSink:
    """A sink with a pool of its own: what another Python worker process would have."""
    sink = _sink(server, topic=topic)
    sink.pool = ProducerPool()
    return sink


def test_a_worker_keeps_its_transactional_producers_across_batches(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """Tasks of one worker that write the same Spark partition use one producer per slot of
    its id (the batch's parity): two init_transactions() for six batches; each batch is
    written once."""
    topic = make_topic(1)
    sink = _worker(kafka_server, topic)
    job = f"j{uuid.uuid4().hex[:8]}"
    reused = [_commit(sink, _task(job, b), [b])["reused"] for b in range(6)]
    assert reused == [False, False, True, True, True, True]
    assert sink.pool.created == 2
    prefix = _task(job, 0).transaction_prefix
    assert sorted(sink.pool.idle()) == [f"{prefix}.0.0", f"{prefix}.0.1"]
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["0", "1", "2", "3", "4", "5"]


def test_two_workers_that_take_turns_keep_their_producers(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """The task of epochal's own source runs in two Python workers that swap the reading and
    the writing from one batch to the next: one writes the even batches, the other the odd
    ones. Each keeps the producer of its slot, so after the first two batches no task makes
    one (with one id per partition every task did: each new producer fenced the other
    worker's)."""
    topic = make_topic(1)
    one, two = _worker(kafka_server, topic), _worker(kafka_server, topic)
    job = f"j{uuid.uuid4().hex[:8]}"
    reused = [_commit((one, two)[b % 2], _task(job, b), [b])["reused"] for b in range(8)]
    assert reused == [False, False, True, True, True, True, True, True]
    assert one.pool.created == two.pool.created == 1
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == [str(b) for b in range(8)]


def test_a_kept_producer_that_was_fenced_is_replaced_before_it_writes(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """Spark partition 0 moves between two workers. A worker whose kept producer was fenced
    since (by the other worker's producer of the same id, or by recovery) replaces it before
    writing a record: no task fails, nothing is written twice, nothing lingers."""
    topic = make_topic(1)
    one, two = _worker(kafka_server, topic), _worker(kafka_server, topic)
    job = f"j{uuid.uuid4().hex[:8]}"
    assert _commit(one, _task(job, 0), [0])["reused"] is False
    assert _commit(two, _task(job, 2), [2])["reused"] is False  # slot 0: fences one's producer
    # The marker names two's producer: one drops its kept producer unused, makes a new one.
    assert _commit(one, _task(job, 4), [4])["reused"] is False
    assert one.pool.created == 2
    # Recovery (another process) fences the id; the marker still names one's producer, so
    # one tries it: send_offsets_to_transaction() is refused (fenced), before any record.
    recovery = _worker(kafka_server, topic)
    prefix = _task(job, 0).transaction_prefix
    assert recovery.fence(prefix) == [f"{prefix}.0.0"]
    assert _commit(one, _task(job, 6), [6])["reused"] is False
    assert one.pool.created == 3
    assert _commit(one, _task(job, 8), [8])["reused"] is True
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["0", "2", "4", "6", "8"]
    assert unstable_partitions(kafka_server.bootstrap_servers, topic) == []


class _BeforeSlots(KafkaSink):
    """The sink as releases before the slots had it: one ``transactional.id`` a partition."""

    def transactional_id(self, task: ConnectorContext) -> str:
        return str(task.writer_id)


def test_a_batch_written_under_the_id_without_a_slot_is_not_written_again(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """A job that an earlier release ran wrote its batches under the partition's id without
    a slot. After the upgrade the batch its driver left undecided is replayed under a slot:
    the old id's marker says it is written, so nothing is written twice; the next batch is
    written; recovery fences the old id too."""
    topic = make_topic(1)
    job = f"j{uuid.uuid4().hex[:8]}"
    settings = {"kafka.bootstrap.servers": kafka_server.bootstrap_servers, "topic": topic}
    before = _BeforeSlots(Options("kafka", settings))
    before.pool = ProducerPool()
    for batch in (0, 1):
        assert _commit(before, _task(job, batch), [batch])["skipped"] is False
    old_id = str(_task(job, 1).writer_id)
    # the driver's restart takes seconds: by then the broker has the marker of batch 1 (it
    # writes a transaction's offsets some milliseconds after the commit returned)
    wait_until(
        lambda: read_marker(before.config, old_id, str(before.marker_topic), 10).written("") == 1,
        30,
        "the marker of batch 1 under the id without a slot",
    )
    after = _worker(kafka_server, topic)
    assert _commit(after, _task(job, 1), [1])["skipped"] is True
    assert _commit(after, _task(job, 2), [2])["skipped"] is False
    prefix = _task(job, 0).transaction_prefix
    assert _worker(kafka_server, topic).fence(prefix) == [f"{prefix}.0", f"{prefix}.0.0"]
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["0", "1", "2"]


def test_a_zombie_attempt_cannot_commit_after_a_newer_attempt_took_over(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """Two attempts of one task in two workers. The newer one's producer fences the older
    one's (and aborts its open transaction) before it looks at the marker; the older one's
    commit then fails restartably and only the newer one's records are visible. A replay
    after a commit writes nothing, in another worker or in the same one."""
    topic = make_topic(1)
    old, new = _worker(kafka_server, topic), _worker(kafka_server, topic)
    job = f"j{uuid.uuid4().hex[:8]}"
    zombie = old.begin(_task(job, 5, attempt=0))
    zombie.write(_batch([50, 51]))
    assert zombie.producer is not None
    zombie.producer.flush(30)  # records in the log, transaction open
    assert _commit(new, _task(job, 5, attempt=1), [50, 51])["skipped"] is False
    with pytest.raises(RestartableError, match="fenced"):
        zombie.prepare()
    zombie.abort()
    zombie.close()
    assert old.pool.idle() == []  # the fenced producer is not kept
    assert _commit(old, _task(job, 5, attempt=2), [50, 51])["skipped"] is True
    assert _commit(new, _task(job, 5, attempt=3), [50, 51])["skipped"] is True
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["50", "51"]


def test_a_kept_producer_that_saw_the_broker_go_away_is_replaced(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """The broker restarts while a worker's producer is idle: the producer reported the lost
    connections (librdkafka's error callback), so the next task makes a new one instead of
    using it (a kept producer can hang in send_offsets_to_transaction after a coordinator
    change), and writes its batch once."""
    kafka_server.require_faults()
    topic = make_topic(1)
    sink = _worker(kafka_server, topic)
    job = f"j{uuid.uuid4().hex[:8]}"
    assert _commit(sink, _task(job, 0), [0])["reused"] is False
    assert _commit(sink, _task(job, 2), [2])["reused"] is True
    kafka_server.stop()
    kafka_server.start()
    assert _commit(sink, _task(job, 4), [4])["reused"] is False
    assert sink.pool.created == 2
    assert _commit(sink, _task(job, 6), [6])["reused"] is True
    values = [m.value().decode() for m in read_to_end(kafka_server.bootstrap_servers, topic)]
    assert values == ["0", "2", "4", "6"]


def test_a_producer_remembers_its_own_commits() -> None:
    """The marker of a commit that just returned may not be readable yet (the broker writes
    the transaction markers after answering): the producer's own last commit counts too.
    Markers of another query do not count; markers without an instance still parse. A kept
    producer is known to be fenced only by a later commit of another instance."""
    held = PooledProducer("ep.j.s.0", ())
    held.committed["q1"] = 7
    stale = Marker.parse(7, "q1;abc")  # batch 6 readable, batch 7 not yet
    assert stale.written("q1") == 6 and stale.instance == "abc"
    assert last_written(stale, held, "q1") == 7
    assert last_written(stale, None, "q1") == 6
    assert last_written(Marker.parse(9, "q0;abc"), held, "q2") == -1
    # A newer batch by another instance: superseded. A lagging marker of its own, or one
    # of another query: not known to be (the kept producer is tried and checked).
    assert superseded(Marker.parse(9, f"q1;{held.instance}x"), held, "q1")
    assert not superseded(Marker.parse(7, "q1;other"), held, "q1")
    assert not superseded(Marker.parse(0, None), held, "q1")
    assert not superseded(Marker.parse(20, "q0;other"), held, "q1")
    old_format = Marker.parse(4, "q1")
    assert (old_format.written("q1"), old_format.instance) == (3, "")
    assert Marker.parse(-1001, None).written("q1") == -1


def test_idempotent_writer_delivers_with_headers_and_topic_column(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """At-least-once mode: per-record topic, key and headers from columns."""
    import pyarrow as pa

    first, second = make_topic(1), make_topic(1)
    sink = _sink(kafka_server, topic=first, mode="idempotent")
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.RecordBatch.from_pydict(
        {
            "key": ["a", None],
            "value": [b"1", b"2"],
            "topic": [None, second],
            "headers": pa.array([[{"key": "h", "value": b"x"}], None], header_type),
        }
    )
    sink.check(
        (
            Field("key", "string"),
            Field("value", "binary"),
            Field("topic", "string"),
            Field("headers", "array<struct<key:string,value:binary>>"),
        )
    )
    writer = sink.open(_task("j", 0))
    writer.write(batch)
    writer.flush()
    writer.close()
    [one] = read_to_end(kafka_server.bootstrap_servers, first)
    [two] = read_to_end(kafka_server.bootstrap_servers, second)
    assert (one.key(), one.value(), one.headers()) == (b"a", b"1", [("h", b"x")])
    assert (two.key(), two.value()) == (None, b"2")


def test_source_yields_headers_as_array_of_structs(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """Headers come back as array<struct<key string, value binary>> (null when none)."""
    topic = make_topic(1)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})
    producer.produce(topic, b"v1", b"k1", headers=[("a", b"1"), ("b", None)])
    producer.produce(topic, b"v2")
    producer.flush(30)
    source = _source(kafka_server, subscribe=topic)
    pid = partition_id(topic, 0)
    [batch] = list(source.read(Split(pid, 0, source.latest_offsets([pid])[pid])))
    rows = batch.to_pylist()
    assert rows[0]["headers"] == [{"key": "a", "value": b"1"}, {"key": "b", "value": None}]
    assert rows[1]["headers"] is None and rows[1]["key"] is None
    assert [r["offset"] for r in rows] == [0, 1]


def test_a_worker_remembers_a_bounded_number_of_retired_markers(
    kafka_server: KafkaServer, make_topic: Any
) -> None:
    """The markers of ids without a slot that a worker has read are kept up to RETIRED_KEPT,
    the oldest forgotten first, however many sinks, partitions and queries it wrote."""
    from epochal_kafka import marker

    sink = _worker(kafka_server, make_topic(1))
    job = f"j{uuid.uuid4().hex[:8]}"
    kept = dict(marker._RETIRED)
    try:
        marker._RETIRED.clear()
        for number in range(marker.RETIRED_KEPT):
            marker._RETIRED[((), f"filler-{number}", "")] = -1
        retired = str(_task(job, 0).writer_id)
        assert marker.retired_written(sink.config, retired, str(sink.marker_topic), 10, "") == -1
        assert len(marker._RETIRED) == marker.RETIRED_KEPT
        assert ((), "filler-0", "") not in marker._RETIRED
        assert ((), f"filler-{marker.RETIRED_KEPT - 1}", "") in marker._RETIRED
    finally:
        marker._RETIRED.clear()
        marker._RETIRED.update(kept)
