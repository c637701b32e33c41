"""How much of its past a job keeps: the bound of every record that a job's directory gets per
batch, per run or per restart, in one place.

A job that runs for months must not carry its whole history: every per-batch record is
pruned to the newest batches it can still be needed for, every per-run record to the newest
runs, and every log rotates. The figures here are the bounds; :func:`bounds` lists them for
``jobs status`` and the reference (docs/reference/retention.md). Pruning runs every
:data:`PRUNE_EVERY` batches (and at a run's first batch, which also trims a directory written
by an older epochal that kept more), so a record kind holds at most its bound plus
:data:`PRUNE_EVERY` entries.

What a connector keeps in its own system (a marker table, a transaction log) is bounded by the
connector; the reference connectors' bounds are in their reference pages.
"""

from __future__ import annotations

from dataclasses import dataclass

PRUNE_EVERY = 10
"""Batches between two prunings of a per-batch record."""

MANIFEST_BATCHES = 100
"""Checkpoint manifests kept (the newest batches'): as many as Spark keeps of its own offset and
commit logs by default (``spark.sql.streaming.minBatchesToRetain``). A restart checks the last
two."""

DECISION_BATCHES = 100
"""Commit decisions (and their done markers) of a transactional sink kept after phase 2: a
replay of a decided batch older than this is impossible, since Spark keeps no offsets for it."""

KEY_DIGEST_BATCHES = 10
"""Key digests of an idempotent sink kept: only a replay of the newest batches compares them."""

RUNS = 30
"""Runs kept in the job record's history."""

DRIVER_LOGS = 10
"""Driver logs (and their rotated parts) kept per job on a machine: the newest drivers'."""

DRIVER_RECORDS = 10
"""Records of ended session drivers kept per job on a machine (a live driver's is never
removed)."""

LOG_BYTES = 8 * 1024 * 1024
"""Size at which a log file (a driver's, the protocol log) is rotated."""

LOG_BACKUPS = 2
"""Rotated parts kept of each log (``<log>.1`` is the newest)."""

METRIC_BATCHES = 20
"""Batches of per-part detail kept in the job's metrics state."""

TIMELINE_BATCHES = 100
"""Batches whose timeline is kept (metrics/timeline, written only while ``epochal.timeline`` is
on)."""

PENDING_METRICS = 5_000
"""Metric reports kept that the driver has not collected yet (each task and driver step leaves
one; a driver with a progress listener collects them after every batch)."""


def due(batch: int, first: bool = False) -> bool:
    """Whether a per-batch record is pruned after ``batch`` (every :data:`PRUNE_EVERY` batches,
    and at the first batch a process records)."""
    return first or batch % PRUNE_EVERY == 0


def oldest_kept(batch: int, kept: int) -> int:
    """The oldest batch still kept of a record that keeps ``kept`` batches, at ``batch``."""
    return batch - kept + 1


@dataclass(frozen=True)
class Bound:
    """One kind of record a job keeps, and how many of it."""

    record: str
    """What is kept (and where)."""
    kept: int
    """How many (see :attr:`unit`)."""
    unit: str
    """Of what: batches, runs, files, bytes."""


def bounds() -> list[Bound]:
    """Every bound of this module, for ``jobs status`` and the reference."""
    return [
        Bound("checkpoint manifests (store/checkpoint)", MANIFEST_BATCHES, "batches"),
        Bound("commit decisions and done markers (store/sinks/*)", DECISION_BATCHES, "batches"),
        Bound(
            "key digests of idempotent sinks (store/sinks/*/keys)", KEY_DIGEST_BATCHES, "batches"
        ),
        Bound("runs in the job record", RUNS, "runs"),
        Bound("driver logs per machine (logs/driver-*)", DRIVER_LOGS, "drivers"),
        Bound("ended session drivers' records per machine (sessions/)", DRIVER_RECORDS, "drivers"),
        Bound("size of a log file before it rotates", LOG_BYTES, "bytes"),
        Bound("rotated parts of each log", LOG_BACKUPS, "files"),
        Bound("per-part metric detail (metrics/state.json)", METRIC_BATCHES, "batches"),
        Bound("metric reports not yet collected (metrics/pending)", PENDING_METRICS, "reports"),
        Bound("batch timelines (metrics/timeline, when on)", TIMELINE_BATCHES, "batches"),
    ]
