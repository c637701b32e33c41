"""The SDK's seams: the connector context, the metrics handle, the id types and the recovery
scope, public option errors, DDL helpers, the data-gone error, one-line registration, and
the deprecated names that keep older connectors working."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import pluggy
import pytest

from epochal.parts import registry
from epochal.protocols.transactions import ScopedSink
from epochal_map import MapConnector
from epochal_sdk import (
    ConfigError,
    Connector,
    ConnectorContext,
    DataGoneError,
    IdempotentSink,
    Offsets,
    Options,
    Prepared,
    RecoveryScope,
    ReplayableSource,
    SnapshotError,
    Split,
    Transaction,
    TransactionalSink,
    TransactionId,
    WriterId,
)
from epochal_sdk import hookspecs as specs
from epochal_sdk.context import Metrics
from epochal_sdk.ids import PrefixParts, RecordId, new_incarnation, transaction_prefix
from epochal_sdk.schema import Field, column_names, parse_ddl, row_of

SCHEMA = (Field("key", "string"), Field("value", "string"))


class Lines(ReplayableSource):
    """A tiny source: one partition of numbered lines."""

    def schema(self) -> str:
        return "n bigint, line string"

    def partitions(self) -> list[str]:
        return ["0"]

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        return dict.fromkeys(partitions, 0)

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        return dict.fromkeys(partitions, 3)

    def read(self, split: Split) -> list[dict[str, object]]:  # type: ignore[override]
        return [{"line": f"l{n}", "n": n} for n in range(split.start, split.end)]


# -- the context --------------------------------------------------------------------------------
def test_a_source_sees_the_context_its_options_carry() -> None:
    context = ConnectorContext(job="j", part_id="lines-1", run=3, query_id="q", batch=7)
    source = Lines(Options("lines", {}, context))
    assert source.context is context
    assert source.context.transaction_prefix == "ep.j.lines-1"
    assert not source.context.in_task
    assert ConnectorContext(partition=0).in_task


def test_outside_a_job_every_object_has_its_own_default_context() -> None:
    first, second = Lines(Options("lines", {})), Lines(Options("lines", {}))
    assert first.context == ConnectorContext()
    first.context.metrics.count("rows")
    assert second.context.metrics.values() == {}


def test_the_context_survives_pickling_with_its_options() -> None:
    context = ConnectorContext(job="j", part_id="p", batch=1, partition=2, attempt=1)
    context.metrics.count("rows", 2)
    copy = pickle.loads(pickle.dumps(Options("x", {"a": "1"}, context)))
    assert copy.context == context
    assert copy.context.metrics.values() == {"rows": 2.0}


# -- metrics ------------------------------------------------------------------------------------
def test_metrics_count_time_and_drain() -> None:
    metrics = Metrics()
    metrics.count("rows_skipped")
    metrics.count("rows_skipped", 4)
    metrics.observe("flush", 0.5)
    with metrics.timer("flush"):
        pass
    values = metrics.drain()
    assert values["rows_skipped"] == 5.0
    assert values["flush_seconds_count"] == 2.0
    assert 0.5 <= values["flush_seconds"] < 1.0
    assert metrics.values() == {}


@pytest.mark.parametrize("bad", ["Rows", "rows-skipped", "1rows", "", "rows skipped"])
def test_metric_names_are_snake_case(bad: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters"):
        Metrics().count(bad)


# -- ids ----------------------------------------------------------------------------------------
def test_transaction_ids_round_trip_and_name_job_and_sink() -> None:
    task = ConnectorContext("job-1", "jdbc-ab12", 5, 2, 1, SCHEMA, run=4)
    txn = TransactionId.parse(str(task.txn))
    assert txn == task.txn == TransactionId("ep.job-1.jdbc-ab12", 5, 2, 4, 1)
    assert (txn.job, txn.sink_id) == ("job-1", "jdbc-ab12")
    assert TransactionId("x.y", 1, 2, 3, 4).job is None


def test_writer_ids_are_stable_across_batches_runs_and_attempts() -> None:
    a = ConnectorContext("j", "kafka-1", 5, 2, 0, SCHEMA, run=1).writer_id
    b = ConnectorContext("j", "kafka-1", 9, 2, 3, SCHEMA, run=7).writer_id
    assert a == b and str(a) == "ep.j.kafka-1.2"
    assert WriterId.parse("ep.j.kafka-1.2", "ep.j.kafka-1") == a
    assert WriterId.parse("ep.j.kafka-12.2", "ep.j.kafka-1") is None
    assert WriterId.parse("ep.j.kafka-1.x", "ep.j.kafka-1") is None


def test_record_ids_keep_the_format_the_jms_sink_always_sent() -> None:
    task = ConnectorContext("j", "jms-1", 5, 2, attempt=3, schema=SCHEMA, run=9)
    assert task.record_id(17) == "j.jms-1.5.2.17" == str(RecordId("j", "jms-1", 5, 2, 17))


def test_an_incarnation_is_in_every_id_and_keeps_successors_apart() -> None:
    old = ConnectorContext("j", "map-1", 5, 2, 0, SCHEMA, run=1, incarnation="abc123")
    new = ConnectorContext("j", "map-1", 5, 2, 0, SCHEMA, run=1, incarnation="abc124")
    assert str(old.txn) == "ep.j.abc123.map-1.5.2.1.0"
    assert str(old.writer_id) == "ep.j.abc123.map-1.2"
    assert old.record_id(7) == "j.abc123.map-1.5.2.7"
    assert (str(old.txn), str(old.writer_id)) != (str(new.txn), str(new.writer_id))
    assert old.record_id(7) != new.record_id(7)
    txn = TransactionId.of(str(old.txn))
    assert (txn.job, txn.incarnation, txn.sink_id) == ("j", "abc123", "map-1")
    legacy = TransactionId.of("ep.j.map-1.5.2.1.0")  # a job recorded without an incarnation
    assert (legacy.job, legacy.incarnation, legacy.sink_id) == ("j", "", "map-1")
    # each prefix matches its own ids only, in both directions
    assert not RecoveryScope(transaction_prefix("j", "map-1")).matches(str(old.txn))
    assert not RecoveryScope(old.transaction_prefix).matches("ep.j.map-1.5.2.1.0")
    assert not RecoveryScope(old.transaction_prefix).matches(str(new.txn))
    assert WriterId.parse(str(old.writer_id), new.transaction_prefix) is None


def test_a_new_incarnation_comes_from_the_creation_time_and_differs_from_the_last() -> None:
    first = new_incarnation(1_800_000_000.123)
    assert first == new_incarnation(1_800_000_000.123) and first.isalnum()
    assert first == first.lower() and len(first) == 8
    assert new_incarnation(1_800_000_000.123, previous=first) != first
    assert new_incarnation(1_800_000_000.124) != first
    assert PrefixParts.parse(transaction_prefix("j", "s", first)) == PrefixParts("j", first, "s")
    assert PrefixParts.parse("ep.j.s") == PrefixParts("j", "", "s")
    assert PrefixParts.parse("ep.j") is None and PrefixParts.parse("xx.j.s") is None


def test_a_recovery_scope_says_what_a_look_up_is_for() -> None:
    prefix = transaction_prefix("j", "s")
    recovery = RecoveryScope(prefix, run=3)
    assert recovery.recovery and recovery.head == "ep.j.s."
    one = RecoveryScope(prefix, "batch", 4, run=3)
    assert not one.recovery and one.head == "ep.j.s.4."
    assert one.matches("ep.j.s.4.0.3.0") and not one.matches("ep.j.s.5.0.3.0")
    assert not recovery.matches("ep.j.s2.4.0.3.0")  # another sink, same start
    assert not RecoveryScope(prefix, "inspect").recovery


class _Sink(TransactionalSink):
    """A transactional sink with in-doubt transactions ``ids``; it notes every scope asked."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(Options("mine"))
        self.ids, self.asked, self.rolled = ids, [], []

    def begin(self, task: ConnectorContext) -> Transaction:
        raise NotImplementedError

    def commit(self, prepared: Prepared) -> None:
        pass

    def rollback(self, prepared: Prepared) -> None:
        self.rolled.append(prepared.transaction_id)

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        self.asked.append(scope)
        return [Prepared(i) for i in self.ids if i.startswith(scope.head)]


def test_the_protocol_side_keeps_the_scope_s_ids_and_counts() -> None:
    sink = _Sink(["ep.j.s.1.0.1.0", "ep.j.s.2.0.1.0", "ep.j.s2.1.0.1.0"])
    scoped = ScopedSink(sink)
    every = RecoveryScope("ep.j.s", "recovery", None, 2)
    one = RecoveryScope("ep.j.s", "batch", 1, 2)
    assert len(scoped.in_doubt(every)) == 2  # not the other sink's, whose prefix starts alike
    assert len(scoped.in_doubt(one)) == 1
    assert sink.asked == [every, one]
    scoped.rollback(Prepared("ep.j.s.2.0.1.0"))
    assert scoped.drain() == {"in_doubt": 3.0, "rolled_back": 1.0}


# -- options, schema, errors ---------------------------------------------------------------------
def test_options_error_names_the_connector_the_option_and_the_fix() -> None:
    options = Options("mine", {"a": "1"})
    error = options.error("a", "is odd", "Give an even number.")
    assert isinstance(error, ConfigError)
    assert str(error) == "mine: option 'a': is odd. Give an even number."


def test_int_with_a_default_is_an_int() -> None:
    options = Options("mine", {"n": "3", "blank": " "})
    assert options.int("n", 1) + 1 == 4
    assert options.int("missing", 10) == 10
    assert options.int("blank", 5) == 5
    assert options.int("missing", None) is None


def test_ddl_to_columns_and_rows() -> None:
    ddl = "id bigint, `odd name` map<string, int> NOT NULL, d decimal(10,2) COMMENT 'a, b'"
    assert parse_ddl(ddl) == (
        Field("id", "bigint"),
        Field("odd name", "map<string,int>", nullable=False),
        Field("d", "decimal(10,2)"),
    )
    assert column_names("key string, value string") == ("key", "value")
    assert row_of({"value": "v", "key": "k"}, ("key", "value", "missing")) == ("k", "v", None)
    assert Lines(Options("lines")).columns() == ("n", "line")
    with pytest.raises(ValueError, match="is not '<name> <type>'"):
        parse_ddl("id")


def test_data_gone_is_a_snapshot_error_with_a_message_that_says_what_to_do() -> None:
    error = DataGoneError("lines", "partition 0, offsets 3..9", "retention", "Restore it.")
    assert isinstance(error, SnapshotError)
    assert str(error) == (
        "lines: the data of partition 0, offsets 3..9 is gone (retention). Restore it."
    )
    assert str(DataGoneError("one ready message")) == "one ready message"


# -- registration -------------------------------------------------------------------------------
class LinesConnector(Connector):
    name = "lines"
    source_class = Lines


def test_a_connector_class_named_by_an_entry_point_registers_itself() -> None:
    manager = pluggy.PluginManager(specs.PROJECT)
    manager.add_hookspecs(specs)
    manager.register(LinesConnector, name="lines")  # what entry_point.load() gives
    manager.register(MapConnector, name="map")
    found = registry.connectors(manager)
    assert found == {"lines": LinesConnector, "map": MapConnector}
    assert LinesConnector.contracts() == ["ReplayableSource"]


def test_idempotent_only_sinks_need_not_know_the_scope() -> None:
    assert not issubclass(IdempotentSink, TransactionalSink)
