"""MapSink: idempotent upserts, two-phase commit, record conversion, schema checks, registration."""

from __future__ import annotations

import datetime as dt
import json
import pickle
from importlib.metadata import entry_points
from pathlib import Path

import pluggy
import pyarrow as pa
import pytest

from epochal_map import MapConnector, MapJournalSource, MapSink, MapStore, MapStoreError
from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Options,
    PoisonRecordError,
    Prepared,
    RecoveryScope,
    SchemaMismatchError,
    hookspecs,
)
from epochal_sdk.schema import Field

SCHEMA = (Field("key", "string"), Field("value", "string"))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "maps.sqlite"


def sink(path: Path, **options: str) -> MapSink:
    return MapSink(Options("map", {"path": str(path), "map": "m", **options}))


def task(batch_id: int = 0, partition: int = 0, attempt: int = 0) -> ConnectorContext:
    return ConnectorContext("job_1", "sink", batch_id, partition, attempt, SCHEMA)


def batch(**columns: list[object]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns)


def entries(path: Path) -> dict[str, str]:
    with MapStore(path) as s:
        return s.entries("m")


def journal_size(path: Path) -> int:
    with MapStore(path) as s:
        return sum(s.journal_end("m", p) for p in s.journal_partitions("m"))


def write_idempotent(s: MapSink, data: pa.RecordBatch, flush: bool = True) -> None:
    writer = s.open(task())
    writer.write(data)
    if flush:
        writer.flush()
    writer.close()


# -- idempotent ---------------------------------------------------------------------------


def test_idempotent_replay_gives_same_entries(path: Path) -> None:
    s = sink(path)
    assert s.sink_mode() == "idempotent"
    assert s.key_columns() == ("key",)
    data = batch(key=["a", "b", "c"], value=["1", "2", "3"])
    write_idempotent(s, data)
    first = entries(path)
    write_idempotent(s, data)
    assert entries(path) == first == {"a": "1", "b": "2", "c": "3"}
    assert journal_size(path) == 6  # a replay duplicates journal events (documented)


def test_unflushed_writes_are_dropped(path: Path) -> None:
    write_idempotent(sink(path), batch(key=["a"], value=["1"]), flush=False)
    assert entries(path) == {}


def test_value_conversion(path: Path) -> None:
    write_idempotent(sink(path), batch(key=[1, 2], value=[10, None]))
    assert entries(path) == {"1": "10", "2": "null"}


def test_value_is_json_of_other_columns(path: Path) -> None:
    when = dt.datetime(2024, 1, 2, 3, 4, 5)
    data = batch(id=["x"], b=[2], a=["s"], at=[when])
    write_idempotent(sink(path, keyColumn="id"), data)
    assert json.loads(entries(path)["x"]) == {"a": "s", "at": str(when), "b": 2}
    assert entries(path)["x"].startswith('{"a": "s", "at"')


def test_null_key_is_a_poison_record_named_by_row(path: Path) -> None:
    writer = sink(path).open(task())
    writer.write(batch(key=["a", "b"], value=["1", "2"]))
    with pytest.raises(PoisonRecordError, match="row 3 of this task has a null 'key'"):
        writer.write(batch(key=["c", None], value=["3", "4"]))


# -- transactional ------------------------------------------------------------------------


def test_prepare_is_invisible_until_commit(path: Path) -> None:
    s = sink(path, mode="transactional")
    assert s.sink_mode() == "transactional"
    txn = s.begin(task())
    txn.write(batch(key=["a", "b"], value=["1", "2"]))
    data = txn.prepare()
    txn.close()
    assert json.loads(json.dumps(data)) == {"path": str(path), "map": "m"}
    assert entries(path) == {}
    assert journal_size(path) == 0
    prepared = Prepared(str(task().txn), data)
    assert s.in_doubt(RecoveryScope(task().transaction_prefix)) == [prepared]
    s.commit(prepared)
    s.commit(prepared)  # idempotent
    assert entries(path) == {"a": "1", "b": "2"}
    assert journal_size(path) == 2
    assert s.in_doubt(RecoveryScope(task().transaction_prefix)) == []


def test_rollback_drops_a_prepared_transaction(path: Path) -> None:
    s = sink(path, mode="transactional")
    txn = s.begin(task(partition=1))
    txn.write(batch(key=["a"], value=["1"]))
    prepared = Prepared(str(task(partition=1).txn), txn.prepare())
    s.rollback(prepared)
    s.rollback(prepared)  # idempotent
    assert s.in_doubt(RecoveryScope(task().transaction_prefix)) == []
    assert entries(path) == {}
    with pytest.raises(MapStoreError, match="rolled back"):
        s.commit(prepared)


def test_abort_drops_and_fences_the_attempt(path: Path) -> None:
    s = sink(path, mode="transactional")
    txn = s.begin(task())
    txn.write(batch(key=["a"], value=["1"]))
    txn.abort()
    with pytest.raises(MapStoreError, match=str(task().txn)):
        txn.prepare()
    assert entries(path) == {}


def test_in_doubt_only_for_this_prefix(path: Path) -> None:
    s = sink(path, mode="transactional")
    other = ConnectorContext("jobX1", "sink", 0, 0, 0, SCHEMA)
    for t in (task(), task(partition=1), other):
        txn = s.begin(t)
        txn.write(batch(key=[str(t.txn)], value=["v"]))
        txn.prepare()
    found = [p.transaction_id for p in s.in_doubt(RecoveryScope(task().transaction_prefix))]
    assert found == [str(task().txn), str(task(partition=1).txn)]


def test_settled_transactions_are_forgotten_after_their_retention(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file keeps the records of settled transactions (which refuse a zombie's late
    prepare) for the newest batches only: their number is bounded however long a job runs;
    a prepared (in-doubt) transaction is never forgotten."""
    import epochal_map.sink as map_sink

    monkeypatch.setattr(map_sink, "KEEP_SETTLED_BATCHES", 30)
    s = sink(path, mode="transactional")
    stranded = s.begin(task(batch_id=1, partition=2))
    stranded.write(batch(key=["x"], value=["1"]))
    stranded.prepare()
    for number in range(200):
        for partition in (0, 1):
            txn = s.begin(task(batch_id=number, partition=partition))
            txn.write(batch(key=[f"{number}-{partition}"], value=["v"]))
            s.commit(Prepared(str(task(number, partition).txn), txn.prepare()))
        with MapStore(path) as store:
            rows = store._query("SELECT count(*) FROM txns")[0][0]
        assert rows <= 2 * (30 + map_sink.PRUNE_EVERY) + 1
    assert len(entries(path)) == 400
    assert [p.transaction_id for p in s.in_doubt(RecoveryScope(task().transaction_prefix))] == [
        str(task(batch_id=1, partition=2).txn)
    ]
    late = s.begin(task(batch_id=195, partition=0))  # a zombie of a recent, settled batch
    late.write(batch(key=["z"], value=["late"]))
    with pytest.raises(MapStoreError, match="already committed"):
        late.prepare()


# -- options and checks -------------------------------------------------------------------


def test_check_missing_key_column(path: Path) -> None:
    with pytest.raises(SchemaMismatchError) as err:
        sink(path, keyColumn="id").check(SCHEMA)
    message = str(err.value)
    assert "'id'" in message and "'m'" in message and "['key', 'value']" in message
    assert "keyColumn" in message


def test_check_missing_explicit_value_column(path: Path) -> None:
    with pytest.raises(SchemaMismatchError, match="'payload' \\(valueColumn\\)"):
        sink(path, valueColumn="payload").check(SCHEMA)
    sink(path).check((Field("key", "string"), Field("n", "int")))  # default: JSON value


def test_check_creates_the_map_for_readers(path: Path) -> None:
    s = sink(path, partitions="2")
    s.check(SCHEMA)
    shipped = pickle.loads(pickle.dumps(s))  # to a task: the open store stays behind
    write_idempotent(shipped, batch(key=["a"], value=["1"]))
    assert entries(path) == {"a": "1"}
    src = MapJournalSource(Options("map", {"path": str(path), "map": "m"}))
    src.check()
    assert src.partitions() == ["0", "1"]


def test_bad_options(path: Path) -> None:
    with pytest.raises(ConfigError, match="'mode'"):
        sink(path, mode="eventually")
    with pytest.raises(ConfigError, match="'partitions'"):
        sink(path, partitions="0")
    with pytest.raises(ConfigError, match="cannot open the SQLite file"):
        sink(path.parent / "missing-dir" / "x.sqlite").check(SCHEMA)


# -- connector and plugin -----------------------------------------------------------------


def test_connector_and_plugin() -> None:
    assert MapConnector.name == "map"
    assert MapConnector.contracts() == [
        "ReplayableSource",
        "TransactionalSink",
        "IdempotentSink",
    ]
    found: list[type] = []
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.register(MapConnector)  # what the entry point gives: the class, its own plugin
    manager.hook.register_connectors(register=found.append)
    assert found == [MapConnector]
    assert [e.value for e in entry_points(group="epochal") if e.name == "map"] == [
        "epochal_map.connector:MapConnector"
    ]
