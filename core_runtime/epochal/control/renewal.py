"""A supervisor's renewal of its job's lease (:class:`LeaseRenewal`, which
:class:`~epochal.control.supervisor.Supervisor` is): a thread renews it every TTL/5 through
:class:`~epochal.state.lease.swaps.JobLease` while the active driver answers; a lease taken over
stops the supervisor's drivers; a lease that cannot be renewed for half its TTL stops them too
and ends the job FAILED with the reason."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epochal.base import processes
from epochal.config import JobConfig
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.layout import LEASE_RECORD
from epochal.state.locks import JobError
from epochal_sdk import SnapshotError
from epochal_sdk.errors import FencedError

if TYPE_CHECKING:
    from epochal.control.launcher import DriverProcess


class LeaseRenewal:
    """The lease side of a supervisor: what it renews with (its job, owner, epoch, config, the
    active and standby drivers) and what a renewal leaves (``lost``, ``unrenewable``)."""

    jobdir: JobDirectory
    owner: str
    epoch: int
    config: JobConfig
    active: DriverProcess | None
    standby: DriverProcess | None
    lost: threading.Event
    unrenewable: str | None
    report: Callable[[str], None]
    _renewed_at: float
    _stop_renewal: threading.Event
    _lease_lock: Any

    def _fence(self) -> Any:
        """The fence of the supervisor's epoch (the supervisor's own)."""
        raise NotImplementedError

    def _renew(self) -> None:
        """The renewal thread: renews every TTL/5 until the supervisor stops, the lease is
        lost, or renewing failed for good (:meth:`_renew_now`). It never ends silently."""
        while not self._stop_renewal.wait(self.config.lease_ttl / 5):
            try:
                self._renew_now()
            except Exception as exc:  # anything unforeseen: stop the drivers, say why
                self._give_up_renewal(f"renewing the lease failed: {type(exc).__name__}: {exc}")
            if self.lost.is_set() or self.unrenewable is not None:
                return

    def _renew_now(self) -> None:
        """Renew the lease, unless the active driver stopped answering (it is about to be
        killed: never vouch for a hung driver). A renewal that fails (the lock busy, the
        lease record corrupt, a write refused: a full disk, a read-only file system) is
        tried again at the next round; once the lease went unrenewed for half its TTL (when
        the driver's own watchdog stops it too), the supervisor gives up: it stops its
        drivers and the job ends FAILED with the reason (:meth:`_give_up_renewal`)."""
        with self._lease_lock:
            if self.unrenewable is not None:
                return
            active = self.active
            if active is not None and active.heartbeat_age() > self.config.lease_ttl / 2:
                return
            tokens = [d.token for d in (self.active, self.standby) if d is not None]
            try:
                held = self.jobdir.lease.renew(
                    self.owner, self.epoch, ttl=self.config.lease_ttl, tokens=tokens
                )
            except (JobError, SnapshotError, OSError) as exc:
                unrenewed = time.monotonic() - self._renewed_at
                if unrenewed > self.config.lease_ttl / 2:
                    self._give_up_renewal(
                        f"the lease could not be renewed for {unrenewed:.1f}s (limit "
                        f"{self.config.lease_ttl / 2:.1f}s, half its TTL): {exc}"
                    )
                return
            if held:
                self._renewed_at = time.monotonic()
            if not held and not self.lost.is_set():
                self.lost.set()
                self.report(
                    f"[{self.jobdir.name}] lease lost: another supervisor took the job over; "
                    "stopping this one's drivers"
                )
                for driver in (self.active, self.standby):
                    if driver is not None:
                        with contextlib.suppress(TimeoutError):
                            processes.kill_run(driver.token)

    def _give_up_renewal(self, why: str) -> None:
        """The lease can no longer be renewed: stop every driver of this supervisor now (a
        driver must never run on an unrenewed lease), and say why; the job then ends FAILED
        (:meth:`_failed_renewal`)."""
        with self._lease_lock:
            if self.unrenewable is not None:
                return
            self.unrenewable = why
            drivers = [d for d in (self.active, self.standby) if d is not None]
        self.report(
            f"[{self.jobdir.name}] {why}; stopping this supervisor's drivers (a driver never "
            "runs on an unrenewed lease)"
        )
        for driver in drivers:
            with contextlib.suppress(TimeoutError):
                processes.kill_run(driver.token)

    def _failed_renewal(self) -> JobRecord:
        """End the job FAILED because its lease could not be renewed: the record says why
        and what to do, if it can still be written (without the fence, which reads the lease);
        else the reason is reported and a record built from what is known is returned."""
        lease = f"{self.jobdir.path}/{LEASE_RECORD}"
        failure = (
            f"{self.unrenewable}. The drivers were stopped. Check the disk under "
            f"{self.jobdir.path} (space, permissions, {lease}); if {lease} is corrupt and no "
            "other supervisor or driver runs the job, delete it; then `python -m epochal jobs "
            f"resume {self.jobdir.name} --snapshot-dir {self.jobdir.snapshot_dir}` continues "
            "from the last snapshot"
        )
        try:
            try:
                fence = self._fence()
                fence.check("ending the job after its lease could not be renewed")
            except FencedError:
                return self._lost()  # another supervisor took the job over: its record now
            except (SnapshotError, OSError):
                pass  # the lease cannot be read: nobody can take the job over meanwhile
            with self.jobdir.update() as current:
                current.status = JobStatus.FAILED
                current.failure = failure
                current.requested = None
                final = current
        except Exception as exc:  # the disk refuses the record too: say so, do not hide it
            self.report(f"[{self.jobdir.name}] the job's record could not be written: {exc}")
            final = JobRecord(
                self.jobdir.name, "", self.config.to_dict(), JobStatus.FAILED, failure=failure
            )
        self.report(f"[{self.jobdir.name}] failed: {failure}")
        return final

    def _lost(self) -> JobRecord:
        self.lost.set()
        self.report(f"[{self.jobdir.name}] taken over by another supervisor; this one stops")
        return self.jobdir.load()
