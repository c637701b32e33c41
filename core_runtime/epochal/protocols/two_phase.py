"""The two-phase commit protocol for transactional sinks, in one place.

Phase 1 happens in the tasks (``begin``/``write``/``prepare``). On the driver, for batch B:

1. :meth:`TwoPhaseCommit.decide` records the decision (the prepared transactions of B)
   durably in the snapshot store. From here on B *will* be committed, whatever crashes.
2. :meth:`TwoPhaseCommit.complete` commits every transaction of the decision (phase 2; the
   sink's ``commit`` is idempotent, so a retry after a crash is safe), rolls back the other
   prepared transactions of B (failed task attempts) and records that B is done.

Recovery (:meth:`TwoPhaseCommit.recover`, at the start of every run, before any task): finish
every decided batch, roll back every other in-doubt transaction of the job. A replayed batch
that was already decided writes nothing (:meth:`is_decided` is checked by the tasks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from epochal.store import SnapshotStore
from epochal_sdk import FencedError, Prepared, TransactionalSink, batch_of

log = logging.getLogger("epochal.2pc")

Step = Callable[[str, int], None]


def _no_step(point: str, batch: int) -> None:
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
    """Drives one transactional sink of one job through the protocol."""

    def __init__(
        self,
        store: SnapshotStore | None,
        sink: TransactionalSink,
        sink_id: str,
        prefix: str,
        *,
        step: Step = _no_step,
        lease_epoch: int = 0,
        current_epoch: Callable[[], int] | None = None,
    ) -> None:
        self.store, self.sink, self.sink_id, self.prefix = store, sink, sink_id, prefix
        self.step = step
        self.lease_epoch = lease_epoch
        self.current_epoch = current_epoch

    def _decision_key(self, batch: int) -> str:
        return f"sinks/{self.sink_id}/decisions/{batch:012d}"

    def _done_key(self, batch: int) -> str:
        return f"sinks/{self.sink_id}/done/{batch:012d}"

    def is_decided(self, batch: int) -> bool:
        """Whether batch ``batch`` has a recorded commit decision."""
        return self.store.exists(self._decision_key(batch))

    def decision(self, batch: int) -> list[Prepared]:
        """The transactions decided for ``batch`` (verified read)."""
        record = self.store.read_json(self._decision_key(batch))
        return [Prepared(t["id"], t.get("data")) for t in record["transactions"]]

    def decide(self, batch: int, prepared: Iterable[Prepared]) -> list[Prepared]:
        """Record the decision for ``batch`` durably (once: a second call keeps the first)."""
        if self.is_decided(batch):
            return self.decision(batch)
        self._check_fence(batch)
        chosen = list(prepared)
        record = {
            "batch": batch,
            "lease_epoch": self.lease_epoch,
            "transactions": [{"id": p.transaction_id, "data": p.data} for p in chosen],
        }
        self.store.write_json(self._decision_key(batch), record, count=len(chosen))
        self.step("sink.after_decision", batch)
        return chosen

    def complete(self, batch: int) -> None:
        """Phase 2 for a decided batch, then roll back its other prepared attempts."""
        decided = self.decision(batch)
        for index, prepared in enumerate(decided):
            self.sink.commit(prepared)
            if index == 0 and len(decided) > 1:
                self.step("sink.mid_commit", batch)
        self.rollback_strays(batch, keep={p.transaction_id for p in decided})
        if not self.store.exists(self._done_key(batch)):
            self.store.write_json(self._done_key(batch), {"batch": batch}, count=len(decided))

    def rollback_strays(self, batch: int, keep: set[str] | frozenset[str] = frozenset()) -> int:
        """Roll back the prepared transactions of ``batch`` not in ``keep`` (attempts of
        tasks that died after phase 1). Returns how many."""
        count = 0
        for stray in self._in_doubt(batch):
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
        for p in prepared:
            if p is not None:
                self.sink.rollback(p)

    def recover(self) -> RecoveryReport:
        """Finish decided batches and roll back every other in-doubt transaction of the job.

        Call only when no task of this job is running (at the start of a run).
        """
        if self.store is None:  # no decisions anywhere: every in-doubt transaction is a stray
            strays = self._in_doubt()
            for stray in strays:
                self.sink.rollback(stray)
            return RecoveryReport([], [s.transaction_id for s in strays])
        decided_keys = self.store.list(f"sinks/{self.sink_id}/decisions")
        done = {k.rsplit("/", 1)[1] for k in self.store.list(f"sinks/{self.sink_id}/done")}
        completed = []
        decided_ids: set[str] = set()
        for key in decided_keys:
            batch = int(key.rsplit("/", 1)[1])
            if key.rsplit("/", 1)[1] not in done:
                self.complete(batch)
                completed.append(batch)
        for key in decided_keys[-50:]:
            decided_ids |= {p.transaction_id for p in self.decision(int(key.rsplit("/", 1)[1]))}
        rolled_back = []
        for stray in self._in_doubt():
            if stray.transaction_id in decided_ids:
                self.sink.commit(stray)  # decided but not visible yet: finish it
                continue
            self.sink.rollback(stray)
            rolled_back.append(stray.transaction_id)
        return RecoveryReport(completed, rolled_back)

    def prune(self, keep_after: int) -> None:
        """Forget the records of done batches before ``keep_after``."""
        for key in self.store.list(f"sinks/{self.sink_id}/done"):
            batch = int(key.rsplit("/", 1)[1])
            if batch < keep_after:
                self.store.delete(self._decision_key(batch))
                self.store.delete(key)

    def _in_doubt(self, batch: int | None = None) -> list[Prepared]:
        """This sink's in-doubt transactions (of one batch): ids that are exactly
        ``<prefix>.<batch>.<partition>.<run>.<attempt>``, never another sink's whose id merely
        starts like ours."""
        head = f"{self.prefix}." if batch is None else f"{self.prefix}.{batch}."
        found = []
        for prepared in self.sink.in_doubt(head):
            rest = prepared.transaction_id[len(self.prefix) + 1 :].split(".")
            if len(rest) == 4 and all(part.isdigit() for part in rest):
                found.append(prepared)
        return found

    def _check_fence(self, batch: int) -> None:
        if self.current_epoch is None:
            return
        now = self.current_epoch()
        if now != self.lease_epoch:
            raise FencedError(
                f"batch {batch}: this driver holds lease epoch {self.lease_epoch} but the job's "
                f"lease is at epoch {now}: another driver owns the job; not deciding"
            )


def batches_of(prepared: Iterable[Prepared]) -> set[int]:
    """The batch ids found in these transaction ids."""
    return {batch_of(p.transaction_id) for p in prepared}
