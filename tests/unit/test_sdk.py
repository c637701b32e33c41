"""The SDK contracts: guarantees, options, task context, connector metadata, source defaults."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from epochal_map import MapConnector
from epochal_sdk import (
    AcknowledgingSource,
    ConfigError,
    Connector,
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    Offsets,
    Options,
    ReplayableSource,
    Split,
    TransactionalSink,
)
from epochal_sdk.guarantees import weakest
from epochal_sdk.ids import batch_of, transaction_prefix
from epochal_sdk.schema import Field

# -- Guarantee ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("exactly-once", Guarantee.EXACTLY_ONCE),
        ("EXACTLY_ONCE", Guarantee.EXACTLY_ONCE),
        ("exactly once", Guarantee.EXACTLY_ONCE),
        ("  at-least-once ", Guarantee.AT_LEAST_ONCE),
        ("at_least_once", Guarantee.AT_LEAST_ONCE),
        ("AT_LEAST_ONCE", Guarantee.AT_LEAST_ONCE),
        ("none", Guarantee.NONE),
        ("NONE", Guarantee.NONE),
        (Guarantee.AT_LEAST_ONCE, Guarantee.AT_LEAST_ONCE),
    ],
)
def test_guarantee_parse(text: str | Guarantee, expected: Guarantee) -> None:
    assert Guarantee.parse(text) is expected


@pytest.mark.parametrize("bad", ["exactly-twice", "", "2", "at-most-once"])
def test_guarantee_parse_bad_value_lists_the_choices(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        Guarantee.parse(bad)
    message = str(info.value)
    assert repr(bad) in message
    assert message.endswith("use one of: none, at-least-once, exactly-once")


def test_guarantee_labels_round_trip() -> None:
    assert [g.label for g in Guarantee] == ["none", "at-least-once", "exactly-once"]
    for g in Guarantee:
        assert Guarantee.parse(g.label) is g
        assert Guarantee.parse(g.name) is g


def test_guarantee_ordering_and_weakest() -> None:
    assert Guarantee.NONE < Guarantee.AT_LEAST_ONCE < Guarantee.EXACTLY_ONCE
    assert weakest([Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE]) is Guarantee.AT_LEAST_ONCE
    assert weakest([Guarantee.EXACTLY_ONCE, Guarantee.NONE, Guarantee.AT_LEAST_ONCE]) is (
        Guarantee.NONE
    )
    assert weakest([Guarantee.EXACTLY_ONCE]) is Guarantee.EXACTLY_ONCE
    assert weakest(iter([Guarantee.AT_LEAST_ONCE])) is Guarantee.AT_LEAST_ONCE
    # an empty pipeline promises everything
    assert weakest([]) is Guarantee.EXACTLY_ONCE


# -- Options --------------------------------------------------------------------------------


def opts(**values: str) -> Options:
    return Options("kafka", values)


def assert_config_error(info: pytest.ExceptionInfo[ConfigError], option: str, *parts: str) -> None:
    err = info.value
    assert err.connector == "kafka"
    assert err.option == option
    message = str(err)
    assert message.startswith(f"kafka: option {option!r}: ")
    for part in parts:
        assert part in message, (part, message)
    assert err.fix and err.fix in message


def test_options_are_case_insensitive_read_only_mapping() -> None:
    o = Options("kafka", {"Topic": "t", "maxRecordsPerBatch": 7})
    assert o["topic"] == "t"
    assert o["TOPIC"] == "t"
    assert o["maxrecordsperbatch"] == "7"  # values become strings
    assert set(o) == {"topic", "maxrecordsperbatch"}
    assert len(o) == 2
    assert "kafka" in repr(o)
    with pytest.raises(KeyError):
        o["missing"]
    assert Options("x").connector == "x"
    assert len(Options("x")) == 0


def test_required() -> None:
    assert opts(Topic=" orders ").required("topic") == "orders"
    with pytest.raises(ConfigError) as info:
        opts().required("topic")
    assert_config_error(info, "topic", "is required", "Set .option('topic', ...).")
    with pytest.raises(ConfigError) as info:
        opts(topic="   ").required("topic", hint="Name the topic to read.")
    assert_config_error(info, "topic", "is required", "Name the topic to read.")


def test_str() -> None:
    assert opts(group="g1").str("GROUP", "d") == "g1"
    assert opts().str("group", "d") == "d"


def test_int() -> None:
    assert opts(n="42").int("n", None) == 42
    assert opts(n=" -3 ").int("n", 0) == -3
    assert opts().int("n", 5) == 5
    assert opts().int("n", None) is None
    assert opts(n="  ").int("n", 9) == 9
    assert opts(n="1").int("n", None, minimum=1) == 1
    with pytest.raises(ConfigError) as info:
        opts(n="4.5").int("n", 1)
    assert_config_error(info, "n", "'4.5' is not an integer", "Give a whole number.")
    with pytest.raises(ConfigError) as info:
        opts(n="0").int("n", 1, minimum=1)
    assert_config_error(info, "n", "0 is below 1", "Give 1 or more.")


def test_float() -> None:
    assert opts(x="2.5").float("x", 0.0) == 2.5
    assert opts(x="3").float("x", 0.0) == 3.0
    assert opts().float("x", 1.5) == 1.5
    assert opts(x="").float("x", 1.5) == 1.5
    with pytest.raises(ConfigError) as info:
        opts(x="fast").float("x", 1.0)
    assert_config_error(info, "x", "'fast' is not a number", "Give a number.")
    with pytest.raises(ConfigError) as info:
        opts(x="0.05").float("x", 1.0, minimum=0.1)
    assert_config_error(info, "x", "0.05 is below 0.1", "Give 0.1 or more.")


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", "On", " true "])
def test_bool_true(text: str) -> None:
    assert opts(flag=text).bool("flag", False) is True


@pytest.mark.parametrize("text", ["false", "False", "0", "no", "OFF"])
def test_bool_false(text: str) -> None:
    assert opts(flag=text).bool("flag", True) is False


def test_bool_default_and_error() -> None:
    assert opts().bool("flag", True) is True
    assert opts(flag="").bool("flag", False) is False
    with pytest.raises(ConfigError) as info:
        opts(flag="maybe").bool("flag", False)
    assert_config_error(info, "flag", "'maybe' is not a boolean", "Use true or false.")


def test_choice() -> None:
    choices = ("idempotent", "transactional")
    assert opts(mode="Transactional").choice("mode", "idempotent", choices) == "transactional"
    assert opts().choice("mode", "idempotent", choices) == "idempotent"
    with pytest.raises(ConfigError) as info:
        opts(mode="magic").choice("mode", "idempotent", choices)
    assert_config_error(
        info, "mode", "'magic' is not allowed", "Use one of: idempotent, transactional."
    )


# -- ConnectorContext ----------------------------------------------------------------------------

SCHEMA = (Field("key", "string"), Field("value", "string", nullable=False))


@pytest.mark.parametrize("job", ["orders", "my-job", "my_job", "a-b_c-1", "x"])
@pytest.mark.parametrize("batch", [0, 7, 123456789])
def test_transaction_id_round_trip(job: str, batch: int) -> None:
    task = ConnectorContext(job, "map-0123456789", batch, 3, 2, SCHEMA, run=1700000000)
    assert (
        task.transaction_prefix
        == f"ep.{job}.map-0123456789"
        == transaction_prefix(job, "map-0123456789")
    )
    assert str(task.txn) == f"ep.{job}.map-0123456789.{batch}.3.1700000000.2"
    assert str(task.txn).startswith(task.transaction_prefix + ".")
    assert batch_of(str(task.txn)) == batch


def test_transaction_ids_differ_per_attempt_partition_and_run() -> None:
    base = ConnectorContext("j", "s", 5, 0, 0, SCHEMA)
    assert base.run == 0
    others = [
        ConnectorContext("j", "s", 5, 1, 0, SCHEMA),
        ConnectorContext("j", "s", 5, 0, 1, SCHEMA),
        ConnectorContext("j", "s", 5, 0, 0, SCHEMA, run=1),
        ConnectorContext("j", "s", 6, 0, 0, SCHEMA),
    ]
    ids = {str(base.txn)} | {str(t.txn) for t in others}
    assert len(ids) == 5
    # the same step gives the same id (stable, never random)
    assert str(ConnectorContext("j", "s", 5, 0, 0, SCHEMA).txn) == str(base.txn)


# -- Connector ------------------------------------------------------------------------------


class _Queue(AcknowledgingSource):
    MAX_GUARANTEE = Guarantee.AT_LEAST_ONCE

    def schema(self) -> str:
        return "id string"

    def open(self, max_unacknowledged: int) -> None:
        pass

    def receive(self, max_messages: int, timeout: float) -> list:
        return []

    def acknowledge(self, ids: Sequence[str]) -> None:
        pass


class _SourceOnly(Connector):
    name = "queue"
    source_class = _Queue


class _Nothing(Connector):
    name = "nothing"


def test_contracts_and_guarantees_of_the_map_connector() -> None:
    assert MapConnector.contracts() == ["ReplayableSource", "TransactionalSink", "IdempotentSink"]
    assert MapConnector.guarantees() == {
        "source": Guarantee.EXACTLY_ONCE,
        "sink": Guarantee.EXACTLY_ONCE,
    }
    assert issubclass(MapConnector.sink_class, TransactionalSink)
    assert issubclass(MapConnector.sink_class, IdempotentSink)


def test_contracts_of_a_source_only_connector() -> None:
    assert _SourceOnly.contracts() == ["AcknowledgingSource"]
    assert _SourceOnly.guarantees() == {"source": Guarantee.AT_LEAST_ONCE}
    assert isinstance(_SourceOnly().source(Options("queue")), _Queue)
    with pytest.raises(TypeError, match="connector 'queue' has no sink"):
        _SourceOnly().sink(Options("queue"))
    assert _Nothing.contracts() == []
    assert _Nothing.guarantees() == {}
    with pytest.raises(TypeError, match="connector 'nothing' has no source"):
        _Nothing().source(Options("nothing"))


# -- ReplayableSource defaults --------------------------------------------------------------


class Counter(ReplayableSource):
    """Integer offsets that count records; partitions and ends are given."""

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options or Options("counter"))

    def schema(self) -> str:
        return "n bigint"

    def partitions(self) -> list[str]:
        return []

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        return {p: 0 for p in partitions}

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        return {}

    def read(self, split: Split):
        yield from ((n,) for n in range(split.start, split.end))


def taken(start: Offsets, end: Offsets) -> dict[str, int]:
    return {p: end[p] - start.get(p, end[p]) for p in end}


def test_limit_shares_evenly() -> None:
    start = {"a": 0, "b": 10, "c": 100}
    latest = {"a": 50, "b": 60, "c": 150}
    end = Counter().limit(start, latest, 30)
    assert taken(start, end) == {"a": 10, "b": 10, "c": 10}
    end = Counter().limit(start, latest, 31)
    assert sorted(taken(start, end).values()) == [10, 10, 11]
    assert sum(taken(start, end).values()) == 31


def test_limit_gives_the_share_of_small_partitions_to_the_others() -> None:
    start = {"a": 0, "b": 0, "c": 0}
    latest = {"a": 2, "b": 100, "c": 100}
    end = Counter().limit(start, latest, 30)
    assert taken(start, end) == {"a": 2, "b": 14, "c": 14}


def test_limit_never_exceeds_max_nor_latest() -> None:
    for max_records in (1, 2, 3, 7, 10, 99, 1000):
        start = {"0": 5, "1": 0, "2": 3, "3": 9}
        latest = {"0": 8, "1": 40, "2": 3, "3": 10}
        end = Counter().limit(start, latest, max_records)
        got = taken(start, end)
        assert sum(got.values()) == min(max_records, 3 + 40 + 0 + 1), max_records
        for p in latest:
            assert start[p] <= end[p] <= latest[p]


def test_limit_with_less_data_than_the_limit_reaches_latest() -> None:
    start = {"0": 0, "1": 4}
    latest = {"0": 3, "1": 6}
    assert Counter().limit(start, latest, 100) == latest


def test_limit_leaves_partitions_without_data_where_they_are() -> None:
    start = {"0": 7, "1": 0}
    latest = {"0": 7, "1": 20}
    end = Counter().limit(start, latest, 5)
    assert end == {"0": 7, "1": 5}
    assert Counter().limit({"0": 4}, {"0": 4}, 10) == {"0": 4}
    assert Counter().limit({"0": 0, "1": 0}, {"0": 9, "1": 9}, 0) == {"0": 0, "1": 0}


def test_max_records_per_batch_option() -> None:
    assert Counter().max_records_per_batch() is None
    assert Counter(Options("c", {"maxRecordsPerBatch": "25"})).max_records_per_batch() == 25
    with pytest.raises(ConfigError, match="maxRecordsPerBatch"):
        Counter(Options("c", {"maxRecordsPerBatch": "0"})).max_records_per_batch()


def test_splits_one_per_partition_with_data() -> None:
    start = {"b": 3, "a": 0, "c": 5}
    end = {"b": 9, "a": 2, "c": 5}
    assert Counter().splits(start, end) == [Split("a", 0, 2), Split("b", 3, 9)]
    assert Counter().splits(end, end) == []


def test_splits_skip_a_partition_that_joins_in_this_batch() -> None:
    # The runtime ends a newly discovered partition at its initial offset in the batch that
    # discovers it (so a replay plans the same), and reads it from the next batch on.
    source = Counter()
    start = {"0": 3}
    end = {"0": 5, "1": 0}
    assert source.splits(start, end) == [Split("0", 3, 5)]
    assert source.splits(end, {"0": 5, "1": 4}) == [Split("1", 0, 4)]


# -- which sink contract the runtime drives ------------------------------------------------


class _TwoPhaseOnly(TransactionalSink):
    def begin(self, task: ConnectorContext) -> Any:
        raise NotImplementedError

    def commit(self, prepared: Any) -> None: ...

    def rollback(self, prepared: Any) -> None: ...

    def in_doubt(self, prefix: str) -> list[Any]:
        return []


class _UpsertOnly(IdempotentSink):
    def key_columns(self) -> tuple[str, ...]:
        return ("id",)

    def open(self, task: ConnectorContext) -> Any:
        raise NotImplementedError


class _Both(_TwoPhaseOnly, _UpsertOnly):
    pass


def test_the_default_sink_mode_is_the_contract_a_sink_implements() -> None:
    options = Options({})
    assert _TwoPhaseOnly(options).sink_mode() == "transactional"
    assert _UpsertOnly(options).sink_mode() == "idempotent"
    assert _Both(options).sink_mode() == "idempotent"  # both: override to choose
    assert _TwoPhaseOnly(options).guarantee_reason() == ""
