"""The job's lease as its holders swap it: taken at a new epoch (moving the job's state to it),
advanced for the holder's next driver, renewed, released; and the rules of a take-over (a live
holder is waited out, up to its TTL; one proven dead is taken over at once, and what is left of
its drivers on this host is ended). The record itself is :mod:`epochal.state.lease.record`.

On a local file system the lease is swapped under the job's lock file; on an object store
(``s3://``) or HDFS (``hdfs://``) with a compare-and-swap on its version (whoever swaps first
owns the job; the other re-reads and is refused, or waits). The state stays at
``<job>/state/{checkpoint,store}`` there (nothing is renamed; see
:mod:`epochal.state.lease.fence`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from epochal.base import files, processes
from epochal.state.layout import LEASE_RECORD, JobLayout
from epochal.state.lease.fence import read_lease
from epochal.state.lease.record import LEASE_TTL, SUPERVISOR, Lease
from epochal.state.locks import SWAP_ATTEMPTS, JobError, locked
from epochal.state.store import (
    RecordChangedError,
    SnapshotStore,
    get_versioned_record,
    put_record,
    put_versioned_record,
)
from epochal_sdk import SnapshotError


class JobLease:
    """The lease of one job (``<job>/lease.json``) and the swaps of its holders. One object per
    holder: it remembers the record it last wrote for itself (taken, advanced, renewed).

    Args:
        layout: the job directory's layout.
        files: the job directory's store (local, shared or an object store).
    """

    def __init__(self, layout: JobLayout, files: SnapshotStore) -> None:
        self.layout, self.files = layout, files
        self.snapshot_dir, self.name, self.path = layout.snapshot_dir, layout.name, layout.path
        self.local = files.local
        self._held: Lease | None = None
        """The lease record this holder last wrote for itself (taken, advanced, renewed)."""

    @contextlib.contextmanager
    def _locked(self, what: str) -> Iterator[Callable[[], None]]:
        with locked(self.path, what, self.name, local=self.files.local) as still_locked:
            yield still_locked

    def read(self) -> Lease | None:
        """The current lease (None when the job was never leased). A lease record that
        cannot be read is a ``SnapshotError`` that says what to do."""
        try:
            return read_lease(self.path)
        except SnapshotError as exc:
            raise SnapshotError(
                f"{exc}. If no supervisor or driver runs job {self.name!r} (check the hosts "
                f"that may), delete {self.path}/{LEASE_RECORD}: the next start of the job "
                "takes the lease afresh, at an epoch past the job's state"
            ) from None

    def epoch(self) -> int:
        """The current lease epoch (0 when never leased)."""
        lease = self.read()
        return lease.epoch if lease else 0

    def acquire(
        self,
        owner: str,
        *,
        ttl: float = LEASE_TTL,
        force: bool = False,
        holder: str = SUPERVISOR,
        pid: int | None = None,
    ) -> int:
        """Take the job's lease for ``owner`` at a new epoch and move the job's state to it.

        Refused (:class:`LeaseHeldError`) while another owner's lease is live (renewed less
        than its TTL ago), unless that owner is known to be dead (same host, its process
        gone) or ``force``. ``holder`` and ``pid`` say who holds it (a supervisor, this
        process; or a session driver's JVM). Returns the new epoch.
        """
        if self.files.conditional:
            return self._swap_lease(owner, ttl, force=force, holder=holder, pid=pid)
        if not self.files.local:
            raise JobError(
                f"job {self.name!r}: its snapshot directory {self.snapshot_dir!r} is on a file "
                "system where epochal cannot swap the job's lease atomically (it has no lock "
                "and no conditional write here), so two drivers could both hold the job. Put "
                "the snapshot directory on a local or shared POSIX path, on s3:// or on hdfs://"
            )
        with self._locked("lease") as still_locked:
            current = self.read()
            if current and current.owner != owner and not force:
                wait = current.takeover_wait()
                if wait > 0:
                    raise self._held_by_another(current, wait)
            return self._new_epoch(
                owner, current, ttl, holder=holder, pid=pid, taking=True, check=still_locked
            )

    def _held_by_another(self, current: Lease, wait: float) -> LeaseHeldError:
        return LeaseHeldError(
            f"job {self.name!r} is run by {current.describe()}. Wait for it to stop, or "
            f"suspend it; if that process is gone, the lease expires in {wait:.0f}s (or pass "
            "--force if you know it is dead).",
            wait,
            current,
        )

    def _swap_lease(
        self,
        owner: str,
        ttl: float,
        *,
        force: bool = False,
        holding: int | None = None,
        holder: str = SUPERVISOR,
        pid: int | None = None,
    ) -> int:
        """A new epoch on an object store, in one compare-and-swap of the lease: taking the
        job (``holding`` None) or the next epoch of the owner at ``holding``. Of two
        holders that read the same lease, one swaps it; the other reads it again and is
        refused (or, with ``force``, takes it from the winner)."""
        for _ in range(SWAP_ATTEMPTS):
            current, version = self._versioned_lease()
            if holding is not None:
                self._check_holder(current, owner, holding)
            elif current and current.owner != owner and not force:
                wait = current.takeover_wait()
                if wait > 0:
                    raise self._held_by_another(current, wait)
            if holding is None:
                self._end_dead_owner(current)
            epoch = (current.epoch if current else 0) + 1
            lease = Lease.new(owner, epoch, ttl, state=epoch, holder=holder, pid=pid)
            try:
                put_versioned_record(self.files, LEASE_RECORD, lease.to_record(), version)
                return epoch
            except RecordChangedError:
                time.sleep(random.uniform(0.01, 0.05))  # another writer was first: look again
        raise JobError(f"job {self.name!r}: the lease kept changing; not taken")

    def _versioned_lease(self) -> tuple[Lease | None, str | None]:
        data, version = get_versioned_record(self.files, LEASE_RECORD)
        return (Lease.from_record(data) if data else None), version

    def _check_holder(self, current: Lease | None, owner: str, epoch: int) -> None:
        if not self._holds(current, owner, epoch):
            raise LeaseLostError(
                f"job {self.name!r}: the lease is no longer this holder's "
                f"(epoch {current.epoch if current else '-'}, holder pid "
                f"{current.pid if current else '-'})"
            )

    def advance(self, owner: str, epoch: int, ttl: float = LEASE_TTL) -> int:
        """A new epoch for the next driver of the supervisor that holds the lease at
        ``epoch`` (a restart or a standby promotion): fences whatever the previous driver
        left running. Raises ``JobError`` if the lease was taken over meanwhile."""
        if self.files.conditional:
            return self._swap_lease(owner, ttl, holding=epoch)
        with self._locked("lease") as still_locked:
            current = self.read()
            self._check_holder(current, owner, epoch)
            mine = self._own_record(current, owner, epoch)
            return self._new_epoch(
                owner,
                current,
                ttl,
                holder=mine.holder,
                pid=mine.pid,
                taking=False,
                check=still_locked,
            )

    def _holds(self, current: Lease | None, owner: str, epoch: int) -> bool:
        """Whether ``owner`` still holds the job at ``epoch``: the lease record is its own, or,
        on a local file system, an older holder wrote its stale record back over it. That
        happens when a holder is paused (SIGSTOP, a frozen VM) between reading and writing
        the lease, past the lock's :data:`STALE_LOCK_SECONDS`: the lock is broken, the job
        taken over, and the resumed holder's write lands on the new one's record. Such a
        record has a lower epoch, and only the newest epoch's state directory exists (a
        take-over renames it), so it is recognised and the rightful holder writes its own
        record again at its next renewal."""
        if current is None:
            return False
        if self.local and not os.path.isdir(self.layout.epoch_dir(epoch)):
            return False  # taken over: the state moved to a later epoch
        if current.held_by(owner, epoch):
            return True
        return (
            self.local
            and self._held is not None
            and self._held.held_by(owner, epoch)
            and current.epoch < epoch
        )

    def _own_record(self, current: Lease | None, owner: str, epoch: int) -> Lease:
        """The holder's own record: the current one, or what it last wrote when a stale
        record was written over it (see :meth:`_holds`)."""
        if current is not None and current.held_by(owner, epoch):
            return current
        assert self._held is not None
        return self._held

    def _new_epoch(
        self,
        owner: str,
        current: Lease | None,
        ttl: float,
        *,
        holder: str,
        pid: int | None,
        taking: bool,
        check: Callable[[], None],
    ) -> int:
        old_epoch = current.epoch if current else 0
        old_state = current.state if current else old_epoch
        newest = max(self._state_epochs(), default=None)
        if newest is not None and newest > old_state:  # a stale record (see _holds)
            old_epoch, old_state = max(old_epoch, newest), newest
        epoch = old_epoch + 1
        if taking:
            self._end_dead_owner(current)
        # 1. the lease shows the new epoch: from here every fence check of older runs fails
        lease = Lease.new(owner, epoch, ttl, state=old_state, holder=holder, pid=pid)
        check()
        put_record(self.files, LEASE_RECORD, lease.to_record())
        # 2. the state moves to the new epoch: later writes through old paths land nowhere
        self._move_state(old_state, epoch)
        self._held = replace(lease, state=epoch)
        put_record(self.files, LEASE_RECORD, self._held.to_record())
        return epoch

    def _state_epochs(self) -> list[int]:
        """The epochs whose state directory exists (local file systems)."""
        if not self.local:
            return []
        try:
            names = os.listdir(self.layout.epochs)
        except FileNotFoundError:
            return []
        return [int(name) for name in names if name.isdigit()]

    def _move_state(self, old: int, new: int) -> None:
        if not self.files.local:
            return  # object stores cannot rename atomically: fenced by the checks alone
        epochs = self.layout.epochs
        files.makedirs(epochs)
        source, target = self.layout.epoch_dir(old), self.layout.epoch_dir(new)
        if os.path.isdir(source) and not os.path.exists(target):
            os.rename(source, target)
        else:
            files.makedirs(target)
        for name in os.listdir(epochs):  # left by zombies writing through moved paths
            if name != str(new):
                shutil.rmtree(os.path.join(epochs, name), ignore_errors=True)

    def takeover_wait(self, lease: Lease | None) -> float:
        """Seconds a new owner must still wait before taking this lease (0: now)."""
        return lease.takeover_wait() if lease else 0.0

    def _end_dead_owner(self, lease: Lease | None) -> None:
        """Before a new epoch on this host: end what is left of the old owner's drivers (an
        orphaned driver, PySpark daemons), so no process of a dead run outlives it."""
        if lease and lease.host == socket.gethostname():
            for token in lease.tokens:
                with contextlib.suppress(TimeoutError):
                    processes.kill_run(str(token))

    def renew(
        self, owner: str, epoch: int, *, ttl: float = LEASE_TTL, tokens: list[str] | None = None
    ) -> bool:
        """Renew our lease, naming the run tokens of our drivers (so a new owner on this host
        can end them if we die); False if it was taken over (we are fenced)."""
        if self.files.conditional:
            return self._swap_renewal(owner, epoch, ttl, tokens)
        with self._locked("lease") as still_locked:
            current = self.read()
            if not self._holds(current, owner, epoch):
                return False
            renewed = self._own_record(current, owner, epoch).renewed_now(ttl, tokens)
            still_locked()
            put_record(self.files, LEASE_RECORD, renewed.to_record())
            self._held = renewed
            return True

    def _swap_renewal(self, owner: str, epoch: int, ttl: float, tokens: list[str] | None) -> bool:
        """A renewal on an object store. A store that cannot be reached is a ``JobError``
        (not renewed this round; the next round tries again, and the driver stops itself
        if the lease goes unrenewed for half its TTL)."""
        try:
            for _ in range(SWAP_ATTEMPTS):
                current, version = self._versioned_lease()
                if not current or not current.held_by(owner, epoch):
                    return False
                renewed = current.renewed_now(ttl, tokens)
                try:
                    put_versioned_record(self.files, LEASE_RECORD, renewed.to_record(), version)
                    return True
                except RecordChangedError:
                    continue  # changed meanwhile: ours still (look again) or taken over
        except (OSError, SnapshotError) as exc:
            raise JobError(f"job {self.name!r}: the lease could not be renewed: {exc}") from exc
        except Exception as exc:  # the S3 client's own errors (botocore)
            if type(exc).__module__.split(".")[0] not in ("botocore", "boto3", "urllib3"):
                raise
            raise JobError(f"job {self.name!r}: the lease could not be renewed: {exc}") from exc
        raise JobError(f"job {self.name!r}: the lease kept changing; not renewed this time")

    def release(self, owner: str) -> None:
        """Give the lease up (keeping its epoch, so fencing tokens keep growing)."""
        if self.files.conditional:
            for _ in range(SWAP_ATTEMPTS):
                current, version = self._versioned_lease()
                if not current or current.owner != owner:
                    return
                released = current.released_now().to_record()
                try:
                    put_versioned_record(self.files, LEASE_RECORD, released, version)
                    return
                except RecordChangedError:
                    continue
            return
        with self._locked("lease") as still_locked:
            current = self.read()
            held = self._held
            if current and current.owner == owner:
                ended = current.released_now()
            elif held is not None and self._holds(current, owner, held.epoch):
                ended = held.released_now()
            else:
                return
            still_locked()
            put_record(self.files, LEASE_RECORD, ended.to_record())


class LeaseHeldError(JobError):
    """Another live holder has the job's lease."""

    def __init__(self, message: str, wait: float, lease: Lease | None = None) -> None:
        super().__init__(message)
        self.wait = wait
        self.lease = lease


class LeaseLostError(JobError):
    """This holder's lease was taken over by another one."""
