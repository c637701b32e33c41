"""The guards of a driver process: what stops it, or its query, when it may no longer act.

A driver never outlives its supervisor or its lease: it dies with its parent (the kernel's
parent-death signal, and its stdin closing: :class:`Supervision`), and a watchdog kills the
whole run (every process with the run's token) when the lease moved to another epoch or was
not renewed for half its time-to-live (:class:`LeaseWatchdog`), so it has stopped before any
other driver may take over. A restart on a cluster waits for the split-brain quorum of
executors (:func:`check_quorum`). A query whose Python source runner died is stopped at once
instead of at Spark's next call into it (:class:`SourceRunnerWatch`, :class:`QueryWatch`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from epochal.base import processes
from epochal.config import JobConfig
from epochal.control.failures import STOPPED_ON_ITS_OWN_MARK, failure_text
from epochal.control.messages import HEARTBEAT_SECONDS, Promotion, emit
from epochal.driver.session import (
    executor_count,
    expected_executors,
    running_jobs,
    wait_for_executors,
)
from epochal.state.jobs import JobDirectory
from epochal.state.lease.fence import Fence
from epochal.state.lease.record import LEASE_TTL


def self_destruct(reason: str) -> None:
    """Kill every process of this driver run (PySpark daemons and workers included), then
    this one. Used when the run must stop *now*: fenced, orphaned, lease not renewed."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"epochal driver: {reason}; killing this driver run\n")
        sys.stderr.flush()
    token = os.environ.get(processes.RUN_TOKEN_ENV, "")
    for pid in processes.processes_of(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _heartbeats() -> None:
    while True:
        emit({"type": "heartbeat", "at": time.time()})
        time.sleep(HEARTBEAT_SECONDS)


class Supervision:
    """What the driver gets from its supervisor: stdin (promotion; EOF = the supervisor is
    gone) and the parent-death signal."""

    def __init__(self) -> None:
        self.supervisor_pid = int(os.environ.get(processes.SUPERVISOR_PID_ENV, os.getppid()))
        self._promotion: Promotion | None = None
        self._promoted = threading.Event()

    def start(self) -> None:
        processes.die_with_parent(signal.SIGKILL)
        if os.getppid() != self.supervisor_pid:
            self_destruct("the supervisor died before this driver started")
        threading.Thread(target=self._read_stdin, name="epochal-stdin", daemon=True).start()
        threading.Thread(target=_heartbeats, name="epochal-heartbeat", daemon=True).start()

    def _read_stdin(self) -> None:
        for line in sys.stdin:
            promotion = Promotion.parse(line)
            if promotion is not None:
                self._promotion = promotion
                self._promoted.set()
        self_destruct("the supervisor is gone (its pipe closed)")

    @property
    def promoted(self) -> bool:
        """Whether the supervisor has promoted this driver (the job is waiting for it)."""
        return self._promoted.is_set()

    def wait_for_promotion(
        self, meanwhile: Callable[[], object] | None = None, every: float = 0.0
    ) -> Promotion:
        """Block until the supervisor promotes this warm driver: the lease epoch it runs at,
        the job (snapshot directory, name) and the supervisor's environment. ``meanwhile``
        (if given) is called every ``every`` seconds while it waits."""
        while not self._promoted.wait(every if meanwhile is not None else None):
            assert meanwhile is not None
            meanwhile()
        assert self._promotion is not None
        return self._promotion


class LeaseWatchdog:
    """Stops the whole driver run as soon as it may no longer act: the lease moved to another
    epoch, or it was not renewed (or could not be read) for half its time-to-live, which is
    before any other supervisor may take the job over."""

    def __init__(self, jobdir: JobDirectory, epoch: int, supervisor_pid: int) -> None:
        self.jobdir, self.epoch, self.supervisor_pid = jobdir, epoch, supervisor_pid

    def start(self) -> None:
        threading.Thread(target=self._watch, name="epochal-lease-watchdog", daemon=True).start()

    def _watch(self) -> None:
        last_ok = time.monotonic()
        while True:
            lease = None
            with contextlib.suppress(Exception):
                lease = self.jobdir.lease.read()
            ttl = lease.ttl if lease else LEASE_TTL
            margin = ttl / 2
            if os.getppid() != self.supervisor_pid:
                self_destruct("the supervisor died")
            if lease is not None:
                if not self.jobdir.fence(self.epoch).holds(lease.epoch):
                    self_destruct(
                        f"fenced: the job's lease moved from epoch {self.epoch} to "
                        f"{lease.epoch} (pid {lease.pid})"
                    )
                age = lease.age()
                if age > margin:
                    self_destruct(f"the lease was not renewed for {age:.1f}s (limit {margin}s)")
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > margin:
                self_destruct(f"the lease could not be read for {margin}s")
            time.sleep(min(0.5, ttl / 20))


QUORUM_WAIT_ENV = "EPOCHAL_QUORUM_WAIT_SECONDS"
"""How long a restart waits for the split-brain quorum of executors (default 30 s)."""


class QuorumNotMetError(Exception):
    """Fewer executors than the split-brain quorum; retry later."""


def check_quorum(spark: Any, jobdir: JobDirectory, fence: Fence, config: JobConfig) -> None:
    """Wait for the executors the job asks for, record how many it first ran with, and under
    split-brain protection refuse a restart (restartably) with fewer than ``original/2 + 1``."""
    wanted = expected_executors(config.master, dict(config.spark_conf))
    if config.master.startswith("local") or jobdir.load().original_executors is None:
        count = wait_for_executors(spark, wanted, 120)
    else:  # a restart on a cluster: what is there now (the quorum check waits below)
        count = executor_count(spark)
    with jobdir.update(fence) as current:
        if current.original_executors is None:
            current.original_executors = count
        original = current.original_executors
    if config.split_brain_protection:
        quorum = original // 2 + 1
        count = wait_for_executors(spark, quorum, float(os.environ.get(QUORUM_WAIT_ENV, "30")))
        if count < quorum:
            raise QuorumNotMetError(
                f"QuorumNotMet: job {jobdir.name!r} first ran with {original} "
                f"executors; a restart needs {quorum} (split-brain protection) but only "
                f"{count} are up"
            )


SOURCE_RUNNER_MODULE = b"python_streaming_source_runner"
"""What PySpark's streaming source runner (one Python process per Python source of a query,
kept for the query's whole run) shows in its command line."""
RUNNER_DEATH_MARK = "PythonStreamingSourceRunner"
"""Begins the failure text of a run whose source runner the driver saw die (a crashed
Python worker on the driver: restarted in place, see :mod:`epochal.control.failures`)."""


class SourceRunnerWatch:
    """Notices at once when a streaming source runner of the query dies (killed, crashed).

    Spark notices only at its next call into the runner: the next trigger, or the end of the
    batch in flight, a whole trigger interval later at worst; the driver stops the query and
    restarts it in place now instead. The runners are the children of the driver's JVM
    started after the query (looked for until the query's first batch, at most
    ``LOOK_SECONDS``; a query without Python sources has none)."""

    LOOK_SECONDS = 60.0

    def __init__(self, jvm_pid: int | None) -> None:
        self.jvm_pid = jvm_pid
        self.before = set(self._runners())
        self.pids: set[int] = set()
        self.looking_until = time.monotonic() + self.LOOK_SECONDS

    def _runners(self) -> list[int]:
        if self.jvm_pid is None:
            return []
        return processes.children_running(self.jvm_pid, SOURCE_RUNNER_MODULE)

    def dead(self, first_batch_seen: bool) -> int | None:
        """A runner of this query that has died since it started (its pid), else None."""
        if not first_batch_seen and time.monotonic() < self.looking_until:
            self.pids.update(p for p in self._runners() if p not in self.before)
        return next((pid for pid in sorted(self.pids) if not processes.alive(pid)), None)


def jvm_pid(spark: Any) -> int | None:
    """The pid of the driver's JVM (PySpark started it as a child of this process)."""
    with contextlib.suppress(Exception):
        return int(spark.sparkContext._gateway.proc.pid)
    return None


WATCH_POLL_SECONDS = 0.1
#: How long a query whose source runner died may take to end by itself (a stopping query
#: stops its runners first, then ends) before the driver stops it.
ENDING_GRACE_SECONDS = 0.3
#: The longest the driver lets a batch in flight finish after its source runner died.
BATCH_IN_FLIGHT_SECONDS = 10.0
#: What the driver's log says while it lets that batch finish.
BATCH_IN_FLIGHT_NOTE = (
    "the query's source runner died while a batch runs; letting the batch finish (its "
    "Python workers stay in the pool) before the query is restarted in place"
)


class QueryWatch:
    """Watches a run's query until it ends: a suspend or cancel request in the job record
    stops it; a dead source runner (:class:`SourceRunnerWatch`) stops it at once (after the
    batch in flight, see :func:`ends_by_itself`)."""

    def __init__(self, spark: Any, jobdir: JobDirectory, runners: SourceRunnerWatch) -> None:
        self.spark, self.jobdir, self.runners = spark, jobdir, runners

    def until_ended(
        self, query: Any, first_batch_seen: Callable[[], bool], *, available_now: bool, job: str
    ) -> str | None:
        """Until the query ends: None when it finished (available-now) or was stopped on
        request, else the text of its failure. A continuous job's query that stops by itself
        is a failure too: the job must go on, so it is restarted, never marked completed."""
        while query.isActive:
            try:
                query.awaitTermination(WATCH_POLL_SECONDS)
            except Exception:  # it failed: query.exception() below has the whole story
                break
            requested = self.jobdir.load().requested
            if requested in ("cancel", "suspend"):
                query.stop()
                return None
            dead = self.runners.dead(first_batch_seen())
            if dead is not None and not ends_by_itself(self.spark, query):
                query.stop()
                return (
                    f"{RUNNER_DEATH_MARK}: the query's Python streaming source runner (pid "
                    f"{dead}) died (killed or crashed); the driver stops the query now rather "
                    "than at Spark's next call into it, and restarts it in place"
                )
        error = query.exception()
        if error is not None:
            return failure_text(error)
        if available_now or self.jobdir.load().requested in ("cancel", "suspend"):
            return None
        return (
            f"{STOPPED_ON_ITS_OWN_MARK}: the streaming query of continuous job "
            f"{job!r} stopped without an error and without a suspend or cancel "
            "request (something in the driver stopped it); restarting it from its snapshot"
        )


def ends_by_itself(spark: Any, query: Any) -> bool:
    """Whether a query whose source runner is gone ends within a moment anyway: one that
    stops (finished, or stopping on a request) stops its runners first, and one whose
    failure Spark already met ends with its own error.

    While it waits, a batch in flight is let finish (at most ``BATCH_IN_FLIGHT_SECONDS``):
    its tasks do not need the runner, and stopping the query under them would destroy their
    Python workers (a task interrupted mid-stream never returns its worker to the pool), so
    the restarted query's first batch would fork new ones and import pandas and pyarrow again
    (1-1.5 s on a 2-core machine). The batch is finished when its trigger is, not when its
    Spark jobs are: after them the sink's commit runs on the driver, and a query stopped then
    aborts the batch (the restarted query reads and writes it again). That batch commits as
    any batch does; Spark's next call into the runner fails, or the driver stops the query
    first."""
    started = time.monotonic()
    said = False
    while True:
        try:
            if query.awaitTermination(0.05):
                return True
        except Exception:
            return True
        waited = time.monotonic() - started
        if waited >= BATCH_IN_FLIGHT_SECONDS:
            return False
        if waited >= ENDING_GRACE_SECONDS:
            if not running_jobs(spark) and not in_trigger(query):
                return False
            if not said:
                sys.stderr.write(f"epochal driver: {BATCH_IN_FLIGHT_NOTE}\n")
                said = True


def in_trigger(query: Any) -> bool:
    """Whether the query is inside a trigger: planning a batch, running its tasks, or
    committing it on the driver after them (Spark's ``isTriggerActive``)."""
    try:
        return bool(query.status.get("isTriggerActive"))
    except Exception:  # it ended meanwhile
        return False
