"""The contract checks of an acknowledging source: nothing is lost when a crash comes between
receiving and storing or before acknowledging, and an acknowledgement settles only its messages."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from epochal.protocols.acking import ID_COLUMN, AckProtocol, batch_key, decode_batch
from epochal.state.store import SnapshotStore
from epochal.testing.contract_checks.common import (
    DEADLINE,
    RECEIVE_TIMEOUT,
    REQUEUE_WAIT,
    ContractViolationError,
    Part,
    Subject,
    _first,
    _until,
    _violation,
    arrow_schema,
    as_dicts,
    poll_until_settled,
)
from epochal.testing.crashing import StepFailedError, run_then_die
from epochal_sdk import (
    AcknowledgingSource,
    Guarantee,
)

if TYPE_CHECKING:
    pass


def receive_after_death(
    receive_ids: Callable[[], list[int]], expected: set[int], markers: set[int]
) -> None:
    """Receive (``receive_ids()``: the record IDs one receive gave) after a process that held
    messages died, until the ``markers`` (records produced after the death) arrived and a
    receive came back empty, and then on while the broker may still be requeueing the dead
    process's messages: until every ``expected`` record arrived (at once for a sound source)
    or :data:`~epochal.testing.contract_checks.common.REQUEUE_WAIT` seconds passed since the
    markers did. Bounded by :data:`DEADLINE` in all."""
    seen: set[int] = set()
    markers_seen_at: float | None = None
    deadline = time.monotonic() + DEADLINE
    while _until(deadline):
        got = receive_ids()
        seen |= set(got)
        if got or not markers <= seen:
            continue
        if markers_seen_at is None:
            markers_seen_at = time.monotonic()
        if expected <= seen or time.monotonic() > markers_seen_at + REQUEUE_WAIT:
            return


# -- the acknowledging source -----------------------------------------------------------------
def _message_row(message: Any, columns: Sequence[str]) -> dict[str, Any]:
    return as_dicts([message.row], columns)[0]


def _id_receiver(
    run: AckRun, source: AcknowledgingSource
) -> tuple[dict[int, str], Callable[[], list[int]]]:
    """A ``receive_ids`` for :func:`receive_after_death` over ``source`` (up to 10 messages a
    receive), and the dict in which it notes each record ID's message ID."""
    columns = source.columns()
    seen: dict[int, str] = {}

    def receive_ids() -> list[int]:
        messages = source.receive(10, RECEIVE_TIMEOUT)
        ids = run.ids_of([_message_row(m, columns) for m in messages])
        seen.update(zip(ids, (m.id for m in messages), strict=True))
        return ids

    return seen, receive_ids


def _open(part: Part, run: int, capacity: int) -> AcknowledgingSource:
    source = part.build(part.context(run=run), "source")
    if not isinstance(source, AcknowledgingSource):
        raise TypeError(f"{type(source).__name__} is not an AcknowledgingSource")
    source.check()
    source.open(max_unacknowledged=capacity)
    return source


def receive_step(request: dict[str, Any]) -> dict[str, Any]:
    """(In a dying process.) Open the source, receive ``count`` messages (``max_messages`` at
    a time), acknowledge the first ``acknowledge`` of them twice; the messages received."""
    part: Part = request["part"]
    source = _open(part, request["run"], request["capacity"])
    columns = source.columns()
    got: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < request["count"] and _until(deadline):
        for message in source.receive(request["max_messages"], RECEIVE_TIMEOUT):
            got.append((message.id, _message_row(message, columns)))
    acknowledged = [message_id for message_id, _ in got[: request.get("acknowledge", 0)]]
    if acknowledged:
        source.acknowledge(acknowledged)
        source.acknowledge(acknowledged)  # again: IDs already acknowledged must be tolerated
    return {"received": got, "acknowledged": acknowledged}


def store_step(request: dict[str, Any]) -> dict[str, Any]:
    """(In a dying process.) Open the source and let the runtime store batches until
    ``count`` messages are stored; the last stored batch. Nothing is acknowledged."""
    part: Part = request["part"]
    source = _open(part, request["run"], request["capacity"])
    protocol = AckProtocol(
        SnapshotStore(request["store"]), source, part.part_id, arrow_schema(source.schema())
    )
    seq = stored = 0
    deadline = time.monotonic() + DEADLINE
    while stored < request["count"] and _until(deadline):
        new = protocol.next_batch(seq, request["max_messages"], RECEIVE_TIMEOUT)
        for number in range(seq + 1, new + 1):
            stored += decode_batch(protocol.store.read(protocol.batch_key(number))).num_rows
        seq = new
    return {"last": seq, "stored": stored}


class AckRun:
    """An acknowledging source under a check: its part, the job's store, the runs."""

    def __init__(self, subject: Subject, check: str) -> None:
        assert subject.source is not None
        self.under, self.check, self.subject = subject.source, check, subject
        self.part = Part.of(self.under.connector, self.under.options())
        self.store_path = os.path.join(subject.workdir, "store")
        self.store = SnapshotStore(self.store_path)
        source = self.part.build(self.part.context(), "source")
        try:
            self.exactly_once = (
                subject.exactly_once and source.max_guarantee() == Guarantee.EXACTLY_ONCE
            )
        finally:
            source.close()

    def produce(self, ids: Sequence[int]) -> set[int]:
        """Put these records into the source; their IDs."""
        self.under.produce(list(ids))
        return set(ids)

    def in_dying_process(self, step: Callable[[dict[str, Any]], Any], **request: Any) -> Any:
        """Run a step in a process that then dies; a step that raised is a violation."""
        try:
            return run_then_die(step, {"part": self.part, **request})
        except StepFailedError as exc:
            raise _violation(
                self.check, f"the source failed in the process that died: {exc}"
            ) from None

    def ids_of(self, rows: list[dict[str, Any]]) -> list[int]:
        """The record IDs of rows."""
        return self.under.record_ids(rows)

    def stored(self, first: int, last: int) -> tuple[list[int], dict[int, str]]:
        """The record IDs of stored batches ``first..last``, and the message ID of each."""
        ids: list[int] = []
        message_ids: dict[int, str] = {}
        for number in range(first, last + 1):
            key = batch_key(self.part.part_id, number)
            if not self.store.exists(key):
                continue
            batch = decode_batch(self.store.read(key))
            rows = batch.drop_columns([ID_COLUMN]).to_pylist()
            batch_ids = self.ids_of(rows)
            ids += batch_ids
            message_ids.update(zip(batch_ids, batch.column(ID_COLUMN).to_pylist(), strict=True))
        return ids, message_ids

    def store_until(
        self, protocol: AckProtocol, seq: int, expected: set[int], markers: set[int]
    ) -> tuple[int, list[int]]:
        """Let the runtime store batches from ``seq`` as :func:`receive_after_death` receives:
        until the ``markers`` (records produced after the crash, so behind every redelivery
        in the queue) and the ``expected`` records are stored; the last batch and the record
        IDs stored."""
        start = seq

        def store_next() -> list[int]:
            nonlocal seq
            new = protocol.next_batch(seq, 10, RECEIVE_TIMEOUT)
            ids = self.stored(seq + 1, new)[0] if new != seq else []
            seq = new
            return ids

        receive_after_death(store_next, expected, markers)
        return seq, self.stored(start + 1, seq)[0]

    def settled(self) -> None:
        """The source system holds nothing unsettled (the suite's ``unsettled()``), once every
        source of the check is closed: polled until it is empty, for up to
        :data:`~epochal.testing.contract_checks.common.REQUEUE_WAIT` seconds (the broker
        settles the acknowledgements of a closed or dead consumer asynchronously)."""
        left = poll_until_settled(self.under.unsettled, REQUEUE_WAIT)
        if left:
            raise _violation(
                self.check,
                f"after every message was acknowledged, the source still holds {left[:5]}: "
                "acknowledge(ids) must settle those messages",
            )


def _lost_after_crash(check: str, lost: set[int], what: str) -> ContractViolationError:
    return _violation(
        check,
        f"{len(lost)} messages {what} never came back to a new source (IDs {_first(lost)}): "
        "the source settled them without being asked (acknowledged on receipt, dropped as "
        "redelivered, or acknowledged with others): at-most-once, they are lost",
    )


def check_ack_crash_before_store(subject: Subject) -> None:
    """A process receives the messages and dies before the runtime stored them: a new
    source gets them all again, with the same IDs; the runtime stores each once."""
    check = "ack-crash-before-store"
    run = AckRun(subject, check)
    produced = run.produce(range(30))
    first = run.in_dying_process(
        receive_step, run=1, capacity=100, count=len(produced), max_messages=10
    )
    received = dict(
        zip(run.ids_of([r for _, r in first["received"]]), first["received"], strict=True)
    )
    if set(received) != produced:
        raise _violation(
            check,
            f"receive() gave {len(received)} of the {len(produced)} messages in the queue",
        )
    markers = run.produce(range(30, 35))
    source = _open(run.part, 2, 100)
    try:
        protocol = AckProtocol(run.store, source, run.part.part_id, arrow_schema(source.schema()))
        last, stored = run.store_until(protocol, 0, produced, markers)
        lost = produced - set(stored)
        if lost:
            raise _lost_after_crash(check, lost, "received by a process that died before the store")
        _, message_ids = run.stored(1, last)
        changed = {
            i: (received[i][0], message_ids[i])
            for i in produced
            if received[i][0] != message_ids[i]
        }
        if changed and run.exactly_once:
            some = list(changed.items())[:3]
            raise _violation(
                check,
                f"{len(changed)} redelivered messages came with another ID ((record, (first "
                f"ID, new ID)): {some}): a message's ID must be the same on every delivery, "
                "or the runtime cannot drop what it already stored",
            )
        doubled = [i for i, n in Counter(stored).items() if n > 1]
        if doubled and run.exactly_once:
            raise _violation(check, f"records stored twice: {_first(doubled)}")
        protocol.commit(last)
    finally:
        source.close()
    run.settled()


def check_ack_crash_before_ack(subject: Subject) -> None:
    """The runtime stores batches and its process dies before acknowledging them; the job
    comes back with its tuning options changed (:data:`RETUNED`): the part keeps its id, so
    the redeliveries are dropped by ID (nothing stored twice), and the acknowledgements after
    the snapshot settle the source."""
    check = "ack-crash-before-ack"
    run = AckRun(subject, check)
    produced = run.produce(range(30))
    first = run.in_dying_process(
        store_step,
        run=1,
        capacity=100,
        count=len(produced),
        max_messages=10,
        store=run.store_path,
    )
    markers = run.produce(range(30, 35))
    stored_first, _ = run.stored(1, first["last"])
    first_id = run.part.part_id
    run.part = run.part.with_options({**run.part.options, **RETUNED})
    source = _open(run.part, 2, 100)
    try:
        protocol = AckProtocol(run.store, source, run.part.part_id, arrow_schema(source.schema()))
        # the redeliveries of the stored batches are dropped by ID, not stored again: only
        # the markers are new
        last, stored_again = run.store_until(protocol, first["last"], markers, markers)
        stored = stored_first + stored_again
        lost = (produced | markers) - set(stored)
        if lost:
            raise _violation(check, f"records never stored: {_first(lost)}")
        doubled = {i: n for i, n in Counter(stored).items() if n > 1}
        if doubled and run.exactly_once:
            why = (
                f"the part's id changed with its tuning options ({first_id} -> "
                f"{run.part.part_id}), so the runtime looked for them under another id"
                if run.part.part_id != first_id
                else "their redeliveries carried IDs the runtime had not stored, so it could "
                "not drop them (a message's ID must be the same on every delivery)"
            )
            raise _violation(
                check,
                f"{len(doubled)} records were stored again after the restart (IDs "
                f"{_first(doubled)}): {why}: duplicates under exactly-once",
            )
        protocol.commit(last)
    finally:
        source.close()
    run.settled()


RETUNED = {
    "maxRecordsPerBatch": "7",
    "receiveTimeoutMs": "250",
    "dedupeWindowBatches": "50",
    "guarantee": "exactly-once",
}
"""The tuning options ``ack-crash-before-ack``'s second run has: what an operator changes on a
running job (admission control, the receive timeout, the dedupe window, a guarantee written
out). None says what the source reads, so the part keeps its id and its stored batches."""


def check_ack_settles_those(subject: Subject) -> None:
    """A process acknowledges half of what it received (twice) and dies: only the other half
    comes back, with the same IDs; acknowledging everything settles the source."""
    check = "ack-settles-those"
    run = AckRun(subject, check)
    produced = run.produce(range(20))
    first = run.in_dying_process(
        receive_step, run=1, capacity=100, count=len(produced), max_messages=5, acknowledge=10
    )
    received = dict(
        zip(run.ids_of([r for _, r in first["received"]]), first["received"], strict=True)
    )
    acknowledged = {
        i for i, (message_id, _) in received.items() if message_id in first["acknowledged"]
    }
    kept = produced - acknowledged
    markers = run.produce(range(20, 25))
    source = _open(run.part, 2, 100)
    try:
        again, receive_ids = _id_receiver(run, source)
        receive_after_death(receive_ids, kept, markers)
        back = acknowledged & set(again)
        if back:
            raise _violation(
                check,
                f"{len(back)} acknowledged messages were delivered again to a new source (IDs "
                f"{_first(back)}): acknowledge(ids) did not settle them; they are redelivered "
                "at every restart (duplicates once they leave the dedupe window)",
            )
        lost = kept - set(again)
        if lost:
            raise _violation(check, _settled_more(lost, _settles_on_receipt(run, receive_ids)))
        changed = [i for i in kept if again[i] != received[i][0]]
        if changed and run.exactly_once:
            raise _violation(
                check,
                f"{len(changed)} redelivered messages came with another ID (records "
                f"{_first(changed)}): a message's ID must be the same on every delivery",
            )
        source.acknowledge(list(again.values()))
    finally:
        source.close()
    run.settled()


def check_ack_close_unacknowledged(subject: Subject) -> None:
    """A source receives a few of the messages, acknowledges none, and is closed (as a
    graceful stop or a restart of its query closes it): a new source gets every message
    again, with the same IDs; closing settled none of them."""
    check = "ack-close-unacknowledged"
    run = AckRun(subject, check)
    produced = run.produce(range(20))
    source = _open(run.part, 1, 100)
    try:
        columns = source.columns()
        received: dict[int, str] = {}
        deadline = time.monotonic() + DEADLINE
        while len(received) < 5 and _until(deadline):
            messages = source.receive(5 - len(received), RECEIVE_TIMEOUT)
            ids = run.ids_of([_message_row(m, columns) for m in messages])
            received.update(zip(ids, (m.id for m in messages), strict=True))
    finally:
        source.close()
    markers = run.produce(range(20, 25))
    source = _open(run.part, 2, 100)
    try:
        again, receive_ids = _id_receiver(run, source)
        receive_after_death(receive_ids, produced, markers)
        lost = produced - set(again)
        if lost:
            handed = lost & set(received)
            raise _violation(
                check,
                f"{len(lost)} messages never came back to a new source after the first was "
                f"closed without acknowledging any (IDs {_first(lost)}; {len(handed)} of them "
                "handed over by receive(), the rest held back by the source): close() settled "
                "them (acknowledged in close(), or an auto-acknowledge session closed): a "
                "graceful stop or a restart of the query loses them",
            )
        changed = [i for i in received if again[i] != received[i]]
        if changed and run.exactly_once:
            raise _violation(
                check,
                f"{len(changed)} messages came back with another ID (records "
                f"{_first(changed)}): a message's ID must be the same on every delivery",
            )
        source.acknowledge(list(again.values()))
    finally:
        source.close()
    run.settled()


def _settles_on_receipt(run: AckRun, receive_ids: Callable[[], list[int]]) -> bool:
    """Whether the source settles messages that are received and never acknowledged: a
    process receives new records without acknowledging any and dies; ``receive_ids`` (a
    consumer still open) must get them back."""
    probe = run.produce(range(1000, 1005))
    run.in_dying_process(receive_step, run=3, capacity=100, count=len(probe), max_messages=5)
    markers = run.produce(range(1005, 1010))
    seen: set[int] = set()

    def receive() -> list[int]:
        got = receive_ids()
        seen.update(got)
        return got

    receive_after_death(receive, probe, markers)
    return not probe <= seen


def _settled_more(lost: set[int], on_receipt: bool) -> str:
    """What a source that settled unacknowledged messages did, by whether it settles what it
    received without any acknowledgement (``on_receipt``)."""
    head = (
        f"{len(lost)} messages that were received and NOT acknowledged never came back (IDs "
        f"{_first(lost)}): "
    )
    if on_receipt:
        return head + (
            "messages a process received and never acknowledged were settled too (a probe "
            "received 5 new ones without acknowledging any, died, and they never came back): "
            "the source settles on receipt (acknowledged in receive(), or an auto-acknowledge "
            "session): messages the runtime has not stored yet are lost"
        )
    return head + (
        "messages received and never acknowledged do come back (a probe received 5 without "
        "acknowledging and died: they were redelivered), so acknowledge(ids) settled more than "
        "the IDs it was given (a cumulative acknowledgement: AMQP's multiple flag, JMS "
        "CLIENT_ACKNOWLEDGE's message.acknowledge()): messages the runtime has not stored yet "
        "are lost"
    )
