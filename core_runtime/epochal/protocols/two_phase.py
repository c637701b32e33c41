"""The two-phase commit protocol for transactional sinks, in one place.

Phase 1 happens in the tasks (``begin``/``write``/``prepare``). On the driver, for batch B:

1. :meth:`TwoPhaseCommit.decide` records the decision (the prepared transactions of B)
   durably in the snapshot store, as an entry that is never overwritten (the first writer
   wins). From here on B *will* be committed, whatever crashes.
2. :meth:`TwoPhaseCommit.complete` commits every transaction of the decision (phase 2; the
   sink's ``commit`` is idempotent, so a retry after a crash is safe), rolls back the other
   prepared transactions of B (failed task attempts) and records that B is done.

Recovery (:meth:`TwoPhaseCommit.recover`, at the start of every run, before any task): finish
every decided batch, roll back every other in-doubt transaction of earlier runs. A replayed
batch that was already decided writes nothing (:meth:`is_decided` is checked by the tasks).

Fencing (see :mod:`epochal.state.lease.fence`): the fence is checked before a decision, after it is
recorded, before phase 2 and before recovery rolls anything back; a run only ever rolls back
transactions of its own or earlier runs (the run is part of every transaction id), so a
zombie can never undo what a newer run prepared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from epochal.state.store import EntryExistsError, SnapshotStore
from epochal_sdk import Prepared, RecoveryScope, TransactionalSink, TransactionId
from epochal_sdk.ids import Purpose

log = logging.getLogger("epochal.2pc")

SINKS = "sinks"
"""The snapshot store's directory of sink records: ``sinks/<id>/decisions/<batch>`` (the
commit decision), ``sinks/<id>/done/<batch>`` (phase 2 finished)."""
RECOVERY_LOOKBACK = 50
"""How many of the last decided batches recovery looks at for decided transactions that are
still in doubt (a decision older than that was completed by an earlier recovery)."""

Step = Callable[[str, int], None]
FenceCheck = Callable[[str], None]


def _no_step(point: str, batch: int) -> None:
    return None


def _no_fence(doing: str) -> None:
    return None


@dataclass
class RecoveryReport:
    """What recovery did."""

    completed_batches: list[int]
    rolled_back: list[str]

    def __str__(self) -> str:
        return (
            f"finished {len(self.completed_batches)} decided batch(es) "
            f"{self.completed_batches}, rolled back {len(self.rolled_back)} undecided "
            "transaction(s)"
        )


class TwoPhaseCommit:
    """Drives one transactional sink of one job through the protocol.

    Args:
        store: the run's snapshot store (None for a query without one: only stray
            roll-back works then).
        sink: the connector's sink.
        sink_id: the sink's id in the job.
        prefix: the transaction id prefix of the sink (``transaction_prefix``).
        run: the run this protocol acts for; transactions of later runs are never touched.
        step: called at each named protocol step (crash points in tests).
        fence: raises ``FencedError`` when this run no longer holds the job's lease.
        lease_epoch: recorded with each decision (for operators).
        purpose: what a look-up of every batch is for: ``recovery`` (a run's start, an
            operator settling) or ``inspect`` (an operator listing; nothing changes).
    """

    def __init__(
        self,
        store: SnapshotStore | None,
        sink: TransactionalSink,
        sink_id: str,
        prefix: str,
        *,
        run: int | None = None,
        step: Step = _no_step,
        fence: FenceCheck = _no_fence,
        lease_epoch: int = 0,
        purpose: Purpose = "recovery",
    ) -> None:
        self.store, self.sink, self.sink_id, self.prefix = store, sink, sink_id, prefix
        self.run = run
        self.purpose: Purpose = purpose
        self.step = step
        self.fence = fence
        self.lease_epoch = lease_epoch

    def _decision_key(self, batch: int) -> str:
        return f"{self._decisions}/{batch:012d}"

    def _done_key(self, batch: int) -> str:
        return f"{self._done}/{batch:012d}"

    @property
    def _decisions(self) -> str:
        return f"{SINKS}/{self.sink_id}/decisions"

    @property
    def _done(self) -> str:
        return f"{SINKS}/{self.sink_id}/done"

    def decided_batches(self) -> list[int]:
        """Every batch with a recorded decision, oldest first."""
        return [int(key.rsplit("/", 1)[1]) for key in self._store().list(self._decisions)]

    def done_batches(self) -> set[int]:
        """The batches whose phase 2 finished."""
        return {int(key.rsplit("/", 1)[1]) for key in self._store().list(self._done)}

    def decided_ids(self, last: int | None = None) -> set[str]:
        """The transaction ids of every decision (of the ``last`` decided batches only)."""
        batches = self.decided_batches()
        ids: set[str] = set()
        for batch in batches[-last:] if last else batches:
            ids |= {p.transaction_id for p in self.decision(batch)}
        return ids

    def _store(self) -> SnapshotStore:
        if self.store is None:
            raise RuntimeError("the two-phase commit protocol needs a snapshot store here")
        return self.store

    def is_decided(self, batch: int) -> bool:
        """Whether batch ``batch`` has a recorded commit decision."""
        return self._store().exists(self._decision_key(batch))

    def decision(self, batch: int) -> list[Prepared]:
        """The transactions decided for ``batch`` (verified read)."""
        record = self._store().read_json(self._decision_key(batch))
        return [Prepared(t["id"], t.get("data")) for t in record["transactions"]]

    def decide(
        self, batch: int, prepared: Iterable[Prepared], records: int | None = None
    ) -> list[Prepared]:
        """Record the decision for ``batch`` durably (once: a second call, or a second
        writer, keeps the first decision), with the number of ``records`` its transactions
        hold (for :meth:`committed_records`)."""
        if self.is_decided(batch):
            return self.decision(batch)
        chosen = list(prepared)
        self.step("sink.before_decision", batch)
        self.fence(f"batch {batch}: deciding the commit")
        record = {
            "batch": batch,
            "lease_epoch": self.lease_epoch,
            "run": self.run,
            "transactions": [{"id": p.transaction_id, "data": p.data} for p in chosen],
            "records": records,
        }
        try:
            self._store().write_json(
                self._decision_key(batch), record, count=len(chosen), exclusive=True
            )
        except EntryExistsError:
            log.warning("batch %s was decided by another writer; keeping its decision", batch)
            self.fence(f"batch {batch}: decided by another writer")
            return self.decision(batch)
        # Recorded before a take-over moved the state: the new owner completes it. After:
        # the write failed above. Either way, a run that lost the lease stops here.
        self.fence(f"batch {batch}: decision recorded")
        self.step("sink.after_decision", batch)
        return chosen

    def committed_records(self, batch: int) -> int | None:
        """The records of ``batch``'s decided transactions, as its decision recorded them
        (None: not recorded, or the decision is gone)."""
        if not self.is_decided(batch):
            return None
        records = self._store().read_json(self._decision_key(batch)).get("records")
        return None if records is None else int(records)

    def complete(self, batch: int) -> None:
        """Phase 2 for a decided batch, then roll back its other prepared attempts."""
        decided = self.decision(batch)
        self.fence(f"batch {batch}: phase-2 commit")
        for index, prepared in enumerate(decided):
            self.sink.commit(prepared)
            if index == 0 and len(decided) > 1:
                self.step("sink.mid_commit", batch)
        self.rollback_strays(batch, keep={p.transaction_id for p in decided})
        if not self._store().exists(self._done_key(batch)):
            self._store().write_json(self._done_key(batch), {"batch": batch}, count=len(decided))

    def rollback_strays(self, batch: int, keep: set[str] | frozenset[str] = frozenset()) -> int:
        """Roll back the prepared transactions of ``batch`` not in ``keep`` (attempts of
        tasks that died after phase 1) of this run or earlier ones. Returns how many."""
        count = 0
        for stray in self._in_doubt(batch, up_to_run=self.run):
            if stray.transaction_id not in keep:
                log.info("batch %s: rolling back failed attempt %s", batch, stray.transaction_id)
                self.sink.rollback(stray)
                count += 1
        return count

    def commit_batch(self, batch: int, prepared: Iterable[Prepared]) -> None:
        """The driver side of one batch: decide, then complete."""
        self.decide(batch, prepared)
        self.complete(batch)

    def abort_batch(self, batch: int, prepared: Iterable[Prepared | None]) -> None:
        """Spark gave up on the batch: roll back what its tasks prepared (unless decided)."""
        if self.is_decided(batch):
            log.warning("batch %s was already decided; completing it instead of aborting", batch)
            self.complete(batch)
            return
        self.fence(f"batch {batch}: rolling back an aborted batch")
        for p in prepared:
            if p is not None:
                self.sink.rollback(p)

    def recover(self) -> RecoveryReport:
        """Finish decided batches and roll back every other in-doubt transaction of the
        earlier runs of the job. Call only when no task of this run is running (at the start
        of a run)."""
        self.fence("recovery at the start of the run")
        earlier = None if self.run is None else self.run - 1
        if self.store is None:  # no decisions anywhere: every in-doubt transaction is a stray
            strays = self._in_doubt(up_to_run=earlier)
            for stray in strays:
                self.sink.rollback(stray)
            return RecoveryReport([], [s.transaction_id for s in strays])
        done = self.done_batches()
        completed = []
        for batch in self.decided_batches():
            if batch not in done:
                self.complete(batch)
                completed.append(batch)
        decided_ids = self.decided_ids(last=RECOVERY_LOOKBACK)
        in_doubt = self._in_doubt(up_to_run=earlier)
        self.fence("recovery: rolling back undecided transactions")
        rolled_back = []
        for stray in in_doubt:
            if stray.transaction_id in decided_ids:
                self.sink.commit(stray)  # decided but not visible yet: finish it
                continue
            self.sink.rollback(stray)
            rolled_back.append(stray.transaction_id)
        return RecoveryReport(completed, rolled_back)

    def prune(self, keep_after: int) -> None:
        """Forget the records of done batches before ``keep_after``."""
        store = self._store()
        for batch in sorted(self.done_batches()):
            if batch < keep_after:
                store.delete(self._decision_key(batch))
                store.delete(self._done_key(batch))

    def _in_doubt(self, batch: int | None = None, up_to_run: int | None = None) -> list[Prepared]:
        """This sink's in-doubt transactions (of one batch, of runs up to ``up_to_run``):
        ids that parse as this sink's :class:`TransactionId`, never another sink's whose id
        merely starts like ours, never one of a later run (a newer driver's)."""
        scope = (
            RecoveryScope(self.prefix, self.purpose, None, self.run)
            if batch is None
            else RecoveryScope(self.prefix, "batch", batch, self.run)
        )
        found = []
        for prepared in self.sink.in_doubt(scope):
            txn = TransactionId.parse(prepared.transaction_id, self.prefix)
            if txn is None or (batch is not None and txn.batch != batch):
                continue
            if up_to_run is not None and txn.run > up_to_run:
                continue
            found.append(prepared)
        return found


def recorded_decisions(store: SnapshotStore) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Every commit decision in a run's snapshot store: (sink id, batch, the record: its
    transactions, the lease epoch and the run that decided)."""
    for sink_id in store.list_dirs(SINKS):
        for key in store.list(f"{SINKS}/{sink_id}/decisions"):
            yield sink_id, int(key.rsplit("/", 1)[1]), store.read_json(key)


def pending_decisions(store: SnapshotStore, sink_id: str) -> list[str]:
    """The transactions a run's snapshot store decided to commit in sink ``sink_id`` whose
    phase 2 is not recorded as done (what an operator must know is still to be committed)."""
    done = {key.rsplit("/", 1)[1] for key in store.list(f"{SINKS}/{sink_id}/done")}
    pending: list[str] = []
    for key in store.list(f"{SINKS}/{sink_id}/decisions"):
        if key.rsplit("/", 1)[1] not in done:
            pending += [t["id"] for t in store.read_json(key)["transactions"]]
    return sorted(pending)


def batches_of(prepared: Iterable[Prepared]) -> set[int]:
    """The batch ids found in these transaction ids."""
    return {TransactionId.of(p.transaction_id).batch for p in prepared}
