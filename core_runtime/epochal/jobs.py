"""Job records and the job lease, kept in the job's directory beside its snapshots.

Any process that can read the snapshot directory can find a job by name, see its status and
resume it. The lease makes sure only one supervisor runs a job: it is taken with a growing
epoch (the fencing token), renewed while the job runs, and checked before every commit
decision, so a zombie driver that lost the lease cannot decide anything.
"""

from __future__ import annotations

import contextlib
import enum
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.fs as pafs

from epochal.config import JobConfig
from epochal.context import job_dir
from epochal.store import SnapshotStore, get_record, put_record
from epochal_sdk import EpochalError, SnapshotError

JOB_RECORD = "job.json"
LEASE_RECORD = "lease.json"
LEASE_TTL = 20.0
PROGRESS_PREFIX = "epochal-progress "
"""Lines a driver prints to report a batch; the supervisor reads them."""


class JobStatus(enum.StrEnum):
    """Where a job is in its life."""

    SUBMITTED = "SUBMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        """No supervisor will run this job again on its own."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


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
        return cls(**data)


class JobDirectory:
    """One job's directory: record, lease, Spark checkpoint, snapshot store, logs."""

    def __init__(self, snapshot_dir: str, name: str) -> None:
        _check_name(name)
        self.snapshot_dir, self.name = snapshot_dir, name
        self.path = job_dir(snapshot_dir, name)
        self.files = SnapshotStore(self.path)

    @property
    def checkpoint(self) -> str:
        """Spark's checkpoint location (offset log, commit log, state)."""
        return f"{self.path}/checkpoint"

    @property
    def store(self) -> SnapshotStore:
        """The connectors' part of the snapshots."""
        return SnapshotStore(f"{self.path}/store")

    @property
    def logs(self) -> str:
        """Where driver logs go."""
        return f"{self.path}/logs"

    def exists(self) -> bool:
        return get_record(self.files, JOB_RECORD) is not None

    def load(self) -> JobRecord:
        """The job record; a clear error if there is no such job."""
        data = get_record(self.files, JOB_RECORD)
        if data is None:
            raise JobError(
                f"no job named {self.name!r} in {self.snapshot_dir}. "
                "See `epochal jobs list --snapshot-dir ...` for the jobs there."
            )
        return JobRecord.from_json(data)

    def save(self, record: JobRecord) -> None:
        record.updated = time.time()
        put_record(self.files, JOB_RECORD, record.to_json())

    @contextlib.contextmanager
    def update(self) -> Iterator[JobRecord]:
        """Read-modify-write the record under the job's lock."""
        with self._locked("record"):
            record = self.load()
            yield record
            self.save(record)

    def delete_snapshots(self) -> None:
        """Delete the checkpoint and the snapshot store (cancel)."""
        for sub in ("checkpoint", "store", "faults"):
            SnapshotStore(self.path).delete_tree(sub)

    # -- lease ------------------------------------------------------------------------------
    def lease(self) -> dict[str, Any] | None:
        """The current lease record."""
        return get_record(self.files, LEASE_RECORD)

    def lease_epoch(self) -> int:
        """The current lease epoch (0 when never leased)."""
        return int((self.lease() or {}).get("epoch", 0))

    def acquire_lease(self, owner: str, *, force: bool = False) -> int:
        """Take the job's lease with a new epoch; refuse if another live owner holds it."""
        with self._locked("lease"):
            current = self.lease()
            if current and current["owner"] != owner and not force:
                age = time.time() - float(current["renewed"])
                if age < LEASE_TTL:
                    raise JobError(
                        f"job {self.name!r} is run by another supervisor (pid {current['pid']} "
                        f"on {current['host']}, lease epoch {current['epoch']}, renewed "
                        f"{age:.0f}s ago). Wait for it to stop or suspend it; if that process "
                        "is gone, retry after the lease expires or pass --force."
                    )
            epoch = int((current or {}).get("epoch", 0)) + 1
            put_record(self.files, LEASE_RECORD, _lease(owner, epoch))
            return epoch

    def renew_lease(self, owner: str, epoch: int) -> bool:
        """Renew our lease; False if it was taken over (we are fenced)."""
        with self._locked("lease"):
            current = self.lease()
            if not current or current["owner"] != owner or int(current["epoch"]) != epoch:
                return False
            put_record(self.files, LEASE_RECORD, _lease(owner, epoch))
            return True

    def release_lease(self, owner: str) -> None:
        """Give the lease up (keeping its epoch, so fencing tokens keep growing)."""
        with self._locked("lease"):
            current = self.lease()
            if current and current["owner"] == owner:
                current["renewed"] = 0.0
                put_record(self.files, LEASE_RECORD, current)

    @contextlib.contextmanager
    def _locked(self, what: str) -> Iterator[None]:
        if not self.files.local:
            yield
            return
        os.makedirs(self.path, exist_ok=True)
        path = os.path.join(self.path, f".{what}.lock")
        deadline = time.monotonic() + 30
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                try:
                    if time.time() - os.path.getmtime(path) > 30:
                        os.unlink(path)  # left by a killed process
                        continue
                except FileNotFoundError:
                    continue
                if time.monotonic() > deadline:
                    raise JobError(f"job {self.name!r}: {path} stays locked") from None
                time.sleep(0.01)
        try:
            yield
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _lease(owner: str, epoch: int) -> dict[str, Any]:
    return {
        "owner": owner,
        "epoch": epoch,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "renewed": time.time(),
    }


def new_owner() -> str:
    """A fresh lease owner id for a supervisor."""
    return uuid.uuid4().hex


def list_jobs(snapshot_dir: str) -> list[JobRecord]:
    """Every job found under ``snapshot_dir``."""
    store = SnapshotStore(snapshot_dir)
    selector = pafs.FileSelector(store.base, allow_not_found=True)
    records = []
    for info in store.fs.get_file_info(selector):
        if info.type == pafs.FileType.Directory:
            name = info.path.rsplit("/", 1)[-1]
            try:
                records.append(JobDirectory(snapshot_dir, name).load())
            except (JobError, ValueError, SnapshotError):
                continue
    return sorted(records, key=lambda r: r.created)


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise JobError(
            f"job name {name!r} is not allowed: use letters, digits, '-' and '_' "
            "(it names a directory and prefixes transaction ids)"
        )
