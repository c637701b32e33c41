"""Job records, kept in the job's directory beside its snapshots.

Any process that can read the snapshot directory can find a job by name, see its status and
resume it. The job's lease, which makes sure only one supervisor runs a job and only one driver
acts for it, is :mod:`epochal.state.lease` (a directory's :attr:`JobDirectory.lease`).

The layout of a job directory is :class:`~epochal.state.layout.JobLayout`'s. On an object store
(``s3://``) the record is written as a read-modify-write that is retried when another writer
changed it meanwhile, instead of under a lock file.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from epochal.config import JobConfig, check_snapshot_dir
from epochal.state import retention
from epochal.state.layout import (
    DRIVERS,
    EPOCHS,
    FAULTS,
    JOB_RECORD,
    SESSIONS,
    JobLayout,
)
from epochal.state.lease.fence import Fence
from epochal.state.lease.swaps import JobLease
from epochal.state.locks import SWAP_ATTEMPTS, JobError, locked
from epochal.state.objectstore import SHARED_STATE
from epochal.state.store import (
    RecordChangedError,
    SnapshotStore,
    get_record,
    get_versioned_record,
    put_record,
    put_versioned_record,
)
from epochal_sdk import SnapshotError
from epochal_sdk.ids import new_incarnation

log = logging.getLogger("epochal.jobs")


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
    incarnation: str = ""
    """Which job of this name this is (``new_incarnation`` of
    :attr:`created`): in every transaction, writer and record id of its sinks, the same for
    all its runs. "" for a job recorded before incarnations (its ids have none)."""

    @classmethod
    def create(
        cls, name: str, target: str, config: dict[str, Any], previous: str = "", **fields: Any
    ) -> JobRecord:
        """The record of a job created anew: created now, with a new incarnation (one that
        differs from ``previous``, the incarnation of the job of this name it replaces)."""
        created = time.time()
        return cls(
            name=name,
            target=target,
            config=config,
            created=created,
            updated=created,
            incarnation=new_incarnation(created, previous),
            **fields,
        )

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
        data.setdefault("incarnation", "")  # recorded before incarnations: the ids have none
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def run_entry(self, run: int) -> dict[str, Any] | None:
        """The history entry of run ``run``."""
        return next((r for r in reversed(self.runs) if r.get("run") == run), None)

    def add_run(self, entry: dict[str, Any]) -> None:
        """Append a run to the history (keeping the last :data:`~epochal.state.retention.
        RUNS`)."""
        self.runs = [*self.runs, entry][-retention.RUNS :]


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
        self.lease = JobLease(self.layout, self.files)
        """The job's lease and its swaps (:class:`~epochal.state.lease.swaps.JobLease`)."""

    # -- where things are -------------------------------------------------------------------
    def state_dir(self, epoch: int | None = None) -> str:
        """The state directory of lease ``epoch`` (default: the live one); on an object
        store the job's one shared state prefix."""
        if epoch is None:
            lease = self.lease.read()
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
        with self.locked("record") as still_locked:
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

    # -- driver runs ------------------------------------------------------------------------
    @property
    def run_dir(self) -> str:
        """Where the job's own drivers keep their run records (read on the driver's machine
        only: on local disk when the snapshot directory is not)."""
        return self.layout.drivers

    @contextlib.contextmanager
    def locked(self, what: str) -> Iterator[Callable[[], None]]:
        """Hold the job's ``what`` lock (see :func:`epochal.state.locks.locked`)."""
        with locked(self.path, what, self.name, local=self.files.local) as still_locked:
            yield still_locked


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
