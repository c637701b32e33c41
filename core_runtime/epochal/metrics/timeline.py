"""A batch's timeline: when each step of a sink's batch happened, in the processes that did
it, for taking the fixed cost of a batch apart.

With the query's option ``epochal.timeline`` set to ``true`` (or ``EPOCHAL_TIMELINE=1`` in
the driver's environment, which ``epochal run`` drivers and their Python workers inherit),
each task of an epochal sink notes the wall-clock time of its steps (:data:`TASK_MARKS`) and
which Python worker ran it, the task's commit message carries them to the driver, and the
driver's commit step adds its own (:data:`DRIVER_MARKS`) and writes one file per batch and
part: ``<job>/metrics/timeline/<batch>-<part>.json`` (:func:`write`). The newest
:data:`~epochal.state.retention.TIMELINE_BATCHES` batches are kept.

Spark's side of the same batch (its trigger's phases, the write job's submission and
completion, each task's launch, deserialization and result time) is in Spark's progress
reports and its status API; ``python -m integration.bench.batch_timeline`` joins the two and
prints where each millisecond of ``addBatch`` goes (docs/evidence/performance/timeline.md).

Times are ``time.time()`` seconds of the machine that took them: on one machine (``local[N]``)
they line up; across machines they are as good as the clocks. Nothing here ever fails a batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from epochal.base import files
from epochal.config import TIMELINE_ENV, TIMELINE_OPTION, timeline_enabled
from epochal.metrics.recording import metrics_dir
from epochal.state import retention

log = logging.getLogger("epochal.metrics")

OPTION = TIMELINE_OPTION
"""The query's option that turns the timeline on (``true``)."""
ENV = TIMELINE_ENV
"""The environment variable that turns it on for every query of a driver (``1``)."""
DIRECTORY = "timeline"
"""The metrics subdirectory that holds one file per batch and part."""

TASK_MARKS = ("entered", "began", "first_rows", "rows_done", "prepared", "returned")
"""A sink task's steps, in order: ``write()`` called in the Python worker (the writer
unpickled, the worker started or reused), the connector's transaction begun (or its writer
opened), its first rows in hand (the upstream read and the Arrow hand-off), its last rows
written, its transaction prepared (or its upserts flushed), and its commit message returned.
A task also notes ``in_write``: the seconds spent inside the connector's ``write`` calls
(the rest of first rows → last rows written is waiting for rows from upstream)."""
DRIVER_MARKS = ("entered", "decided", "completed", "reported")
"""The driver's commit step of a batch, in order: ``commit()`` called in Spark's commit
worker, the decision durable (exactly-once transactional sinks), phase 2 done, the batch's
metrics reported."""

PROCESS_STARTED = time.time()
"""When this process imported epochal's metrics: for a Python worker, close to its start (a
fresh worker imports it for its first task)."""
_tasks_here = 0


enabled = timeline_enabled
"""Whether the timeline is on for a query with these options (or, by :data:`ENV`, for every
query of the process)."""


class Marks:
    """The marks of one step of a batch in one process, with that process's identity: its
    pid, when it started (:data:`PROCESS_STARTED`) and, for a task, how many sink tasks the
    process has run (1: a fresh Python worker; more: a reused one)."""

    def __init__(self, *, task: bool) -> None:
        global _tasks_here
        if task:
            _tasks_here += 1
        self.values: dict[str, float] = {
            "pid": float(os.getpid()),
            "process_started": PROCESS_STARTED,
            "process_tasks": float(_tasks_here),
        }

    @contextlib.contextmanager
    def spent(self, name: str) -> Iterator[None]:
        """Add the block's duration (seconds) to ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.values[name] = self.values.get(name, 0.0) + time.perf_counter() - started

    def mark(self, step: str) -> None:
        """Note that ``step`` happened now (the first time only: a step marks its start)."""
        self.values.setdefault(step, time.time())

    def as_dict(self) -> dict[str, float]:
        """The marks and the process's identity, as a commit message carries them."""
        return dict(self.values)


def write(
    job_dir: str | None,
    part_id: str,
    batch: int,
    driver: Marks,
    tasks: Sequence[Mapping[str, float] | None],
    **facts: Any,
) -> str | None:
    """Keep one batch's timeline of one part (the driver's marks, every task's, and
    ``facts`` such as the sink's contract); prune the oldest now and then. Returns the file
    written, or None (no job directory, or it could not be written: logged, never raised)."""
    directory = metrics_dir(job_dir)
    if directory is None:
        return None
    where = f"{directory}/{DIRECTORY}"
    entry = {
        "batch": batch,
        "part": part_id,
        **facts,
        "driver": driver.as_dict(),
        "tasks": [dict(t) for t in tasks if t],
    }
    try:
        files.makedirs(where)
        name = f"{where}/{batch:012d}-{part_id}.json"
        with files.open_private(f"{name}.tmp") as fh:
            json.dump(entry, fh)
        os.replace(f"{name}.tmp", name)
        if retention.due(batch):
            prune(where, retention.oldest_kept(batch, retention.TIMELINE_BATCHES))
        return name
    except OSError as exc:
        log.debug("timeline of batch %s of %s not written: %s", batch, part_id, exc)
        return None


def prune(where: str, oldest: int) -> int:
    """Remove the timelines of batches before ``oldest``; returns how many."""
    removed = 0
    for name in os.listdir(where):
        number = name.split("-", 1)[0]
        if number.isdigit() and int(number) < oldest:
            try:
                os.remove(f"{where}/{name}")
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def read(job_dir: str) -> list[dict[str, Any]]:
    """Every timeline kept of a job, oldest batch first."""
    directory = metrics_dir(job_dir)
    where = f"{directory}/{DIRECTORY}"
    if directory is None or not os.path.isdir(where):
        return []
    out = []
    for name in sorted(os.listdir(where)):
        if name.endswith(".json"):
            with open(f"{where}/{name}") as fh:
                out.append(json.load(fh))
    return out
