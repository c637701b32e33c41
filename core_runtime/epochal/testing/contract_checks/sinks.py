"""The contract checks of the sinks: two-phase commit (a retried task, crashes before the
decision and in phase 2, an empty task) and idempotent upserts (a replay, an update)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from epochal.protocols import keys
from epochal.protocols.transactions import two_phase_commit
from epochal.protocols.two_phase import TwoPhaseCommit
from epochal.state.store import SnapshotStore
from epochal.testing.contract_checks import typed
from epochal.testing.contract_checks.common import (
    CHUNKS,
    SINK_ARROW,
    SINK_SCHEMA,
    CheckNotApplicableError,
    ContractViolationError,
    Part,
    Subject,
    _first,
    _violation,
)
from epochal.testing.crashing import StepFailedError, run_then_die
from epochal_sdk import (
    ConfigError,
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    Prepared,
    SchemaMismatchError,
    TransactionalSink,
)
from epochal_sdk.schema import Field
from epochal_sdk.sinks import Sink


# -- sinks --------------------------------------------------------------------------------------
def _records(ids: Iterable[int], suffix: str = "") -> list[dict[str, str]]:
    return [{"key": str(i), "value": f"{i}{suffix}"} for i in ids]


def _chunks(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    size = max(1, -(-len(records) // CHUNKS))
    return [records[i : i + size] for i in range(0, len(records), size)] or [[]]


def _batch(records: list[dict[str, Any]], arrow: pa.Schema | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(records, schema=arrow or SINK_ARROW)


def _task_sink(request: dict[str, Any]) -> tuple[Any, ConnectorContext]:
    part: Part = request["part"]
    task = part.context(
        run=request["run"],
        batch=request["batch"],
        partition=request["partition"],
        attempt=request["attempt"],
        schema=request.get("schema") or SINK_SCHEMA,
    )
    return part.build(task, "sink"), task


def transaction_step(request: dict[str, Any]) -> dict[str, Any] | None:
    """A transactional sink's task as the runtime runs it: begin, write the chunks, prepare
    (or abort), close; with ``commit`` (at-least-once) commit at once. The prepared handle
    as the driver receives it (JSON), or None when the task aborted."""
    sink, task = _task_sink(request)
    try:
        transaction = sink.begin(task)
        try:
            for chunk in request["chunks"]:
                transaction.write(_batch(chunk, request.get("arrow")))
            if request.get("abort"):
                transaction.abort()
                return None
            data = transaction.prepare()
        except BaseException:
            transaction.abort()
            raise
        finally:
            transaction.close()
        prepared = Prepared(str(task.txn), json.loads(json.dumps(data)))
        if request.get("commit"):
            sink.commit(prepared)
        return {"transaction_id": prepared.transaction_id, "data": prepared.data}
    finally:
        sink.close()


def upsert_step(request: dict[str, Any]) -> dict[str, int]:
    """An idempotent sink's task as the runtime runs it: open, write the chunks, flush,
    close. The digest of the keys it wrote."""
    sink, task = _task_sink(request)
    digest = keys.KeyDigest()
    try:
        key_columns = sink.key_columns()
        writer = sink.open(task)
        try:
            for chunk in request["chunks"]:
                batch = _batch(chunk, request.get("arrow"))
                writer.write(batch)
                digest.add_batch(batch, key_columns)
            writer.flush()
        finally:
            writer.close()
        return digest.as_dict()
    finally:
        sink.close()


class SinkRun:
    """A sink under a check: its part, the job's store, and the steps of its runs."""

    def __init__(self, subject: Subject, check: str, contract: type[Sink]) -> None:
        assert subject.sink is not None
        self.under, self.mode, self.check = subject.sink, subject.mode, check
        self.part = Part.of(self.under.connector, self.under.options(self.mode))
        self.store = SnapshotStore(os.path.join(subject.workdir, "store"))
        driver = self.driver_sink(1)
        try:
            if not isinstance(driver, contract):
                raise _violation(check, f"{type(driver).__name__} is not a {contract.__name__}")
            self.exactly_once = (
                subject.exactly_once and driver.max_guarantee() == Guarantee.EXACTLY_ONCE
            )
        finally:
            driver.close()

    def driver_sink(self, run: int, batch: int | None = None) -> Any:
        """A new sink object on the driver (a commit runs in a fresh worker each batch)."""
        return self.part.build(self.part.context(run=run, batch=batch), "sink")

    def protocol(self, sink: TransactionalSink, run: int | None) -> TwoPhaseCommit:
        """The runtime's two-phase commit for ``sink`` in ``run``."""
        protocol, _ = two_phase_commit(
            self.store,
            sink,
            self.part.job,
            self.part.part_id,
            incarnation=self.part.incarnation,
            run=run,
        )
        return protocol

    def start_run(self, run: int, schema: tuple[Field, ...] = SINK_SCHEMA) -> None:
        """What the runtime does at the start of a run: ``check`` (of the query's columns,
        ``schema``), then (two-phase commit) recovery."""
        sink = self.driver_sink(run)
        try:
            sink.check(schema)
            if self.mode == "transactional" and self.exactly_once:
                self.protocol(sink, run).recover()
        finally:
            sink.close()

    def task(
        self,
        step: Callable[[dict[str, Any]], Any],
        *,
        run: int,
        batch: int,
        partition: int,
        attempt: int,
        records: list[dict[str, Any]],
        **extra: Any,
    ) -> Any:
        """A task in a process that dies once it returned."""
        request = {
            "part": self.part,
            "run": run,
            "batch": batch,
            "partition": partition,
            "attempt": attempt,
            "chunks": _chunks(records),
            **extra,
        }
        try:
            return run_then_die(step, request)
        except StepFailedError as exc:
            raise _violation(
                self.check, f"batch {batch}, partition {partition}, attempt {attempt}: {exc}"
            ) from None

    def seen(self) -> Counter[str]:
        """What the independent reader sees, counted by key."""
        return Counter(key for key, _ in self.under.committed(self.mode))

    def expect_values(self, written: list[dict[str, str]], what: str) -> None:
        """Every entry the reader sees of a written key holds the value it was written with:
        compared by value, not only counted."""
        values = {record["key"]: record["value"] for record in written}
        wrong = {
            key: value
            for key, value in self.under.committed(self.mode)
            if key in values and value != values[key]
        }
        if wrong:
            key, value = next(iter(wrong.items()))
            raise _violation(
                self.check,
                f"{what}: {len(wrong)} records show another value than the one written (key "
                f"{key!r}: {value!r}, written {values[key]!r}): the sink must write each "
                "record's own value, unchanged",
            )

    def expect_once(self, written: list[dict[str, str]], what: str) -> None:
        """Each record once (at least once when duplicates are allowed) with the value it was
        written with, nothing else, nothing in doubt."""
        wanted = set(_keys(written))
        found = self.seen()
        self.expect_values(written, what)
        lost = wanted - set(found)
        if lost:
            raise _violation(
                self.check,
                f"{what}: {len(lost)} of {len(wanted)} records are not visible (keys "
                f"{_first(lost)})",
            )
        if self.exactly_once:
            doubled = {k: n for k, n in found.items() if n > 1}
            if doubled:
                raise _violation(
                    self.check,
                    f"{what}: {len(doubled)} records are visible more than once ("
                    f"{dict(list(doubled.items())[:5])}): duplicates under exactly-once",
                )
            other = set(found) - wanted
            if other:
                raise _violation(
                    self.check,
                    f"{what}: the reader sees entries that were never written: keys "
                    f"{_first(other, 5)}",
                )
        self.nothing_in_doubt(what)

    def nothing_in_doubt(self, what: str) -> None:
        """The sink system holds no prepared transaction (the suite's ``in_doubt()``)."""
        left = self.under.in_doubt()
        if left:
            raise _violation(
                self.check,
                f"{what}: transactions left in doubt {left[:5]}: rollback (or recovery "
                "through in_doubt) must settle every transaction the runtime did not commit",
            )


def _keys(records: list[dict[str, str]]) -> list[str]:
    return [r["key"] for r in records]


class TwoPhaseRun(SinkRun):
    """A transactional sink under a check: tasks prepare in dying processes, the driver
    decides and commits with new objects."""

    def __init__(self, subject: Subject, check: str) -> None:
        super().__init__(subject, check, TransactionalSink)

    def prepare(
        self,
        *,
        run: int,
        batch: int,
        partition: int,
        attempt: int,
        records: list[dict[str, Any]],
        **extra: Any,
    ) -> Prepared | None:
        """One task attempt: nothing when the batch is decided (a replay), else its
        prepared transaction (committed at once when the part is at-least-once)."""
        if self.exactly_once:
            sink = self.driver_sink(run, batch)
            try:
                if self.protocol(sink, run).is_decided(batch):
                    return None
            finally:
                sink.close()
        done = self.task(
            transaction_step,
            run=run,
            batch=batch,
            partition=partition,
            attempt=attempt,
            records=records,
            commit=not self.exactly_once,
            **extra,
        )
        return Prepared(done["transaction_id"], done["data"]) if done else None

    def with_protocol(self, run: int, batch: int, action: Callable[[TwoPhaseCommit], Any]) -> Any:
        """``action`` on the driver: a new sink object, the runtime's protocol."""
        where = f"run {run}, batch {batch}, on the driver"
        return self._driving(self.driver_sink(run, batch), run, where, action)

    def as_operator(self, action: Callable[[TwoPhaseCommit], Any]) -> Any:
        """``action`` as an operator's settling of the job (``jobs cancel``, ``run
        --replace``): the sink built anew from its options as the settling builds it, no run
        asking."""
        from epochal.parts.settling import build_sink

        part = self.part
        sink = build_sink(part.connector, part.part_id, part.job, part.options, part.incarnation)
        return self._driving(sink, None, "an operator settling the job", action)

    def _driving(
        self,
        sink: TransactionalSink,
        run: int | None,
        where: str,
        action: Callable[[TwoPhaseCommit], Any],
    ) -> Any:
        try:
            return action(self.protocol(sink, run))
        except ContractViolationError:
            raise
        except Exception as exc:
            raise _violation(self.check, f"{where}: {type(exc).__name__}: {exc}") from exc
        finally:
            sink.close()

    def commit(self, run: int, batch: int, prepared: Iterable[Prepared | None]) -> None:
        """The driver's side of a batch: decide, then phase 2 (or, at-least-once, roll back
        what failed attempts left)."""
        chosen = [p for p in prepared if p is not None]
        if self.exactly_once:
            self.with_protocol(run, batch, lambda p: p.commit_batch(batch, chosen))
        else:
            self.with_protocol(run, batch, lambda p: p.rollback_strays(batch))


def check_2pc_retried_task(subject: Subject) -> None:
    """A task attempt aborts, the next prepares and dies unreported, the third prepares; the
    runtime decides the third: every record visible once, nothing left in doubt."""
    run = TwoPhaseRun(subject, "2pc-retried-task")
    records = _records(range(20))
    run.start_run(1)
    run.task(transaction_step, run=1, batch=0, partition=0, attempt=0, records=records, abort=True)
    run.prepare(run=1, batch=0, partition=0, attempt=1, records=records)  # its report is lost
    third = run.prepare(run=1, batch=0, partition=0, attempt=2, records=records)
    run.commit(1, 0, [third])
    run.expect_once(records, "after a task was retried twice")


def check_2pc_crash_before_decision(subject: Subject) -> None:
    """Two tasks prepare, the driver dies before the decision; the next run recovers and
    replays the batch: every record visible once, nothing left in doubt."""
    run = TwoPhaseRun(subject, "2pc-crash-before-decision")
    parts = [_records(range(0, 10)), _records(range(10, 20))]
    run.start_run(1)
    for partition, records in enumerate(parts):
        run.prepare(run=1, batch=0, partition=partition, attempt=0, records=records)
    run.start_run(2)  # the driver died: recovery rolls back what run 1 prepared
    replayed = [
        run.prepare(run=2, batch=0, partition=partition, attempt=0, records=records)
        for partition, records in enumerate(parts)
    ]
    run.commit(2, 0, replayed)
    run.expect_once(parts[0] + parts[1], "after a crash before the decision and a replay")


def check_2pc_crash_in_phase_2(subject: Subject) -> None:
    """The driver dies after a decision (batch 0), and after phase 2 committed but before it
    was recorded (batch 1); recovery commits both again: every record visible once."""
    run = TwoPhaseRun(subject, "2pc-crash-in-phase-2")
    batches = [[_records(range(0, 10)), _records(range(10, 20))], [_records(range(20, 30))]]
    run.start_run(1)
    prepared = [
        run.prepare(run=1, batch=0, partition=partition, attempt=0, records=records)
        for partition, records in enumerate(batches[0])
    ]
    if run.exactly_once:
        run.with_protocol(1, 0, lambda p: p.decide(0, [x for x in prepared if x]))
    run.start_run(2)  # recovery finishes the decided batch 0
    for partition, records in enumerate(batches[0]):  # Spark replays it: the tasks skip it
        run.prepare(run=2, batch=0, partition=partition, attempt=0, records=records)
    second = [run.prepare(run=2, batch=1, partition=0, attempt=0, records=batches[1][0])]
    if run.exactly_once:

        def commit_without_record(protocol: TwoPhaseCommit) -> None:
            for chosen in protocol.decide(1, [x for x in second if x]):
                protocol.sink.commit(chosen)  # phase 2 done, its record not yet written

        run.with_protocol(2, 1, commit_without_record)
    run.start_run(3)  # recovery completes batch 1 again: commit is called a second time
    written = [r for part in batches[0] + batches[1] for r in part]
    run.expect_once(written, "after crashes after the decision and inside phase 2")


def check_2pc_cancel(subject: Subject) -> None:
    """Batch 0 commits, batch 1's tasks prepare and the driver dies before its decision, and
    the job is cancelled: the operator's settling that ``jobs cancel`` (and ``run
    --replace``) runs before deleting the job (a sink built anew from its options, no run
    asking) settles batch 1: batch 0 visible once, batch 1's task all or nothing (rolled
    back by a two-phase sink, kept once by one whose prepare makes rows visible), nothing in
    doubt."""
    run = TwoPhaseRun(subject, "2pc-cancel")
    if not run.exactly_once:  # at-least-once tasks commit their own: nothing to settle
        return
    batches = [[_records(range(0, 10)), _records(range(10, 20))], [_records(range(20, 30))]]
    run.start_run(1)
    first = [
        run.prepare(run=1, batch=0, partition=partition, attempt=0, records=records)
        for partition, records in enumerate(batches[0])
    ]
    run.commit(1, 0, first)
    run.prepare(run=1, batch=1, partition=0, attempt=0, records=batches[1][0])
    run.as_operator(lambda protocol: protocol.recover())  # the driver died; a cancel
    # a sink whose prepare makes a task's rows visible (Kafka's: a replay skips what a task
    # committed) keeps them; a two-phase one rolls them back. Never a part of a task's rows
    undecided = _keys(batches[1][0])
    found = run.seen()
    shown = [key for key in undecided if key in found]
    if shown and len(shown) != len(undecided):
        raise _violation(
            run.check,
            f"after a cancel: {len(shown)} of the {len(undecided)} records of one task's "
            "undecided transaction are visible: a task's transaction is all or nothing",
        )
    committed = batches[0][0] + batches[0][1] + (batches[1][0] if shown else [])
    run.expect_once(committed, "after a cancel with a batch prepared and undecided")


def check_2pc_empty_task(subject: Subject) -> None:
    """A task that got no rows prepares too; the batch commits without an error."""
    run = TwoPhaseRun(subject, "2pc-empty-task")
    records = _records(range(10))
    run.start_run(1)
    full = run.prepare(run=1, batch=0, partition=0, attempt=0, records=records)
    empty = run.prepare(run=1, batch=0, partition=1, attempt=0, records=[])
    run.commit(1, 0, [full, empty])
    run.expect_once(records, "after a batch with an empty task")


class UpsertRun(SinkRun):
    """An idempotent sink under a check: tasks write in dying processes; the runtime checks
    the keys of a replay against the first run's."""

    def __init__(self, subject: Subject, check: str) -> None:
        super().__init__(subject, check, IdempotentSink)

    def write(
        self,
        *,
        run: int,
        batch: int,
        partition: int,
        attempt: int,
        records: list[dict[str, Any]],
        **extra: Any,
    ) -> None:
        """One task; under exactly-once its key digest is recorded or compared, as the
        runtime does."""
        digest = self.task(
            upsert_step,
            run=run,
            batch=batch,
            partition=partition,
            attempt=attempt,
            records=records,
            **extra,
        )
        if self.exactly_once:
            try:
                keys.check_and_record(
                    self.store,
                    self.part.part_id,
                    batch,
                    partition,
                    keys.KeyDigest(digest["count"], digest["total"]),
                )
            except keys.KeyStabilityError as exc:
                raise _violation(self.check, str(exc)) from None


def check_upsert_replay(subject: Subject) -> None:
    """A task writes (in several Arrow batches), flushes and dies: every record is visible;
    the replay of the batch in a new run and attempt leaves what a reader sees unchanged."""
    run = UpsertRun(subject, "upsert-replay")
    records = _records(range(30))
    run.start_run(1)
    run.write(run=1, batch=0, partition=0, attempt=0, records=records)
    before = run.seen()
    lost = set(_keys(records)) - set(before)
    other = set(before) - set(_keys(records))
    if lost and other:
        raise _violation(
            run.check,
            f"the reader sees entries under keys that were never written ({_first(other, 5)}) "
            f"instead of {len(lost)} of the records' own keys: the key an upsert writes must "
            "be the record's key (key_columns), the same on every replay, not one made of the "
            "time, the run or the attempt",
        )
    if lost:
        raise _violation(
            run.check,
            f"{len(lost)} of {len(records)} records are not visible after the task flushed "
            f"and its process died (keys {_first(lost)}): flush() must return only once every "
            "write of the task is durable (and write() must keep every batch it is given)",
        )
    run.start_run(2)
    run.write(run=2, batch=0, partition=0, attempt=1, records=records)
    after = run.seen()
    if run.exactly_once and after != before:
        added = after - before
        raise _violation(
            run.check,
            f"the replay of a batch changed what a reader sees: {sum(added.values())} more "
            f"entries (e.g. {list(added)[:5]}): an upsert must overwrite by a key derived from "
            "the record (not append, not a key made of the run, attempt or time)",
        )
    lost = set(_keys(records)) - set(after)
    if lost:
        raise _violation(run.check, f"records lost after the replay: keys {_first(lost)}")
    run.expect_values(records, "after the replay")


def check_upsert_update(subject: Subject) -> None:
    """A later batch writes new values for the same keys: the reader's last value of each key
    is the new one."""
    run = UpsertRun(subject, "upsert-update")
    run.start_run(1)
    run.write(run=1, batch=0, partition=0, attempt=0, records=_records(range(10)))
    run.write(run=1, batch=1, partition=0, attempt=0, records=_records(range(10), "-new"))
    last: dict[str, str] = {}
    for key, value in run.under.committed(run.mode):
        last[key] = value
    stale = {k: last.get(k) for k in map(str, range(10)) if last.get(k) != f"{k}-new"}
    if stale:
        raise _violation(
            run.check,
            f"after a later batch wrote new values for {len(stale)} keys, the reader's last "
            f"value of each is not the new one ({dict(list(stale.items())[:5])}): an upsert "
            "must replace the value (a running aggregate stops otherwise)",
        )


def check_typed_values(subject: Subject) -> None:
    """Every type the sink says it maps (``SinkUnderTest.types``), written in one batch of the
    kit's typed records (:mod:`~epochal.testing.contract_checks.typed`), reads back the same
    by value through the independent reader (``committed_typed``); every kit type it does not
    map is refused by ``check()`` with an error that names the column."""
    transactional = subject.mode == "transactional"
    name = "2pc-types" if transactional else "upsert-types"
    under = subject.sink
    assert under is not None
    if under.types is None:
        raise CheckNotApplicableError(
            "the sink under test does not say which types it maps: set SinkUnderTest.types to "
            f"the kit types it maps (of {', '.join(typed.BY_NAME)}) and implement "
            "committed_typed()"
        )
    try:
        mapped = typed.kit_types(under.types)
    except ValueError as exc:
        raise _violation(name, str(exc)) from None
    run: TwoPhaseRun | UpsertRun = (
        TwoPhaseRun(subject, name) if transactional else UpsertRun(subject, name)
    )
    for kit_type in typed.KIT_TYPES:
        if kit_type not in mapped:
            _expect_refused(run, kit_type)
    if not mapped:
        return
    schema = typed.typed_schema(mapped)
    records = typed.typed_records(range(10), mapped)
    extra = {"schema": schema, "arrow": typed.typed_arrow(mapped)}
    try:
        run.start_run(1, schema)
    except Exception as exc:
        raise _violation(
            name,
            f"check() refused the typed record of the types the suite says the sink maps "
            f"({', '.join(t.spark_type for t in mapped)}): {type(exc).__name__}: {exc}",
        ) from None
    if isinstance(run, TwoPhaseRun):
        prepared = run.prepare(run=1, batch=0, partition=0, attempt=0, records=records, **extra)
        run.commit(1, 0, [prepared])
    else:
        run.write(run=1, batch=0, partition=0, attempt=0, records=records, **extra)
    try:
        read = under.committed_typed(subject.mode, schema)
    except Exception as exc:
        raise _violation(
            name,
            f"the independent reader (committed_typed) could not read the typed records back: "
            f"{type(exc).__name__}: {exc}",
        ) from exc
    wrong = typed.differences(records, read, mapped)
    if wrong:
        raise _violation(
            name,
            f"{len(wrong)} values of the typed records read back differ from those written: "
            f"{'; '.join(wrong[:6])}: a sink must write each column's value as it was given "
            "(or refuse its type at check())",
        )
    run.nothing_in_doubt("after the typed records' batch")


def _expect_refused(run: SinkRun, kit_type: typed.KitType) -> None:
    """``check()`` of a record with a column of a type the sink does not map refuses it, with
    a :class:`~epochal_sdk.SchemaMismatchError` or :class:`~epochal_sdk.ConfigError` that
    names the column."""
    schema = (Field("key", "string", nullable=False), Field(kit_type.column, kit_type.spark_type))
    sink = run.driver_sink(1)
    try:
        sink.check(schema)
    except (SchemaMismatchError, ConfigError) as exc:
        if kit_type.column not in str(exc):
            raise _violation(
                run.check,
                f"check() refused a {kit_type.spark_type} column {kit_type.column!r} without "
                f"naming it ({exc}): the error must say which column is wrong",
            ) from None
    except Exception as exc:
        raise _violation(
            run.check,
            f"check() of a {kit_type.spark_type} column failed with {type(exc).__name__}: "
            f"{exc}; a type the sink does not map is refused with SchemaMismatchError",
        ) from None
    else:
        raise _violation(
            run.check,
            f"check() accepted a {kit_type.spark_type} column ({kit_type.column}), a type the "
            "suite says the sink does not map (SinkUnderTest.types): it must refuse it with a "
            "SchemaMismatchError naming the column, or the suite must list the type and the "
            "reader read it back",
        )
    finally:
        sink.close()
