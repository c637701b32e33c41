"""How the runtime calls a transactional sink's ``in_doubt``, ``commit`` and ``rollback``,
counting what it finds and settles (for the metrics).

:class:`ScopedSink` stands between :class:`~epochal.protocols.two_phase.TwoPhaseCommit` and
the connector: it keeps only the ids of the scope the protocol asks for, and counts.
:func:`two_phase_commit` builds the protocol for one sink of one job, the only way the runtime
(the Spark sink adapter, ``epochal in-doubt``) builds it.
"""

from __future__ import annotations

import time
from typing import Any

from epochal.protocols.two_phase import FenceCheck, Step, TwoPhaseCommit
from epochal.state.store import SnapshotStore
from epochal_sdk import Prepared, RecoveryScope, TransactionalSink
from epochal_sdk.ids import Purpose, transaction_prefix


def in_doubt(sink: TransactionalSink, scope: RecoveryScope) -> list[Prepared]:
    """The sink's in-doubt transactions in ``scope`` (ids of another sink whose prefix merely
    starts like this one's are dropped)."""
    return [p for p in sink.in_doubt(scope) if scope.matches(p.transaction_id)]


class ScopedSink(TransactionalSink):
    """A connector's transactional sink as the two-phase commit protocol sees it: every
    ``in_doubt`` gets its scope; in-doubt transactions, commits, roll-backs and the time of
    commits are counted in :attr:`counts`.

    Args:
        sink: the connector's sink.
    """

    def __init__(self, sink: TransactionalSink) -> None:
        self.sink = sink
        self.counts: dict[str, float] = {}

    @property
    def options(self) -> Any:  # type: ignore[override]
        return self.sink.options

    def _count(self, key: str, value: float) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + value

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        found = in_doubt(self.sink, scope)
        self._count("in_doubt", len(found))
        return found

    def commit(self, prepared: Prepared) -> None:
        started = time.perf_counter()
        self.sink.commit(prepared)
        self._count("committed", 1)
        self._count("commit_seconds", time.perf_counter() - started)

    def rollback(self, prepared: Prepared) -> None:
        self.sink.rollback(prepared)
        self._count("rolled_back", 1)

    def begin(self, task: Any) -> Any:
        return self.sink.begin(task)

    def drain(self) -> dict[str, float]:
        """The counts so far, and start again from nothing."""
        out, self.counts = self.counts, {}
        return out


def two_phase_commit(
    store: SnapshotStore | None,
    sink: TransactionalSink,
    job: str,
    sink_id: str,
    *,
    incarnation: str,
    run: int | None,
    step: Step | None = None,
    fence: FenceCheck | None = None,
    lease_epoch: int = 0,
    purpose: Purpose = "recovery",
) -> tuple[TwoPhaseCommit, ScopedSink]:
    """The two-phase commit protocol for one sink of a job, and the scoped, counting sink it
    drives (read its :attr:`ScopedSink.counts` for the metrics). ``incarnation`` is the job's
    (:mod:`epochal_sdk.ids`; "" for a job recorded without one)."""
    prefix = transaction_prefix(job, sink_id, incarnation)
    scoped = ScopedSink(sink)
    extra: dict[str, Any] = {}
    if step is not None:
        extra["step"] = step
    if fence is not None:
        extra["fence"] = fence
    protocol = TwoPhaseCommit(
        store, scoped, sink_id, prefix, run=run, lease_epoch=lease_epoch, purpose=purpose, **extra
    )
    return protocol, scoped
