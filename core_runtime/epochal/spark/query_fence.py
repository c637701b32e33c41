"""The fence that stops one query: in a plain session's driver, the job's query is stopped
when its driver lost the job's lease, and the driver's other queries go on.

A session driver holds one lease per job, each through its own keeper process
(:mod:`epochal.control.lease_keeper`), which writes what it holds to the driver's session
record (:mod:`epochal.state.lease.session`). A :class:`QueryFence` (one per SparkSession,
added by ``epochal.register`` with the session check) watches the records of the jobs whose
queries started in this driver, from one thread of the driver's Python process:

- **the lease lost** (the keeper found it taken over, or could not renew it for half its
  TTL; :data:`~epochal.state.lease.session.LOST` in the record): it stops that job's
  queries (``StreamingQuery.stop()``) and notes in the record when they stopped
  (:data:`~epochal.state.lease.session.STOPPED`). The keeper waits for that up to
  :func:`~epochal.state.lease.session.query_stop_bound` (a quarter of the TTL) and kills
  the driver's JVM only when the query did not stop by then. Meanwhile, as always, every
  protocol step of the query checks the lease first (:mod:`epochal.state.lease.fence`).
- **the keeper died** (killed alone; the lease is then renewed by nobody): it stops the
  job's queries at once, long before the lease can lapse, and marks the record
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
    update_record,
)

log = logging.getLogger("epochal.query_fence")

POLL_SECONDS = 0.1
"""How often the fence reads the records it watches."""


class QueryFence:
    """Stops the queries of a job whose lease this driver lost (see the module doc)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._lock = threading.Lock()
        self._queries: dict[str, set[str]] = {}  # session record -> ids of running queries
        self._thread: threading.Thread | None = None

    def watch(self, record: str, query_id: str) -> None:
        """Watch the session record ``record`` for the query ``query_id`` (just started)."""
        update_record(record, **{WATCHER: os.getpid()})
        with self._lock:
            self._queries.setdefault(record, set()).add(query_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="epochal-query-fence", daemon=True
                )
                self._thread.start()

    def forget(self, query_id: str) -> None:
        """The query ended: nothing to stop for it any more."""
        with self._lock:
            for queries in self._queries.values():
                queries.discard(query_id)

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

    def _check(self, record: str, ids: set[str]) -> None:
        found = read_record(record)
        if found is None or found.get(STOPPED) or int(found.get(WATCHER) or 0) != os.getpid():
            return
        why = found.get(LOST)
        if not why:
            keeper = int(found.get("keeper") or 0)
            if not ids or not keeper or processes.alive(keeper):
                return
            why = (
                f"the job's lease keeper (pid {keeper}) died, so nobody renews the lease; "
                "this driver stopped the job's query before the lease can lapse (a new "
                "start of the query takes the lease again)"
            )
            update_record(record, **{LOST: why})
        self._stop(record, ids, str(why))

    def _stop(self, record: str, ids: set[str], why: str) -> None:
        started = time.monotonic()
        for query_id in ids:
            query = self.spark.streams.get(query_id)
            if query is not None:
                log.warning("epochal: stopping query %s: %s", query_id, why)
                with contextlib.suppress(Exception):  # stopping a failing query may raise
                    query.stop()
            self.forget(query_id)
        update_record(record, **{STOPPED: time.time()})
        log.warning(
            "epochal: %d query(ies) stopped in %.2fs: %s",
            len(ids),
            time.monotonic() - started,
            why,
        )
