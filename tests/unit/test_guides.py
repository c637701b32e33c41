"""The connectors of docs/authors/guides, as the pages show them, driven in-process through the
runtime's own protocols (no Spark): the code blocks marked ``# file: <path>`` are written
out as a package and imported, so the guides cannot drift from what is tested here.

Each contract gets the crashes that matter to it, simulated by dropping an object and
building a new one (a new process has nothing in memory): a replayable source reads a split
twice; an acknowledging source is dropped between receive and store, and before an
acknowledgement, and its messages must come back; a transactional sink's prepared
transaction is found by a new sink object, committed twice, rolled back, recovered; an
idempotent sink gets a batch twice. ``tests/quickstart/test_outside_connector.py`` installs
the same package in a fresh virtual environment and crash-tests it on Spark with the kit.
"""

from __future__ import annotations

import importlib
import json
import re
import sqlite3
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest

from epochal.protocols.acking import ID_COLUMN, AckProtocol, MemoryAcks, decode_batch
from epochal.protocols.keys import KeyDigest, KeyStabilityError, check_and_record
from epochal.protocols.transactions import two_phase_commit
from epochal.state.store import SnapshotStore
from epochal_sdk import (
    AcknowledgingSource,
    Connector,
    ConnectorContext,
    DataGoneError,
    EpochalError,
    IdempotentSink,
    Options,
    PoisonRecordError,
    Prepared,
    RecoveryScope,
    ReplayableSource,
    Split,
    TransactionalSink,
)
from epochal_sdk.ids import transaction_prefix
from epochal_sdk.schema import Field

GUIDES = Path(__file__).resolve().parents[2] / "docs" / "authors" / "guides"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ROWS = pa.schema([("id", pa.int64()), ("text", pa.string())])
KV = (Field("key", "string"), Field("value", "string"))
KV_ARROW = pa.schema([("key", pa.string()), ("value", pa.string())])
WAIT = 5.0  # seconds to wait for messages that are there (returned at once when they are)


def guide_files() -> dict[str, str]:
    """Every file the guides show: code blocks whose first line is ``# file: <path>``."""
    files: dict[str, str] = {}
    for page in sorted(GUIDES.glob("*.md")):
        for _, body in FENCE.findall(page.read_text()):
            first = body.partition("\n")[0]
            if first.startswith("# file: "):
                name = first.removeprefix("# file: ").strip()
                assert name not in files, f"{name} is shown twice in docs/authors/guides"
                files[name] = body
    return files


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The guides' package, written out and importable (``epochal_examples``)."""
    root = tmp_path_factory.mktemp("epochal-examples")
    for name, body in guide_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.split(".")[0] == "epochal_examples"]:
        del sys.modules[name]


def example(package: Path, name: str) -> ModuleType:
    return importlib.import_module(f"epochal_examples.{name}")


def context(part_id: str, **task: Any) -> ConnectorContext:
    return ConnectorContext("guides", part_id, run=task.pop("run", 1), **task)


def options(connector: str, part_id: str = "part-1", **values: str) -> Options:
    return Options(connector, values, context(part_id))


# -- the package --------------------------------------------------------------------------------
def test_the_package_registers_one_connector_per_guide(package: Path) -> None:
    project = tomllib.loads((package / "pyproject.toml").read_text())
    points = project["project"]["entry-points"]["epochal"]
    contracts = {
        "lines": ReplayableSource,
        "brokerqueue": AcknowledgingSource,
        "logstream": AcknowledgingSource,
        "jsonfiles": TransactionalSink,
        "upsert": IdempotentSink,
    }
    assert set(points) == set(contracts), points
    for name, target in points.items():
        module, _, attribute = target.partition(":")
        connector = getattr(importlib.import_module(module), attribute)
        assert issubclass(connector, Connector) and connector.name == name
        part = connector.source_class or connector.sink_class
        assert part is not None and issubclass(part, contracts[name]), (name, part)
    for listed in project["tool"]["setuptools"]["packages"]:
        assert (package / listed / "__init__.py").exists(), listed
    assert project["project"]["dependencies"] == ["epochal-sdk"]


def test_the_pyspark_package_names_the_format(package: Path) -> None:
    from epochal.spark.datasource import EpochalDataSource

    module = importlib.import_module("pyspark_epochal_lines")
    assert issubclass(module.DefaultSource, EpochalDataSource)
    assert module.DefaultSource.name() == "epochal.lines"
    sys.modules.pop("pyspark_epochal_lines")


def test_the_run_command_picks_one_case_per_contract() -> None:
    text = (GUIDES / "README.md").read_text()
    run = text.split("## Run it", 1)[1]
    block = next(body for lang, body in FENCE.findall(run) if lang == "sh")
    selection = block.split('-k "', 1)[1].split('"', 1)[0]
    for suite in ("TestLinesSource", "TestLogStreamSource", "TestJsonFilesSink", "TestUpsertSink"):
        assert suite in selection, selection


# -- a replayable source --------------------------------------------------------------------------
def test_lines_reads_a_split_the_same_every_time(package: Path, tmp_path: Path) -> None:
    lines = example(package, "lines")
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / "a.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "a{i}"}}\n' for i in range(5))
    )
    (directory / "b.jsonl").write_text('{"id": 10, "text": "b"}\n{"id": 11, "te')  # mid-line
    source = lines.LinesSource(options("lines", directory=str(directory)))
    source.check()
    partitions = source.partitions()
    assert partitions == ["a.jsonl", "b.jsonl"]
    start = source.initial_offsets(partitions)
    latest = source.latest_offsets(partitions)
    assert latest == {"a.jsonl": 5, "b.jsonl": 1}  # whole lines only
    end = source.limit(start, latest, 4)
    splits = source.splits(start, end)
    assert sum(s.end - s.start for s in splits) == 4
    for split in splits:  # a task, and its retry or a replay: a new object each time
        first = list(lines.LinesSource(options("lines", directory=str(directory))).read(split))
        again = list(lines.LinesSource(options("lines", directory=str(directory))).read(split))
        assert first == again and len(first) == split.end - split.start
    with open(directory / "b.jsonl", "a") as fh:  # the line is finished: read next batch
        fh.write('xt": "b"}\n')
    assert source.latest_offsets(partitions)["b.jsonl"] == 2
    (directory / "a.jsonl").write_text('{"id": 0, "text": "a0"}\n')  # truncated
    with pytest.raises(DataGoneError, match=r"lines 0\.\.4"):
        list(source.read(Split("a.jsonl", 0, 5)))


# -- acknowledging sources ------------------------------------------------------------------------
class Queue:
    """One of the guides' acknowledging sources with its stand-in system, the job's
    snapshot store, and a new source object (a new process) whenever asked."""

    def __init__(self, package: Path, tmp_path: Path, kind: str, source_class: Any = None) -> None:
        self.kind = kind
        self.path = str(tmp_path / f"{kind}.sqlite")
        self.store = SnapshotStore(str(tmp_path / "job" / "store"))
        self.module = example(package, kind)
        self.source_class = source_class or (
            self.module.BrokerQueueSource if kind == "brokerqueue" else self.module.LogStreamSource
        )
        self.extra: dict[str, str] = {}

    def send(self, ids: range) -> None:
        if self.kind == "brokerqueue":
            broker = example(Path(), "minibroker").Broker(self.path)
            broker.send("orders", [(str(i), f"order {i}") for i in ids])
            broker.close()
            return
        client = example(Path(), "ministreams").Streams(self.path)
        for i in ids:
            client.xadd("events", {"id": str(i), "text": f"event {i}"})
        client.close()

    def source(self, part_id: str = "queue-1") -> Any:
        """A new object in a new process: opened as the runtime opens it."""
        values = {"path": self.path, "queue": "orders", "stream": "events", **self.extra}
        source = self.source_class(options(self.kind, part_id, **values))
        source.check()
        source.open(max_unacknowledged=100)
        return source

    def protocol(self, source: Any) -> AckProtocol:
        return AckProtocol(self.store, source, "queue-1", ROWS)

    def stored_ids(self) -> list[str]:
        ids = []
        for key in self.store.list("sources/queue-1/batches"):
            ids += decode_batch(self.store.read(key)).column(ID_COLUMN).to_pylist()
        return ids

    def unsettled(self) -> dict[str, int]:
        if self.kind == "brokerqueue":
            broker = example(Path(), "minibroker").Broker(self.path)
            left = {s: broker.count("orders", s) for s in ("ready", "delivered")}
            broker.close()
            return {k: v for k, v in left.items() if v}
        client = example(Path(), "ministreams").Streams(self.path)
        groups = client.xinfo_groups("events")
        client.close()
        return {k: g[k] for g in groups for k in ("pending", "lag") if g[k]}


def drain(queue: Queue, source: Any, protocol: AckProtocol, seq: int) -> int:
    """Plan, store and acknowledge batches until nothing new arrives."""
    while True:
        end = protocol.next_batch(seq, 4, 0.2)
        if end == seq:
            return seq
        protocol.commit(end)
        seq = end


@pytest.mark.parametrize("kind", ["brokerqueue", "logstream"])
def test_a_crash_between_receive_and_store_loses_nothing(
    package: Path, tmp_path: Path, kind: str
) -> None:
    queue = Queue(package, tmp_path, kind)
    queue.send(range(1, 8))
    first = queue.source()
    received = first.receive(3, WAIT)
    assert [m.id for m in received] and not any(m.redelivered for m in received)
    # the source runner dies here: nothing stored, nothing acknowledged, no close()
    second = queue.source()
    protocol = queue.protocol(second)
    drain(queue, second, protocol, 0)
    ids = queue.stored_ids()
    assert len(ids) == len(set(ids)) == 7, ids
    assert queue.unsettled() == {}, "messages left unacknowledged"


@pytest.mark.parametrize("kind", ["brokerqueue", "logstream"])
def test_a_crash_before_the_acknowledgement_loses_and_duplicates_nothing(
    package: Path, tmp_path: Path, kind: str
) -> None:
    queue = Queue(package, tmp_path, kind)
    queue.send(range(1, 8))
    first = queue.source()
    assert queue.protocol(first).next_batch(0, 4, WAIT) == 1  # stored, then the crash
    second = queue.source()
    protocol = queue.protocol(second)  # rebuilt from the store
    assert protocol.next_batch(0, 4, WAIT) == 1  # the stored batch is planned again
    protocol.commit(1)  # acknowledged by a new object: an ID it never received
    drain(queue, second, protocol, 1)
    ids = queue.stored_ids()
    assert len(ids) == len(set(ids)) == 7, ids
    if kind == "brokerqueue":  # the broker ignored that acknowledgement and redelivered
        assert protocol.stats.duplicates_dropped == 4
    else:  # XACK took it: nothing pending came back
        assert protocol.stats.duplicates_dropped == 0
    assert queue.unsettled() == {}


@pytest.mark.parametrize("kind", ["brokerqueue", "logstream"])
def test_at_least_once_a_crash_before_the_acknowledgement_loses_nothing(
    package: Path, tmp_path: Path, kind: str
) -> None:
    queue = Queue(package, tmp_path, kind)
    queue.send(range(1, 6))
    first = queue.source()
    memory = MemoryAcks(first, ROWS)
    assert memory.next_batch(0, 3, WAIT) == 1  # in memory only; the process dies
    second = queue.source()
    memory = MemoryAcks(second, ROWS)
    seen: list[str] = []
    seq = 0
    while (end := memory.next_batch(seq, 3, 0.2)) != seq:
        seen += [m.id for m in memory.memory[end]]
        memory.commit(end)
        seq = end
    assert len(set(seen)) == 5, seen
    assert queue.unsettled() == {}


def test_logstream_claims_entries_of_a_consumer_that_is_gone(package: Path, tmp_path: Path) -> None:
    queue = Queue(package, tmp_path, "logstream")
    queue.extra = {"claimIdleMs": "50"}
    queue.send(range(1, 4))
    gone = queue.source(part_id="an-old-part-id")  # another consumer name
    assert len(gone.receive(10, WAIT)) == 3
    source = queue.source()
    deadline = time.monotonic() + WAIT
    claimed: list[Any] = []
    while not claimed and time.monotonic() < deadline:  # until idle for claimIdleMs
        claimed = source.receive(10, 0.05)
    assert sorted(m.id for m in claimed) == ["1-0", "2-0", "3-0"]
    assert all(m.redelivered for m in claimed)
    source.acknowledge([m.id for m in claimed] + ["1-0", "99-0"])  # settled and unknown IDs
    assert queue.unsettled() == {}


def test_the_check_catches_a_log_source_that_does_not_replay_its_pending_entries(
    package: Path, tmp_path: Path
) -> None:
    """The receive-store crash check can fail: without the replay of its own pending
    entries the pull-based source loses what it received before the crash."""
    logstream = example(package, "logstream")

    class Forgetful(logstream.LogStreamSource):
        def open(self, max_unacknowledged: int) -> None:
            super().open(max_unacknowledged)
            self.history = None  # the classic bug: only new entries ('>')

    queue = Queue(package, tmp_path, "logstream", Forgetful)
    queue.send(range(1, 8))
    queue.source().receive(3, WAIT)
    second = queue.source()
    drain(queue, second, queue.protocol(second), 0)
    assert len(queue.stored_ids()) == 4  # 3 lost
    assert queue.unsettled() == {"pending": 3}


# -- a transactional sink -------------------------------------------------------------------------
class Files:
    """The guides' transactional sink, its directory and the job's snapshot store."""

    def __init__(self, package: Path, tmp_path: Path) -> None:
        self.module = example(package, "jsonfiles")
        self.directory = tmp_path / "out"
        self.store = SnapshotStore(str(tmp_path / "job" / "store"))

    def sink(self, **task: Any) -> Any:
        """A new sink object (a new process), with a task's context when given."""
        values = {"directory": str(self.directory)}
        return self.module.JsonFilesSink(Options("jsonfiles", values, context("files-1", **task)))

    def task(self, batch: int, partition: int, attempt: int = 0, run: int = 1) -> Any:
        return context("files-1", batch=batch, partition=partition, attempt=attempt, run=run)

    def prepare(self, batch: int, partition: int, keys: list[str], **kw: Any) -> Prepared:
        task = self.task(batch, partition, **kw)
        sink = self.sink(batch=batch, partition=partition, **kw)
        transaction = sink.begin(task)
        try:  # a task without records may still get an empty Arrow batch
            transaction.write(pa.RecordBatch.from_pydict({"key": keys, "value": keys}, KV_ARROW))
            data = transaction.prepare()
        finally:
            transaction.close()
            sink.close()
        return Prepared(str(task.txn), json.loads(json.dumps(data)))

    def protocol(self, run: int) -> Any:
        return two_phase_commit(
            self.store, self.sink(), "guides", "files-1", incarnation="", run=run
        )[0]

    def visible(self) -> list[str]:
        return [
            json.loads(line)["key"]
            for path in sorted(self.directory.glob("*.jsonl"))
            for line in path.read_text().splitlines()
        ]

    def staged(self) -> list[str]:
        return sorted(p.name for p in (self.directory / ".staging").iterdir())


def batch_scope(batch: int) -> RecoveryScope:
    return RecoveryScope(transaction_prefix("guides", "files-1"), "batch", batch, 1)


def test_jsonfiles_two_phase_commit_with_a_failed_attempt_and_an_empty_task(
    package: Path, tmp_path: Path
) -> None:
    files = Files(package, tmp_path)
    files.sink().check(KV)
    stray = files.prepare(0, 0, ["a", "b"])  # attempt 0 prepared, then its task died
    kept = files.prepare(0, 0, ["a", "b"], attempt=1)
    empty = files.prepare(0, 1, [])  # a partition without records
    assert empty.data == {"rows": 0}
    found = {p.transaction_id for p in files.sink().in_doubt(batch_scope(0))}
    assert found == {stray.transaction_id, kept.transaction_id}  # durable: a new object sees them
    protocol = files.protocol(1)
    protocol.commit_batch(0, [kept, empty])
    assert files.visible() == ["a", "b"]
    assert files.staged() == []  # the failed attempt was rolled back
    files.sink().commit(kept)  # again: nothing changes
    files.sink().commit(Prepared(kept.transaction_id))  # as in_doubt would rebuild it
    assert files.visible() == ["a", "b"]


def test_jsonfiles_recovery_commits_the_decided_and_rolls_back_the_rest(
    package: Path, tmp_path: Path
) -> None:
    files = Files(package, tmp_path)
    files.sink().check(KV)
    decided = files.prepare(0, 0, ["x"])
    files.protocol(1).decide(0, [decided])  # the driver dies before phase 2
    undecided = files.prepare(1, 0, ["y"])  # prepared, never decided
    task = files.task(1, 1)  # a task killed before prepare: a partial file
    files.sink(batch=1, partition=1).begin(task).write(
        pa.RecordBatch.from_pydict({"key": ["z"], "value": ["z"]})
    )
    report = files.protocol(2).recover()  # the next run, new objects everywhere
    assert report.completed_batches == [0]
    assert report.rolled_back == [undecided.transaction_id]
    assert files.visible() == ["x"]
    assert files.staged() == []  # the partial file of run 1 is gone too
    files.protocol(2).recover()  # a second recovery changes nothing
    assert files.visible() == ["x"]


def test_jsonfiles_abort_drops_the_writes_and_a_lost_decided_transaction_fails(
    package: Path, tmp_path: Path
) -> None:
    files = Files(package, tmp_path)
    files.sink().check(KV)
    sink = files.sink(batch=0, partition=0)
    transaction = sink.begin(files.task(0, 0))
    transaction.write(pa.RecordBatch.from_pydict({"key": ["a"], "value": ["a"]}))
    transaction.abort()
    transaction.close()
    assert files.staged() == [] and files.visible() == []
    prepared = files.prepare(0, 0, ["b"], attempt=1)
    (files.directory / ".staging" / f"{prepared.transaction_id}.prepared").unlink()
    with pytest.raises(EpochalError, match="neither staged nor visible"):
        files.sink().commit(prepared)
    files.sink().rollback(prepared)  # unknown: nothing to do


# -- an idempotent sink ---------------------------------------------------------------------------
def test_upsert_writes_a_replayed_batch_once(package: Path, tmp_path: Path) -> None:
    upsert = example(package, "upsert")
    path = tmp_path / "out.sqlite"
    store = SnapshotStore(str(tmp_path / "job" / "store"))
    values = {"path": str(path), "table": "out"}

    def run_task(keys: list[str], attempt: int) -> KeyDigest:
        task = context("upsert-1", batch=0, partition=0, attempt=attempt)
        sink = upsert.UpsertSink(Options("upsert", values, task))
        writer = sink.open(task)
        batch = pa.RecordBatch.from_pydict({"key": keys, "value": [f"v-{k}" for k in keys]})
        digest = KeyDigest()
        writer.write(batch)
        digest.add_batch(batch, sink.key_columns())
        writer.flush()
        writer.close()
        return digest

    upsert.UpsertSink(Options("upsert", values)).check(KV)
    check_and_record(store, "upsert-1", 0, 0, run_task(["a", "b", "c"], 0))
    check_and_record(store, "upsert-1", 0, 0, run_task(["a", "b", "c"], 1))  # the replay
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT key, value FROM out ORDER BY key").fetchall()
    assert rows == [("a", "v-a"), ("b", "v-b"), ("c", "v-c")]
    with pytest.raises(KeyStabilityError):  # a replay with other keys is caught
        check_and_record(store, "upsert-1", 0, 0, run_task(["a", "b", "d"], 2))
    task = context("upsert-1", batch=1, partition=0)
    writer = upsert.UpsertSink(Options("upsert", values, task)).open(task)
    writer.flush()  # a partition without records
    with pytest.raises(PoisonRecordError, match="null key"):
        writer.write(pa.RecordBatch.from_pydict({"key": [None], "value": ["x"]}))
