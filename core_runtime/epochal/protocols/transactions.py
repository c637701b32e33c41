"""How the runtime calls a transactional sink's ``in_doubt``, ``commit`` and ``rollback``:
with an explicit :class:`~epochal_sdk.RecoveryScope`, for sinks written before the scope
too, and counting what it finds and settles (for the metrics).

:class:`ScopedSink` stands between :class:`~epochal.protocols.two_phase.TwoPhaseCommit` and
the connector: the protocol asks for the in-doubt transactions of one batch or of every batch
(recovery); the sink is told which, with a scope, instead of guessing it from the prefix.
:func:`two_phase_commit` builds the protocol for one sink of one job, the only way the runtime
(the Spark sink adapter, ``epochal in-doubt``) builds it.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from typing import Any

from epochal.protocols.two_phase import FenceCheck, Step, TwoPhaseCommit
from epochal.state.store import SnapshotStore
from epochal_sdk import Prepared, RecoveryScope, TransactionalSink, transaction_prefix


@functools.cache
def _takes_scope(cls: type) -> bool:
    """Whether ``cls.in_doubt`` accepts the scope (sinks written before it take a prefix)."""
    try:
        parameters = list(inspect.signature(cls.in_doubt).parameters.values())[1:]
    except (TypeError, ValueError):
        return True
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return True
    if any(p.name == "scope" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return True
    return len(parameters) >= 2


def in_doubt(sink: TransactionalSink, scope: RecoveryScope) -> list[Prepared]:
    """The sink's in-doubt transactions in ``scope`` (ids of another sink whose prefix merely
    starts like this one's are dropped). A sink whose ``in_doubt`` takes no scope is called
    with the prefix alone, with a ``DeprecationWarning``."""
    return [p for p in call_in_doubt(sink, scope.head, scope) if scope.matches(p.transaction_id)]


def call_in_doubt(sink: TransactionalSink, head: str, scope: RecoveryScope) -> list[Prepared]:
    """``sink.in_doubt(head, scope)``, or ``sink.in_doubt(head)`` for a sink written before
    the scope existed (with a ``DeprecationWarning``); nothing filtered."""
    if _takes_scope(type(sink)):
        return list(sink.in_doubt(head, scope))
    warnings.warn(
        f"{type(sink).__module__}.{type(sink).__name__}.in_doubt(prefix) takes no scope; "
        "implement in_doubt(prefix, scope=None) (epochal_sdk.RecoveryScope), the "
        "prefix-only form will stop being called in a later release",
        DeprecationWarning,
        stacklevel=3,
    )
    return list(sink.in_doubt(head))  # type: ignore[call-arg]


class ScopedSink(TransactionalSink):
    """A connector's transactional sink as the two-phase commit protocol sees it: every
    ``in_doubt`` gets its scope; in-doubt transactions, commits, roll-backs and the time of
    commits are counted in :attr:`counts`.

    Args:
        sink: the connector's sink.
        prefix: the sink's transaction id prefix.
        run: the run the protocol acts for (None for an operator).
        purpose: the scope of a look-up of every batch: ``recovery`` (a run's start, an
            operator settling) or ``inspect`` (an operator listing).
    """

    def __init__(
        self,
        sink: TransactionalSink,
        prefix: str,
        run: int | None,
        purpose: str = "recovery",
    ) -> None:
        self.sink, self.prefix, self.run, self.purpose = sink, prefix, run, purpose
        self.counts: dict[str, float] = {}

    @property
    def options(self) -> Any:  # type: ignore[override]
        return self.sink.options

    def _count(self, key: str, value: float) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + value

    def scope(self, head: str) -> RecoveryScope:
        """The scope of a look-up by ``head`` (``<prefix>.`` or ``<prefix>.<batch>.``, as
        :class:`TwoPhaseCommit` asks)."""
        rest = head[len(self.prefix) + 1 :].rstrip(".") if head.startswith(self.prefix) else ""
        if rest.isdigit():
            return RecoveryScope(self.prefix, "batch", int(rest), self.run)
        return RecoveryScope(self.prefix, self.purpose, None, self.run)  # type: ignore[arg-type]

    def in_doubt(self, prefix: str, scope: RecoveryScope | None = None) -> list[Prepared]:
        found = in_doubt(self.sink, scope or self.scope(prefix))
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
    run: int | None,
    step: Step | None = None,
    fence: FenceCheck | None = None,
    lease_epoch: int = 0,
    purpose: str = "recovery",
) -> tuple[TwoPhaseCommit, ScopedSink]:
    """The two-phase commit protocol for one sink of a job, and the scoped, counting sink it
    drives (read its :attr:`ScopedSink.counts` for the metrics)."""
    prefix = transaction_prefix(job, sink_id)
    scoped = ScopedSink(sink, prefix, run, purpose)
    extra: dict[str, Any] = {}
    if step is not None:
        extra["step"] = step
    if fence is not None:
        extra["fence"] = fence
    protocol = TwoPhaseCommit(
        store, scoped, sink_id, prefix, run=run, lease_epoch=lease_epoch, **extra
    )
    return protocol, scoped
