"""The fence that stops one query: in a plain session's driver, the job's query is stopped
when its driver lost the job's lease, and the driver's other queries go on.

A session driver holds one lease per job, each through its own keeper process
(:mod:`epochal.control.lease_keeper`), which writes what it holds to the driver's session
record (:mod:`epochal.state.lease.session`). A :class:`QueryFence` (one per SparkSession,
added by ``epochal.register`` with the session check) watches the records of the jobs whose
queries started in this driver, from one thread of the driver's Python process:

- **the lease lost** (the keeper found it taken over, or could not renew it for half its
  TTL; :data:`~epochal.state.lease.session.LOST` in the record): it ends that job's
  queries as failed (their ``awaitTermination()`` raises, so an application's restarter
  sees it; ``stop()`` where that fails) and notes in the record when they ended
  (:data:`~epochal.state.lease.session.STOPPED`). The keeper waits for that up to
  :func:`~epochal.state.lease.session.query_stop_bound` (a quarter of the TTL) and kills
  the driver's JVM only when the query did not stop by then. Meanwhile, as always, every
  protocol step of the query checks the lease first (:mod:`epochal.state.lease.fence`).
- **the keeper died** (killed alone; the lease is then renewed by nobody): it starts the
  keeper again at once (:func:`~epochal.state.lease.session.restart_keeper`), which renews
  the lease with the dead keeper's owner and epoch, long before the lease can lapse (it
  was renewed at most a quarter TTL before); the query goes on. After
  :data:`KEEPER_RESTARTS` restarts for one holding, or when the keeper cannot be started,
  it stops the job's queries instead and marks the record
  :data:`~epochal.state.lease.session.LOST`, so the job's planners in this driver are
  refused; a new start of the query takes the lease again through a new keeper.

The fence writes its pid into each record it watches
(:data:`~epochal.state.lease.session.WATCHER`): a keeper whose record no live fence watches
(a query whose formats Spark found without ``epochal.register``) kills the JVM, as the only
way left to stop the job's query.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

from epochal.base import processes
from epochal.state.lease.session import (
    LOST,
    STOPPED,
    WATCHER,
    read_record,
    restart_keeper,
    update_record,
)

log = logging.getLogger("epochal.query_fence")

POLL_SECONDS = 0.1
"""How often the fence reads the records it watches."""
FAIL_SECONDS = 0.5
"""How long the fence waits for a query it interrupted to end before it stops it."""
KEEPER_RESTARTS = 3
"""How many times the fence starts a dead keeper again for one holding before it stops the
job's query instead."""


class QueryFence:
    """Stops the queries of a job whose lease this driver lost (see the module doc)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._lock = threading.Lock()
        # session record -> the running queries of its job: (query id, run id) each
        self._queries: dict[str, set[tuple[str, str]]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, record: str, query_id: str, run_id: str) -> None:
        """Watch the session record ``record`` for the query ``query_id``, started just now
        as its run ``run_id`` (Spark's: a query started again keeps its id, not its run)."""
        update_record(record, **{WATCHER: os.getpid()})
        with self._lock:
            self._queries.setdefault(record, set()).add((query_id, run_id))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="epochal-query-fence", daemon=True
                )
                self._thread.start()

    def forget(self, run_id: str) -> None:
        """The query's run ``run_id`` ended: nothing to stop for it any more (a late event
        of an earlier run of the query touches nothing of its run now)."""
        with self._lock:
            for queries in self._queries.values():
                for query in [q for q in queries if q[1] == run_id]:
                    queries.discard(query)

    def _run(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            with self._lock:
                watched = {record: set(ids) for record, ids in self._queries.items()}
            for record, ids in watched.items():
                try:
                    self._check(record, ids)
                except Exception as exc:  # the fence must go on watching the other jobs
                    log.warning("epochal: the query fence could not check %s: %s", record, exc)

    def _check(self, record: str, ids: set[tuple[str, str]]) -> None:
        found = read_record(record)
        if found is None or found.get(STOPPED) or int(found.get(WATCHER) or 0) != os.getpid():
            return
        why = found.get(LOST)
        if not why:
            keeper = int(found.get("keeper") or 0)
            if not ids or not keeper or processes.alive(keeper):
                return
            restarts = int(found.get("keeper_restarts") or 0)
            if restarts < KEEPER_RESTARTS:
                started = restart_keeper(record)
                log.warning(
                    "epochal: the lease keeper (pid %s) of %s died; started it again (pid %s)",
                    keeper,
                    record,
                    started,
                )
                if started:
                    return
            why = (
                f"the job's lease keeper (pid {keeper}) died and could not be kept going "
                f"({restarts} restart(s)), so nobody renews the lease; this driver stopped "
                "the job's query before the lease can lapse (a new start of the query takes "
                "the lease again)"
            )
            update_record(record, **{LOST: why})
        self._stop(record, ids, str(why))

    def _stop(self, record: str, ids: set[tuple[str, str]], why: str) -> None:
        started = time.monotonic()
        for query_id, run_id in ids:
            query = self.spark.streams.get(query_id)
            if query is not None and str(query.runId) == run_id:
                log.warning("epochal: stopping query %s: %s", query_id, why)
                self._end_failed(query)
            self.forget(run_id)
        update_record(record, **{STOPPED: time.time()})
        log.warning(
            "epochal: %d query(ies) stopped in %.2fs: %s",
            len(ids),
            time.monotonic() - started,
            why,
        )

    def _end_failed(self, query: Any) -> None:
        """End ``query`` as a failed query, so that whoever waits for it sees an error (its
        ``awaitTermination()`` raises; an application's restarter then starts it again, and
        the new start meets the lease as it is): cancel its Spark jobs and interrupt its
        micro-batch thread, as ``stop()`` does, but without marking it stopped (Spark then
        ends the query with the interruption as its failure). Where that cannot be done, or
        the query still runs after :data:`FAIL_SECONDS`, it is stopped."""
        with contextlib.suppress(Exception):
            self.spark.sparkContext.cancelJobGroup(str(query.runId))
            query._jsq.streamingQuery().queryExecutionThread().interrupt()
            deadline = time.monotonic() + FAIL_SECONDS
            while query.isActive and time.monotonic() < deadline:
                time.sleep(0.02)
        with contextlib.suppress(Exception):  # stopping a failing query may raise
            if query.isActive:
                query.stop()
