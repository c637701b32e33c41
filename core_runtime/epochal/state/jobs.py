"""Job records and the job lease, kept in the job's directory beside its snapshots.

Any process that can read the snapshot directory can find a job by name, see its status and
resume it. The lease makes sure only one supervisor runs a job, and only one driver acts for
it: every driver run takes a new lease epoch (the fencing token), the supervisor renews the
lease while its driver is healthy, and taking the job over moves the job's state to the new
epoch (see :mod:`epochal.state.fence`).

The layout of a job directory is :class:`~epochal.state.layout.JobLayout`'s.

On an object store (``s3://``) the job record and the lease are swapped with conditional
writes instead of being written under a lock file: the lease with a compare-and-swap on its
version (whoever swaps first owns the job; the other re-reads and is refused, or waits), the
record as a read-modify-write that is retried when another writer changed it meanwhile. The
state stays at ``<job>/state/{checkpoint,store}`` (nothing is renamed; see
:mod:`epochal.state.fence`).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from epochal.config import JobConfig, check_snapshot_dir
from epochal.control import processes
from epochal.state import files
from epochal.state.fence import Fence, read_lease
from epochal.state.layout import (
    DRIVERS,
    EPOCHS,
    FAULTS,
    JOB_RECORD,
    LEASE_RECORD,
    SESSIONS,
    JobLayout,
)
from epochal.state.lease import LEASE_TTL, SUPERVISOR, Lease
from epochal.state.objectstore import SHARED_STATE
from epochal.state.store import (
    RecordChangedError,
    SnapshotStore,
    get_record,
    get_versioned_record,
    put_record,
    put_versioned_record,
)
from epochal_sdk import EpochalError, SnapshotError

log = logging.getLogger("epochal.jobs")

KEEP_RUNS = 30
"""How many runs the job record keeps in its history."""
SWAP_ATTEMPTS = 50
"""How often a compare-and-swap of the lease or the job record is tried before giving up."""
STALE_LOCK_SECONDS = 30.0
"""A lock file this old was left by a killed process (or a holder paused this long) and is
broken."""


class JobStatus(enum.StrEnum):
    """Where a job is in its life (its phase)."""

    SUBMITTED = "SUBMITTED"
    STARTING = "STARTING"
    """A driver is starting (JVM, SparkSession, connectors)."""
    RECOVERING = "RECOVERING"
    """The query is built and recovering (2PC recovery, replay of the last batch)."""
    RUNNING = "RUNNING"
    """The query runs and recovery is done (a batch of this run was committed)."""
    RESTARTING = "RESTARTING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        """No supervisor will run this job again on its own."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)

    @property
    def live(self) -> bool:
        """A supervisor should be running this job."""
        return self in (
            JobStatus.STARTING,
            JobStatus.RECOVERING,
            JobStatus.RUNNING,
            JobStatus.RESTARTING,
        )


class JobError(EpochalError):
    """A job cannot be found, taken or run as asked."""


@dataclass
class JobRecord:
    """What is known about a job; stored as ``<snapshot_dir>/<name>/job.json``."""

    name: str
    target: str
    config: dict[str, Any]
    status: JobStatus = JobStatus.SUBMITTED
    run: int = 0
    """Query starts so far (cold, in-place and standby): transaction ids carry it."""
    restarts: int = 0
    restarts_in_a_row: int = 0
    requested: str | None = None
    failure: str | None = None
    original_executors: int | None = None
    effective_guarantee: str | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    python_path: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    supervisor: dict[str, Any] = field(default_factory=dict)
    """The supervisor running the job: pid, host."""
    driver: dict[str, Any] = field(default_factory=dict)
    """The active driver: pid, lease epoch, run token."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """The last runs: run, epoch, kind (cold / in-place / standby), start, time to the
    first committed batch, how it ended."""

    @property
    def job_config(self) -> JobConfig:
        """The config as an object."""
        return JobConfig.from_dict(self.config)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        data = dict(data)
        data["status"] = JobStatus(data["status"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def run_entry(self, run: int) -> dict[str, Any] | None:
        """The history entry of run ``run``."""
        return next((r for r in reversed(self.runs) if r.get("run") == run), None)

    def add_run(self, entry: dict[str, Any]) -> None:
        """Append a run to the history (keeping the last :data:`KEEP_RUNS`)."""
        self.runs = [*self.runs, entry][-KEEP_RUNS:]


class JobDirectory:
    """One job's directory: record, lease, state of the live epoch, logs."""

    def __init__(self, snapshot_dir: str, name: str) -> None:
        check_snapshot_dir(snapshot_dir)
        try:
            self.layout = JobLayout(snapshot_dir, name)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        self.snapshot_dir, self.name = snapshot_dir, name
        self.path = self.layout.path
        self.files = SnapshotStore(self.path)
        self._held: Lease | None = None
        """The lease record this process last wrote for itself (taken, advanced, renewed)."""

    # -- where things are -------------------------------------------------------------------
    def state_dir(self, epoch: int | None = None) -> str:
        """The state directory of lease ``epoch`` (default: the live one); on an object
        store the job's one shared state prefix."""
        if epoch is None:
            lease = self.lease()
            epoch = lease.state if lease else 0
        return self.layout.state_dir(epoch)

    @property
    def checkpoint(self) -> str:
        """Spark's checkpoint location of the live epoch (offset log, commit log, state)."""
        return f"{self.state_dir()}/checkpoint"

    @property
    def store(self) -> SnapshotStore:
        """The connectors' part of the snapshots, in the live epoch."""
        return SnapshotStore(f"{self.state_dir()}/store")

    @property
    def local(self) -> bool:
        """Whether the job's directory is on a local (POSIX) file system."""
        return self.files.local

    @property
    def logs(self) -> str:
        """Where driver logs go (on this machine's disk)."""
        return self.layout.logs

    def fence(self, epoch: int) -> Fence:
        """The fencing check of a run at ``epoch``."""
        return Fence(self.path, epoch)

    # -- the record -------------------------------------------------------------------------
    def exists(self) -> bool:
        return get_record(self.files, JOB_RECORD) is not None

    def load(self) -> JobRecord:
        """The job record; a clear error if there is no such job."""
        data = get_record(self.files, JOB_RECORD)
        if data is None:
            raise JobError(
                f"no job named {self.name!r} in {self.snapshot_dir}. "
                "See `python -m epochal jobs list --snapshot-dir ...` for the jobs there."
            )
        return JobRecord.from_json(data)

    def save(self, record: JobRecord) -> None:
        record.updated = time.time()
        put_record(self.files, JOB_RECORD, record.to_json())

    @contextlib.contextmanager
    def update(self, fence: Fence | None = None) -> Iterator[JobRecord]:
        """Read-modify-write the record under the job's lock; with ``fence``, only while
        that run still holds the lease (a zombie's update raises ``FencedError``).

        On an object store there is no lock: the record is written with a compare-and-swap,
        and when another writer changed it meanwhile, the fields this update changed are
        applied again to the record as it is now (and the fence checked again)."""
        if self.files.conditional:
            yield from self._swap_record(fence)
            return
        with self._locked("record") as still_locked:
            if fence is not None:
                fence.check(f"job {self.name!r}: updating the job record")
            record = self.load()
            yield record
            still_locked()
            self.save(record)

    def _swap_record(self, fence: Fence | None) -> Iterator[JobRecord]:
        doing = f"job {self.name!r}: updating the job record"
        if fence is not None:
            fence.check(doing)
        data, version = get_versioned_record(self.files, JOB_RECORD)
        if data is None:
            self.load()  # the clear "no such job" error
        assert data is not None  # load() raised
        record = JobRecord.from_json(data)
        before = record.to_json()
        yield record
        changes = {k: v for k, v in record.to_json().items() if before.get(k) != v}
        for _ in range(SWAP_ATTEMPTS):
            value = {**JobRecord.from_json(data).to_json(), **changes, "updated": time.time()}
            try:
                put_versioned_record(self.files, JOB_RECORD, value, version)
                record.updated = value["updated"]
                return
            except RecordChangedError:
                time.sleep(random.uniform(0.01, 0.05))
            if fence is not None:
                fence.check(doing)
            data, version = get_versioned_record(self.files, JOB_RECORD)
            if data is None:
                raise JobError(f"job {self.name!r}: its record was deleted while updating it")
        raise JobError(f"job {self.name!r}: the record kept changing; update not written")

    def delete_snapshots(self) -> None:
        """Delete the checkpoint and the snapshot store (cancel)."""
        for sub in (EPOCHS, FAULTS, DRIVERS, SESSIONS):
            SnapshotStore(self.path).delete_tree(sub)
        if not self.local:
            SnapshotStore(self.path).delete_tree(SHARED_STATE)

    # -- lease ------------------------------------------------------------------------------
    def lease(self) -> Lease | None:
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

    def lease_epoch(self) -> int:
        """The current lease epoch (0 when never leased)."""
        lease = self.lease()
        return lease.epoch if lease else 0

    def acquire_lease(
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
                "the snapshot directory on a local or shared POSIX path, or on s3://"
            )
        with self._locked("lease") as still_locked:
            current = self.lease()
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

    def advance_epoch(self, owner: str, epoch: int, ttl: float = LEASE_TTL) -> int:
        """A new epoch for the next driver of the supervisor that holds the lease at
        ``epoch`` (a restart or a standby promotion): fences whatever the previous driver
        left running. Raises ``JobError`` if the lease was taken over meanwhile."""
        if self.files.conditional:
            return self._swap_lease(owner, ttl, holding=epoch)
        with self._locked("lease") as still_locked:
            current = self.lease()
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

    def renew_lease(
        self, owner: str, epoch: int, *, ttl: float = LEASE_TTL, tokens: list[str] | None = None
    ) -> bool:
        """Renew our lease, naming the run tokens of our drivers (so a new owner on this host
        can end them if we die); False if it was taken over (we are fenced)."""
        if self.files.conditional:
            return self._swap_renewal(owner, epoch, ttl, tokens)
        with self._locked("lease") as still_locked:
            current = self.lease()
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

    def release_lease(self, owner: str) -> None:
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
            current = self.lease()
            held = self._held
            if current and current.owner == owner:
                ended = current.released_now()
            elif held is not None and self._holds(current, owner, held.epoch):
                ended = held.released_now()
            else:
                return
            still_locked()
            put_record(self.files, LEASE_RECORD, ended.to_record())

    # -- driver runs ------------------------------------------------------------------------
    @property
    def run_dir(self) -> str:
        """Where the job's own drivers keep their run records (read on the driver's machine
        only: on local disk when the snapshot directory is not)."""
        return self.layout.drivers

    @contextlib.contextmanager
    def _locked(self, what: str) -> Iterator[Callable[[], None]]:
        """Hold the job's ``what`` lock (a file created exclusively, holding a token of this
        holder); yields a check that raises ``JobError`` when the lock is no longer ours.

        A lock older than :data:`STALE_LOCK_SECONDS` is taken for one a killed process left
        and broken, so a holder paused that long loses it: it checks right before it writes,
        and never removes a lock that is not its own."""
        if not self.files.local:
            yield lambda: None
            return
        files.makedirs(self.path)
        path = os.path.join(self.path, f".{what}.lock")
        token = f"{os.getpid()}-{uuid.uuid4().hex}".encode()
        deadline = time.monotonic() + STALE_LOCK_SECONDS
        while True:
            try:
                fd = files.create(path, exclusive=True)
                os.write(fd, token)
                break
            except FileExistsError:
                try:
                    if time.time() - os.path.getmtime(path) > STALE_LOCK_SECONDS:
                        os.unlink(path)  # left by a killed (or long paused) process
                        continue
                except FileNotFoundError:
                    continue
                if time.monotonic() > deadline:
                    raise JobError(f"job {self.name!r}: {path} stays locked") from None
                time.sleep(0.01)

        def ours() -> bool:
            try:
                with open(path, "rb") as fh:
                    return fh.read() == token
            except FileNotFoundError:
                return False

        def still_locked() -> None:
            if not ours():
                raise JobError(
                    f"job {self.name!r}: the {what} lock was taken from this process (it was "
                    f"held for more than {STALE_LOCK_SECONDS:.0f}s: paused?); nothing written"
                )

        try:
            yield still_locked
        finally:
            os.close(fd)
            if ours():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


class LeaseHeldError(JobError):
    """Another live holder has the job's lease."""

    def __init__(self, message: str, wait: float, lease: Lease | None = None) -> None:
        super().__init__(message)
        self.wait = wait
        self.lease = lease


class LeaseLostError(JobError):
    """This holder's lease was taken over by another one."""


@dataclass(frozen=True)
class UnreadableJob:
    """A job directory whose record cannot be read: what is wrong and what to do.

    Attributes:
        name: the directory's name (the job's).
        path: the record that cannot be read.
        problem: why (a torn or corrupt file, a permission, ...).
        fix: what the operator can do.
    """

    name: str
    path: str
    problem: str
    fix: str


def scan_jobs(snapshot_dir: str) -> list[JobRecord | UnreadableJob]:
    """Every job under ``snapshot_dir``: its record, or, when the record cannot be read
    (torn, corrupt, unreadable), an :class:`UnreadableJob` saying so: no job is left out
    without a word. Directories without a record (not jobs) are left out. Records come
    first, oldest first."""
    check_snapshot_dir(snapshot_dir)
    store = SnapshotStore(snapshot_dir)
    records: list[JobRecord] = []
    unreadable: list[JobRecord | UnreadableJob] = []
    for name in store.list_dirs():
        try:
            jobdir = JobDirectory(snapshot_dir, name)
        except JobError:
            continue  # not a job's name: not a job's directory
        path = f"{jobdir.path}/{JOB_RECORD}"
        try:
            if not jobdir.exists():
                continue
            records.append(jobdir.load())
        except (SnapshotError, OSError, ValueError, KeyError, TypeError) as exc:
            unreadable.append(
                UnreadableJob(
                    name,
                    path,
                    str(exc),
                    f"Restore {path} from a backup (the job's snapshots under {jobdir.path} "
                    "are untouched), or, to drop the job, stop whatever runs it and delete "
                    f"{jobdir.path}",
                )
            )
    return [*sorted(records, key=lambda r: r.created), *unreadable]


def list_jobs(snapshot_dir: str) -> list[JobRecord]:
    """Every job under ``snapshot_dir`` whose record can be read (oldest first); each one
    whose record cannot be read is logged as a warning with the path and what to do
    (:func:`scan_jobs` returns them too)."""
    found = scan_jobs(snapshot_dir)
    for job in found:
        if isinstance(job, UnreadableJob):
            log.warning("job %r is unreadable: %s. %s", job.name, job.problem, job.fix)
    return [job for job in found if isinstance(job, JobRecord)]
