"""Fencing: a run acts only while the job's lease is still at the epoch the run started with.

The job's lease (``<job>/lease.json``) carries an epoch that grows every time a driver is
started for the job (by a supervisor restarting it, a standby promoted, another process
resuming it). Each driver run knows its own epoch. Two things keep a run that lost the lease
(a *zombie*: a paused process resumed, an orphan whose supervisor died) from acting:

1. **The state moves.** A run keeps its state (Spark's checkpoint, the snapshot store) in
   ``<job>/epochs/<epoch>``. Taking the job over moves that directory to the new epoch's name
   (one atomic rename) *after* the lease shows the new epoch. Whatever the zombie writes
   after the move goes to a path nobody reads, and the snapshot store refuses to write there
   at all (:class:`~epochal.state.store.StateMovedError`).
2. **The protocol checks.** Every commit decision, acknowledgement and recovery step checks
   the fence (:meth:`Fence.check`) before it acts on the outside world, and a decision is
   checked again after it is recorded: a decision that was recorded before the move is in
   the new owner's state and is completed by it; one recorded after the move failed; either
   way the zombie stops before phase 2.

Together: the new owner sees every record the zombie made before the move, and the zombie
acts on nothing after it.

On an object store (``s3://``) nothing can be renamed atomically, so the state does not move:
every epoch's directory is a name for one shared prefix, ``<job>/state``
(:func:`state_location`). There the fence is the lease itself, swapped with conditional
writes (one compare-and-swap per take-over: of two supervisors, exactly one wins), and every
write of a run's snapshot store checks first that the lease still shows the run's epoch;
records that must never be overwritten (commit decisions) are created with
``If-None-Match``, so of a zombie and the new owner only the first writer's stands, and the
protocol's checks (2.) stop the zombie before it acts on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from epochal.state import objectstore
from epochal.state.checkpoint import Checkpoint
from epochal.state.layout import EPOCHS, LEASE_RECORD
from epochal.state.lease.record import Lease
from epochal.state.store import SnapshotStore, get_record
from epochal_sdk.errors import FencedError


def read_lease(job_path: str) -> Lease | None:
    """The job's lease, or None when the job was never leased."""
    record = get_record(SnapshotStore(job_path), LEASE_RECORD)
    return Lease.from_record(record) if record else None


def state_dir(job_path: str, epoch: int) -> str:
    """Where the state (checkpoint and store) of the run at lease ``epoch`` lives (its name:
    on an object store, see :func:`state_location`)."""
    return f"{job_path}/{EPOCHS}/{epoch}"


def state_location(directory: str) -> str:
    """Where the state of an epoch's directory really is: the directory itself on a local
    file system, the job's shared ``<job>/state`` prefix on an object store."""
    return objectstore.shared_state_dir(directory)


def checkpoint_location(directory: str) -> str:
    """The ``checkpointLocation`` Spark gets for the state directory ``directory`` of a run:
    ``<directory>/checkpoint`` locally, ``s3a://<bucket>/<job>/state/checkpoint`` on S3."""
    return Checkpoint(f"{directory}/checkpoint").spark_location


@dataclass(frozen=True)
class Fence:
    """The fencing check of one run: the job at ``job_path``, leased at ``epoch``.

    An epoch of 0 means the run holds no lease (a query at less than exactly-once with no
    snapshot directory): nothing to check.
    """

    job_path: str | None
    epoch: int

    @property
    def active(self) -> bool:
        """Whether this run is fenced by a lease at all."""
        return bool(self.job_path) and self.epoch > 0

    def holds(self, lease_epoch: int | None) -> bool:
        """Whether this run still holds the job, the lease being at ``lease_epoch``. On an
        object store: the lease is at this run's epoch. On a local file system the run's
        state directory must still exist (a take-over renames it), and the lease must not be
        at a later epoch; a lower one is a stale record that a holder paused mid-write put
        back (see :meth:`~epochal.state.lease.swaps.JobLease.renew`), not a take-over."""
        assert self.job_path is not None
        if "://" in self.job_path:
            return lease_epoch == self.epoch
        return (
            lease_epoch is not None
            and lease_epoch <= self.epoch
            and os.path.isdir(state_dir(self.job_path, self.epoch))
        )

    def check(self, doing: str) -> None:
        """Raise :class:`FencedError` unless the job's lease is still at this run's epoch."""
        if not self.active:
            return
        assert self.job_path is not None
        try:
            lease = read_lease(self.job_path)
        except FileNotFoundError:
            lease = None
        now = lease.epoch if lease else None
        if not self.holds(now):
            raise FencedError(
                f"{doing}: this run holds lease epoch {self.epoch} but the job's lease is at "
                f"epoch {now} (holder pid {lease.pid if lease else '?'}): another driver "
                "owns the job now, so this run stops without acting"
            )
