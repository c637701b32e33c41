"""The kit's fast layer without a server: the crash point between receive and store
(``ack_source.after_receive``) in both acknowledgement modes, the dying processes the contract
checks play crashes with, the Arrow types and record IDs they read with, and the mutants as
connectors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from epochal.base.fault_plan import DRIVER_POINTS, FaultPlan
from epochal.parts import registry
from epochal.protocols.acking import ID_COLUMN, AckProtocol, MemoryAcks, decode_batch
from epochal.state.store import SnapshotStore
from epochal.testing import contract_checks
from epochal.testing.broker import TestBroker, TestQueueSource
from epochal.testing.contract_checks import acknowledging, common
from epochal.testing.crashing import StepFailedError, run_then_die
from epochal.testing.points import SOURCE_POINTS
from epochal.testing.record_ids import sql_record_ids
from epochal_sdk import Guarantee, Options
from tests.conformance import mutants
from tests.conformance.catalogue import check_problem, plugins_loaded

SCHEMA = pa.schema([("id", pa.string()), ("body", pa.string())])
WAIT = 5.0
POINT = "ack_source.after_receive"


class KilledError(Exception):
    """Stands for the driver dying at a crash point."""


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[TestBroker]:
    broker = TestBroker(str(tmp_path / "queue.sqlite"))
    broker.send("q", [(f"m{i}", f"body {i}") for i in range(5)])
    yield broker
    broker.close()


def _source(broker: TestBroker) -> TestQueueSource:
    """A new consumer session: what earlier ones did not acknowledge is redelivered."""
    source = TestQueueSource(Options("testqueue", {"path": broker.path, "queue": "q"}))
    source.open(max_unacknowledged=100)
    return source


def _killed_at(point: str) -> object:
    def step(reached: str, seq: int) -> None:
        if reached == point:
            raise KilledError(f"{reached}@{seq}")

    return step


def test_the_point_is_a_driver_point_of_the_acknowledging_source_at_both_guarantees() -> None:
    assert POINT in DRIVER_POINTS
    assert FaultPlan.parse(f"{POINT}@2:worker").faults[0].label == f"{POINT}@2:worker"
    for guarantee in (Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE):
        assert SOURCE_POINTS[("acknowledging", guarantee)][0] == POINT


def test_exactly_once_reaches_the_point_after_receiving_before_storing(
    queue: TestBroker, tmp_path: Path
) -> None:
    store = SnapshotStore(str(tmp_path / "store"))
    seen: list[tuple[str, int, bool]] = []

    def step(point: str, seq: int) -> None:
        seen.append((point, seq, store.exists(f"sources/src/batches/{seq:012d}")))

    AckProtocol(store, _source(queue), "src", SCHEMA, step=step).next_batch(0, 10, WAIT)
    assert seen == [(POINT, 1, False), ("ack_source.after_store", 1, True)]


def test_a_driver_killed_there_stores_and_acknowledges_nothing_and_the_next_stores_all_once(
    queue: TestBroker, tmp_path: Path
) -> None:
    store = SnapshotStore(str(tmp_path / "store"))
    first = _source(queue)
    with pytest.raises(KilledError):
        AckProtocol(store, first, "src", SCHEMA, step=_killed_at(POINT)).next_batch(0, 10, WAIT)
    assert store.list("sources/src/batches") == []
    assert queue.states("q") == {"delivered": 5}
    first.close()
    again = AckProtocol(store, _source(queue), "src", SCHEMA)
    assert again.next_batch(0, 10, WAIT) == 1
    stored = decode_batch(store.read(again.batch_key(1))).column(ID_COLUMN).to_pylist()
    assert stored == [f"m{i}" for i in range(5)]
    assert again.commit(1) == 5
    assert queue.states("q") == {"acked": 5}


def test_at_least_once_reaches_the_point_and_a_kill_there_loses_nothing(
    queue: TestBroker,
) -> None:
    seen: list[str] = []
    acks = MemoryAcks(_source(queue), SCHEMA, step=lambda p, s: seen.append(f"{p}@{s}"))
    assert acks.next_batch(0, 10, WAIT) == 1
    assert seen == [f"{POINT}@1"]
    killed = MemoryAcks(_source(queue), SCHEMA, step=_killed_at(POINT))
    with pytest.raises(KilledError):
        killed.next_batch(0, 10, WAIT)
    assert killed.batches(0, 1) == []  # nothing kept: the broker redelivers it all
    after = MemoryAcks(_source(queue), SCHEMA)
    assert after.next_batch(0, 10, WAIT) == 1
    assert after.commit(1) == 5
    assert queue.states("q") == {"acked": 5}


def test_a_dying_process_takes_its_memory_with_it(tmp_path: Path) -> None:
    """A transaction the memory-prepare variant prepared in a dying process is nowhere here;
    the same steps in this process would have left it in the module's dictionary."""
    path = str(tmp_path / "sink.sqlite")
    part = contract_checks.Part.of("mutant-map-memory-prepare", {"path": path, "map": "out"})
    request = {
        "part": part,
        "run": 1,
        "batch": 0,
        "partition": 0,
        "attempt": 0,
        "chunks": [[{"key": "1", "value": "1"}]],
    }
    with plugins_loaded():
        prepared = run_then_die(contract_checks.transaction_step, request)
        assert prepared["transaction_id"].startswith(
            f"ep.{part.job}.{part.incarnation}.{part.part_id}.0.0.1.0"
        )
        assert mutants._IN_MEMORY == {}
        contract_checks.transaction_step(request)  # here, in this process
        assert list(mutants._IN_MEMORY) == [prepared["transaction_id"]]
    mutants._IN_MEMORY.clear()


def test_a_step_that_raises_in_the_dying_process_says_what(tmp_path: Path) -> None:
    part = contract_checks.Part("no-such-connector", {}, "job", "part")
    with pytest.raises(StepFailedError, match="no connector named 'no-such-connector'"):
        run_then_die(contract_checks.receive_step, {"part": part, "run": 1, "capacity": 1})


@pytest.mark.parametrize(
    ("spark", "arrow"),
    [
        ("string", pa.string()),
        ("bigint", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestamp_ntz", pa.timestamp("us")),
        ("decimal(10,2)", pa.decimal128(10, 2)),
        ("map<string,string>", pa.map_(pa.string(), pa.string())),
        (
            "array<struct<a:int,b:binary>>",
            pa.list_(pa.struct([("a", pa.int32()), ("b", pa.binary())])),
        ),
    ],
)
def test_spark_types_become_the_arrow_types_spark_gives(spark: str, arrow: pa.DataType) -> None:
    assert contract_checks.arrow_type(spark) == arrow


def test_an_unknown_type_is_named() -> None:
    with pytest.raises(ValueError, match="'interval'"):
        contract_checks.arrow_type("interval")


def test_record_ids_come_from_the_id_expression() -> None:
    rows = [{"key": b"7", "body": "8"}, {"key": b"9", "body": "10"}]
    assert sql_record_ids("CAST(CAST(key AS STRING) AS BIGINT)", rows) == [7, 9]
    assert sql_record_ids("CAST(`body` AS BIGINT) + 1", rows) == [9, 11]
    with pytest.raises(ValueError, match=r"override SourceUnderTest\.record_ids"):
        sql_record_ids("get_json_object(body, '$.id')", rows)
    with pytest.raises(ValueError, match="not an integer record ID"):
        sql_record_ids("body || 'x'", rows)


def test_every_mutant_is_a_connector_with_its_bug_in_one_sentence() -> None:
    with plugins_loaded():
        found = registry.connectors()
    assert set(mutants.MUTANT_PARTS) <= set(found)
    for name, (contract, _) in mutants.MUTANT_PARTS.items():
        assert found[name].contracts() in (
            ["ReplayableSource"],
            ["AcknowledgingSource"],
            ["TransactionalSink", "IdempotentSink"],
        ), name
        assert contract in ("replayable", "acknowledging", "transactional", "idempotent")
        bug = mutants.bug_of(name)
        assert bug.count(". ") == 0 and bug.endswith(")."), (name, bug)


def test_after_a_death_the_checks_wait_for_redeliveries_that_come_after_the_markers() -> None:
    """A broker requeues a dead consumer's messages asynchronously: they may arrive after the
    records produced after the death (the markers); the checks keep receiving for them."""
    rounds = iter([[10, 11], [], [], [1, 2], [], [3], []])
    received: list[int] = []

    def receive_ids() -> list[int]:
        got = next(rounds, [])
        received.extend(got)
        return got

    acknowledging.receive_after_death(receive_ids, {1, 2, 3}, {10, 11})
    assert sorted(received) == [1, 2, 3, 10, 11]


def test_the_wait_for_redeliveries_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acknowledging, "REQUEUE_WAIT", 0.3)
    calls = 0

    def receive_ids() -> list[int]:
        nonlocal calls
        calls += 1
        return [10] if calls == 1 else []

    started = time.monotonic()
    acknowledging.receive_after_death(receive_ids, {1}, {10})
    assert 0.3 <= time.monotonic() - started < 5


def test_unsettled_is_polled_until_the_broker_settled() -> None:
    answers = iter([["2 message(s) delivered"], ["1 message(s) delivered"], []])
    assert common.poll_until_settled(lambda: next(answers), 5.0) == []
    assert common.poll_until_settled(lambda: ["1 message(s) delivered"], 0.2) == [
        "1 message(s) delivered"
    ]


@pytest.mark.parametrize(
    ("variant", "cause"),
    [
        ("mutant-testqueue-ack-on-receipt", "the source settles on receipt"),
        ("mutant-testqueue-cumulative-ack", "a cumulative acknowledgement"),
    ],
)
def test_ack_settles_those_names_the_likely_cause(
    variant: str, cause: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both bugs lose the messages received and not acknowledged; a probe that receives
    without acknowledging tells acknowledgement on receipt from a cumulative one."""
    monkeypatch.setattr(acknowledging, "REQUEUE_WAIT", 1.0)
    with plugins_loaded():
        problem = check_problem(
            contract_checks.BY_NAME["ack-settles-those"], "acknowledging", variant, str(tmp_path)
        )
    assert problem is not None and cause in problem, problem
    other = {
        "the source settles on receipt": "a cumulative acknowledgement",
        "a cumulative acknowledgement": "the source settles on receipt",
    }[cause]
    assert other not in problem
